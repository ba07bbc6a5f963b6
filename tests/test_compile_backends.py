"""``compile=``: a backend name torch does not know is refused by name, wherever it is given (``beamkit.hf.generate``,
the bridge's steps, a model loaded for serving, ``beamkit serve --compile``), and an empty name is refused by the
server's option as by ``generate(compile="")``.

Oracle: torch's own list of backends (``torch.compiler.list_backends``), read here independently.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import beamkit.hf as bh  # noqa: E402
from beamkit.cli import main  # noqa: E402
from beamkit.models.compiled import compile_setting  # noqa: E402
from tests.test_serve import in_thread  # noqa: E402

UNKNOWN = ["nope", "inductr", "Inductor", "max_autotune", " inductor"]


@pytest.fixture(scope="module")
def gpt2():
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=32, eos_token_id=2)
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_torchs_own_backends_are_taken_and_no_other():
    known = set(torch.compiler.list_backends(exclude_tags=()))
    assert {"inductor", "eager", "aot_eager"} <= known
    for name in sorted(known) + ["max-autotune"]:
        assert compile_setting(name) == name
    assert compile_setting(True) == "inductor" and compile_setting(False) is None
    for name in UNKNOWN:
        assert name not in known
        with pytest.raises(ValueError) as err:
            compile_setting(name)
        assert repr(name) in str(err.value) and "inductor" in str(err.value)


@pytest.mark.parametrize("name", UNKNOWN)
def test_generate_and_the_steps_refuse_an_unknown_backend_by_name(gpt2, name):
    ids = torch.tensor([[5, 6, 7]])
    for kw in ({"num_beams": 2}, {"num_beams": 2, "output_scores": True, "return_dict_in_generate": True}):
        with pytest.raises(ValueError, match=repr(name)):
            bh.generate(gpt2, ids, compile=name, max_new_tokens=2, pad_token_id=0, **kw)
    with pytest.raises(ValueError, match=repr(name)):
        bh.DecoderOnlyStep(gpt2, compile=name)


def test_serve_refuses_an_unknown_or_empty_backend_in_one_line(capsys, tmp_path):
    folder = tmp_path / "tiny"
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=40, n_positions=32, eos_token_id=2)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(folder)
    capsys.readouterr()  # (saving's own progress lines)
    for argv, needle in (
        (["--compile", "", "--model", "dates-seq2seq"], "--compile"),
        (["--compile", "", "--model", f"hf:{folder}"], "--compile"),
        (["--compile", "  ", "--model", f"hf:{folder}"], "--compile"),
        (["--compile", "nope", "--model", f"hf:{folder}"], "'nope'"),
    ):
        t, box = in_thread(main, ["serve", "--host", "127.0.0.1", "--port", "0", *argv])
        t.join(120)
        assert not t.is_alive(), f"the server started with {argv}"  # (it then serves on, in its thread)
        assert box["out"] == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("beamkit serve: error:") and needle in err[0], err
