"""What a new user hit in the CTC drop-ins and the CTC command, each checked against what the guide promises: no
output at import, limits refused at once and by name, bad emissions refused, a clear error for calls out of
order, bounded hotword weights, a corrupt ARPA file named in one line, removed import paths naming their new
home, warnings in one line."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import beamkit.ctc.compat as compat
from beamkit.ctc import CTCOptions, Hotwords, MovedNameError
from beamkit.lm import write_arpa

SRC = str(Path(__file__).resolve().parents[1] / "src")
LABELS = ["", " ", "a", "b", "c"]


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter with this checkout's sources first on the path."""
    full_env = {**os.environ, "PYTHONPATH": SRC, **env}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=600, check=False
    )


def test_importing_the_pyctcdecode_drop_in_prints_nothing() -> None:
    # a first process decodes (so the compiled search is in numba's cache: the import then warms it up); the
    # second imports the drop-in with logging shown as an application would configure it
    first = run_python(
        "import numpy as np, beamkit.ctc.compat as p; p.build_ctcdecoder(['', 'a']).decode(np.zeros((2, 2)))"
    )
    assert first.returncode == 0, first.stderr
    second = run_python("import logging; logging.basicConfig(level=logging.INFO); import beamkit.ctc.compat")
    assert second.returncode == 0
    assert second.stdout == "" and second.stderr == ""


def test_hotword_weight_is_bounded_everywhere() -> None:
    for weight in (1e308, -1e308, 1001.0, -1001.0):
        with pytest.raises(ValueError, match="hotword_weight must be a finite number between -1000 and 1000"):
            CTCOptions(hotwords=["ab"], hotword_weight=weight)
        with pytest.raises(ValueError, match="hotword_weight"):
            Hotwords(["ab"], weight)
        with pytest.raises(ValueError, match="hotword_weight"):
            compat.build_ctcdecoder(LABELS).decode(np.log(np.full((3, 5), 0.2)), hotwords=["ab"], hotword_weight=weight)
    # the bounds themselves are taken, and a weight of 1000 keeps every score finite
    lp = np.log(np.full((4, 5), 0.2))
    for weight in (1000.0, -1000.0):
        beams = compat.build_ctcdecoder(LABELS).decode_beams(lp, hotwords=["ab"], hotword_weight=weight)
        assert beams and all(np.isfinite(b[-1]) for b in beams)


def test_a_corrupt_arpa_through_the_drop_in_is_one_value_error(tmp_path: Path) -> None:
    pytest.importorskip("kenlm")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b\nb a\n")
    good = tmp_path / "lm.arpa"
    write_arpa(str(corpus), str(good), order=2)
    lines = good.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("-"))
    lines[at] = "x" + lines[at][1:]  # a probability that is not a number
    bad = tmp_path / "bad.arpa"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"bad\.arpa, line {at + 1}") as info:
        compat.build_ctcdecoder(LABELS, str(bad))
    assert "\n" not in str(info.value)
    saved = tmp_path / "saved"
    saved.mkdir()
    compat.build_ctcdecoder(LABELS, str(good)).save_to_dir(str(saved))
    (saved / "language_model" / "lm.arpa").write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"lm\.arpa, line"):
        compat.LanguageModel.load_from_dir(str(saved / "language_model"))


@pytest.mark.parametrize(
    ("module", "name", "home"),
    [
        ("beamkit.ctc.lm", "ArpaLM", "beamkit.lm.ArpaLM"),
        ("beamkit.ctc.lm", "KenLMModel", "beamkit.lm.KenLMModel"),
        ("beamkit.ctc.lm", "NGramModel", "beamkit.lm.NGramModel"),
        ("beamkit.ctc.lm", "load_language_model", "beamkit.lm.load_language_model"),
        ("beamkit.ctc.lm", "load_unigrams_from_arpa", "beamkit.lm.load_unigrams_from_arpa"),
        ("beamkit.ctc.lm", "HotwordScorer", "beamkit.ctc.Hotwords"),
        ("beamkit.ctc", "ArpaLM", "beamkit.lm.ArpaLM"),
        ("beamkit.ctc", "greedy_decode", "beamkit.ctc.greedy_ctc"),
        ("beamkit.ctc.decoder", "OutputBeam", "beamkit.ctc.compat.decoder.OutputBeam"),
        ("beamkit.ctc.options", "SearchOptions", "beamkit.ctc.CTCOptions"),
        ("beamkit.ctc.prefix_search", "log_softmax", "beamkit.ops.log_softmax"),
        ("beamkit.ctc.search", "Recorder", "beamkit.ctc.search.CTCRecorder"),
        ("beamkit.ctc.search", "search_candidates", "beamkit.ctc.prefix.run.search_candidates"),
        ("beamkit.ctc.lexicon", "read_lexicon", "beamkit.ctc.lexicon.trie.read_lexicon"),
        ("beamkit.ctc.posteriors", "Candidates", "beamkit.ctc.posteriors.FrameCandidates"),
    ],
)
def test_a_removed_name_is_an_import_error_naming_its_new_home(module: str, name: str, home: str) -> None:
    # the oracle: the migration guide's table of earlier names
    with pytest.raises(ImportError, match=rf"^{module}\.{name} was removed: import {home.replace('.', '[.]')}"):
        exec(f"from {module} import {name}", {})
    with pytest.raises(
        AttributeError, match=rf"has no attribute '{name}': it was removed, import {home.replace('.', '[.]')}"
    ):
        getattr(importlib.import_module(module), name)
    assert not hasattr(importlib.import_module(module), name)
    with pytest.raises(MovedNameError):
        exec(f"from {module} import {name}", {})
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        importlib.import_module(module).no_such_name  # noqa: B018 - any other missing name: the usual error


