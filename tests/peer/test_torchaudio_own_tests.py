"""torchaudio's own decoder tests (``test/torchaudio_unittest/models/decoder/ctc_decoder_test.py`` of a
pytorch/audio checkout, with its ``ctc_decoder_utils.py`` and assets) run against beamkit's drop-in through a shim:
``torchaudio.models.decoder`` is ``beamkit.ctc.compat.torchaudio``, the private helpers the test utilities import
(``_Dictionary``, ``_load_words``, ``_create_word_dict``, ``_KenLM``) are beamkit's equivalents, and
torchaudio's test case classes and ``parameterized.expand`` are small stand-ins.

Set ``TORCHAUDIO_SRC`` to the checkout (nothing is downloaded); skips without it. Needs torch and kenlm (the torchaudio
peer environment ``.venv-ta`` has both).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import types
import unittest
from pathlib import Path
from typing import Any

import pytest

SOURCE = Path(os.environ.get("TORCHAUDIO_SRC", "/nonexistent"))
TESTS = SOURCE / "test" / "torchaudio_unittest"
TEST_FILE = TESTS / "models" / "decoder" / "ctc_decoder_test.py"
if not TEST_FILE.is_file():
    pytest.skip(
        "set TORCHAUDIO_SRC to a pytorch/audio checkout to run torchaudio's own decoder tests", allow_module_level=True
    )
torch = pytest.importorskip("torch")
pytest.importorskip("kenlm")

from beamkit.ctc.compat import torchaudio as drop_in  # noqa: E402
from beamkit.ctc.lexicon.lm import KenLMWords  # noqa: E402
from beamkit.ctc.lexicon.trie import read_lexicon  # noqa: E402
from beamkit.lm import KenLMModel  # noqa: E402

# torchaudio's tests that do not apply to the drop-in, with the reason (none so far: every test runs)
INAPPLICABLE: dict[str, str] = {}


def comparable(value: Any) -> Any:
    """Tensors as lists, named tuples and tuples as tuples, lists element-wise: for equality of results."""
    if isinstance(value, torch.Tensor):
        return comparable(value.tolist())
    if isinstance(value, (list, tuple)):
        return tuple(comparable(v) for v in value)
    if isinstance(value, torch.Size):
        return tuple(value)
    return value


class TestCase(unittest.TestCase):
    """torchaudio's TorchaudioTestCase as far as the decoder tests use it: equality through tensors."""

    def assertEqual(self, first: Any, second: Any, msg: Any = None) -> None:  # noqa: N802
        super().assertEqual(comparable(first), comparable(second), msg)


class TempDirMixin:
    """A temporary folder per test (unused by the decoder tests but part of the base classes)."""

    def get_temp_path(self, *paths: str) -> str:
        folder = tempfile.mkdtemp()
        return os.path.join(folder, *paths)


def expand(params: list[tuple[Any, ...]]) -> Any:
    """``parameterized.expand``: marks the function; ``_expand_class`` turns it into one test per parameter set."""

    def mark(fn: Any) -> Any:
        fn._expand = [p if isinstance(p, tuple) else (p,) for p in params]
        return fn

    return mark


def _expand_class(cls: type) -> None:
    for name, fn in list(vars(cls).items()):
        params = getattr(fn, "_expand", None)
        if params is None:
            continue
        delattr(cls, name)
        for i, args in enumerate(params):
            setattr(cls, f"{name}_{i}", lambda self, fn=fn, args=args: fn(self, *args))


def _install_shim() -> dict[str, Any]:
    """Put the stand-in modules in ``sys.modules``; return what was there before."""
    names = [
        "torchaudio",
        "torchaudio.models",
        "torchaudio.models.decoder",
        "torchaudio.models.decoder._ctc_decoder",
        "torchaudio_unittest",
        "torchaudio_unittest.common_utils",
        "torchaudio_unittest.models",
        "torchaudio_unittest.models.decoder",
        "parameterized",
    ]
    saved = {name: sys.modules.get(name) for name in names}

    def package(name: str, path: list[str]) -> types.ModuleType:
        module = types.ModuleType(name)
        module.__path__ = path
        sys.modules[name] = module
        return module

    package("torchaudio", [])
    package("torchaudio.models", [])
    decoder = package("torchaudio.models.decoder", [])
    for name in drop_in.__all__:
        setattr(decoder, name, getattr(drop_in, name))
    private = types.ModuleType("torchaudio.models.decoder._ctc_decoder")
    private._Dictionary = drop_in.Dictionary
    private._load_words = read_lexicon
    private._create_word_dict = lambda lexicon: drop_in.Dictionary(list(lexicon), default="<unk>")
    private._KenLM = lambda path, words: KenLMWords(
        KenLMModel(str(path)).model, [words.get_entry(i) for i in range(words.index_size())]
    )
    sys.modules[private.__name__] = private
    package("torchaudio_unittest", [str(TESTS)])
    utils = types.ModuleType("torchaudio_unittest.common_utils")
    utils.get_asset_path = lambda *parts: str(TESTS.joinpath("assets", *parts))
    utils.skipIfNoCtcDecoder = lambda cls: cls
    utils.TempDirMixin = TempDirMixin
    utils.TorchaudioTestCase = TestCase
    sys.modules[utils.__name__] = utils
    package("torchaudio_unittest.models", [str(TESTS / "models")])
    package("torchaudio_unittest.models.decoder", [str(TESTS / "models" / "decoder")])
    parameterized = types.ModuleType("parameterized")
    parameterized.parameterized = types.SimpleNamespace(expand=expand)
    sys.modules["parameterized"] = parameterized
    return saved


def run_torchaudio_tests() -> dict[str, str]:
    """Each test of torchaudio's file and its outcome ("passed", or the failure's last line)."""
    saved = _install_shim()
    try:
        name = "torchaudio_unittest.models.decoder.ctc_decoder_test"
        spec = importlib.util.spec_from_file_location(name, TEST_FILE)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        torch.manual_seed(0)
        outcomes: dict[str, str] = {}
        for cls in [v for v in vars(module).values() if isinstance(v, type) and issubclass(v, unittest.TestCase)]:
            _expand_class(cls)
            suite = unittest.TestLoader().loadTestsFromTestCase(cls)
            ids = [test.id() for test in suite]
            result = unittest.TestResult()
            suite.run(result)
            bad = {t.id(): trace.strip().splitlines()[-1] for t, trace in result.failures + result.errors}
            for test_id in ids:
                outcomes[test_id.rsplit(".", 1)[-1]] = bad.get(test_id, "passed")
        sys.modules.pop(name, None)
        return outcomes
    finally:
        for key, value in saved.items():
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value


def test_torchaudios_own_decoder_tests_pass_through_the_drop_in():
    outcomes = run_torchaudio_tests()
    print(f"\n{len(outcomes)} tests of torchaudio's ctc_decoder_test.py:")
    for name, outcome in sorted(outcomes.items()):
        print(f"  {name}: {INAPPLICABLE.get(name, outcome)}")
    failed = {n: o for n, o in outcomes.items() if o != "passed" and n not in INAPPLICABLE}
    assert len(outcomes) >= 20
    assert not failed, failed
