"""torchaudio's ``ctc_decoder`` (the oracle of the torchaudio drop-in's tests and benchmark), loaded without
torchaudio's compiled extension: ``torchaudio/models/decoder/_ctc_decoder.py`` is Python over flashlight-text, so
it is loaded from the installed torchaudio wheel under a stub ``torchaudio`` package that provides only what that
file imports (``torchaudio.utils._download_asset``, here refusing: nothing is downloaded).

``load()`` returns the module, or None where torch, flashlight-text or the torchaudio wheel is missing. The
environment: ``pip install torch numpy kenlm pytest`` then ``pip install --no-deps torchaudio==2.11.0
flashlight-text==0.0.7`` (``make peer-torchaudio`` builds it).
"""

from __future__ import annotations

import importlib.util
import sys
import types
from importlib import metadata
from pathlib import Path
from types import ModuleType

_LOADED: dict[str, ModuleType | None] = {}


def _refuse_download(*args: object, **kwargs: object) -> str:
    raise RuntimeError("the torchaudio oracle downloads nothing")


def load() -> ModuleType | None:
    """torchaudio's ``_ctc_decoder`` module (loaded once), or None where it cannot be loaded here."""
    if "module" in _LOADED:
        return _LOADED["module"]
    module = None
    try:
        import flashlight.lib.text.decoder  # noqa: F401
        import torch  # noqa: F401

        dist = metadata.distribution("torchaudio")
        source = Path(str(dist.locate_file("torchaudio/models/decoder/_ctc_decoder.py")))
        if source.is_file():
            saved = {name: sys.modules.get(name) for name in ("torchaudio", "torchaudio.utils")}
            stub = types.ModuleType("torchaudio")
            stub.__path__ = []  # a package with no submodules of its own
            utils = types.ModuleType("torchaudio.utils")
            utils._download_asset = _refuse_download  # type: ignore[attr-defined]
            stub.utils = utils  # type: ignore[attr-defined]
            sys.modules["torchaudio"], sys.modules["torchaudio.utils"] = stub, utils
            try:
                spec = importlib.util.spec_from_file_location("torchaudio_ctc_decoder_oracle", source)
                assert spec is not None and spec.loader is not None
                module = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(module)
            finally:
                for name, value in saved.items():
                    if value is None:
                        sys.modules.pop(name, None)
                    else:
                        sys.modules[name] = value
    except (ImportError, metadata.PackageNotFoundError):
        module = None
    _LOADED["module"] = module
    return module