@pytest.mark.parametrize(
    ("old", "home"),
    [
        ("beamkit.ctc.kneser_ney", "beamkit.lm"),
        ("beamkit.ctc.cli", "beamkit.cli.ctc"),
        ("beamkit.ctc.kernel", "beamkit.ctc.prefix.kernel"),
        ("beamkit.ctc.nodes", "beamkit.ctc.prefix.nodes"),
        ("beamkit.ctc.fusion", "beamkit.ctc.prefix.fusion"),
        ("beamkit.ctc.chartrie", "beamkit.ctc.prefix.chartrie"),
        ("beamkit.ctc.lexicon_search", "beamkit.ctc.lexicon.search"),
        ("beamkit.ctc.lexicon_kernel", "beamkit.ctc.lexicon.kernel"),
        ("beamkit.ctc.lexicon_compiled", "beamkit.ctc.lexicon.compiled"),
    ],
)
def test_a_removed_module_names_its_new_home(old: str, home: str) -> None:
    with pytest.raises(ModuleNotFoundError, match=rf"^{old.replace('.', '[.]')} was removed: import {home}"):
        importlib.import_module(old)
    importlib.import_module(home)


def test_without_numba_the_command_warns_in_one_line(tmp_path: Path) -> None:
    # BEAMKIT_NO_JIT runs the search as plain Python, as the numpy-only install does
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b\nb a\n")
    write_arpa(str(corpus), str(tmp_path / "lm.arpa"), order=2)
    rng = np.random.default_rng(0)
    np.save(tmp_path / "lp.npy", np.log(rng.dirichlet(np.ones(5), size=6)))
    (tmp_path / "labels.txt").write_text("<pad>\n<space>\na\nb\nc\n")
    argv = [str(tmp_path / "lp.npy"), "--labels", str(tmp_path / "labels.txt"), "--lm", str(tmp_path / "lm.arpa")]
    code = f"import sys; from beamkit.cli import main; sys.exit(main(['ctc', 'decode', *{argv!r}]))"
    out = run_python(code, BEAMKIT_NO_JIT="1", BEAMKIT_COMPILE_NOTE="0")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == [
        "beamkit ctc decode: warning: the CTC search runs as plain Python, 100x slower: numba is not installed "
        '(pip install ".[ctc]" from a beamkit checkout) or BEAMKIT_NO_JIT is set'
    ]


def test_torchaudio_drop_in_refuses_a_huge_beam_at_once(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from beamkit.ctc.compat.torchaudio import ctc_decoder

    # refused when the decoder is made, before anything is allocated for the beam
    with pytest.raises(ValueError, match="beam_size must be between 1 and 100000, got 1000000000"):
        ctc_decoder(None, ["-", "|", "a"], beam_size=10**9)
    assert ctc_decoder(None, ["-", "|", "a"], beam_size=100_000).decoder.options.beam_size == 100_000


def test_torchaudio_drop_in_refuses_bad_emissions() -> None:
    torch = pytest.importorskip("torch")
    from beamkit.ctc.compat.torchaudio import EmissionsError, ctc_decoder

    dec = ctc_decoder(None, ["-", "|", "a", "b"])
    with pytest.raises(EmissionsError, match=r"at least a column per token \(4\), got 3 columns"):
        dec(torch.zeros(1, 3, 3))
    with pytest.raises(EmissionsError, match=r"at least a column per token \(4\), got 3 columns"):
        dec.decode_begin()
        dec.decode_step(torch.zeros(3, 3))
    nan = torch.zeros(2, 3, 4)
    nan[1, 2, 0] = float("nan")
    with pytest.raises(EmissionsError, match="NaN"):
        dec(nan)
    assert len(dec(nan, torch.tensor([3, 2]))) == 2  # a NaN past an utterance's length is not read


def test_torchaudio_drop_in_says_decode_begin_comes_first() -> None:
    torch = pytest.importorskip("torch")
    from beamkit.ctc.compat.torchaudio import ctc_decoder

    for _ in range(2):  # a decoder made afresh each time: the first call on it is out of order
        dec = ctc_decoder(None, ["-", "|", "a", "b"])
        with pytest.raises(RuntimeError, match="decode_step before decode_begin"):
            dec.decode_step(torch.zeros(3, 4))
        with pytest.raises(RuntimeError, match="decode_end before decode_begin"):
            dec.decode_end()
        dec.decode_begin()
        dec.decode_step(torch.zeros(3, 4))
        dec.decode_end()
        assert dec.get_final_hypothesis()
