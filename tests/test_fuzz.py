"""Fuzzing the public API and the command line with hypothesis: bad input is refused, never mishandled.

Every outcome must be a well-shaped result or a ValueError / TypeError with a message (the CLI: exit code 0, or
1 / 2 with exactly one ``error:`` line on standard error and no traceback); never another exception, a hang
(each call runs under an alarm) or a result of the wrong shape. The inputs: random shapes, dtypes, NaN / inf,
empty and huge arrays, wrong types, out-of-range ids, for ``search_batch``, ``beam_search``,
``greedy_decode``, the logit processors, the samplers, the CTC decoder API and ``beamkit.cli.main``.

Runs are derandomized (the same examples every run, so ``make test`` is reproducible) and sized to stay
under ~40 s in all. Failures found in code this test does not own (the engine, ``beamkit.ctc``) are kept
out of the random strategies and pinned as minimal reproducers at the end of this file, each
``xfail(strict=True)``: once fixed, the xfail turns into a failure that says to drop the mark.
"""

from __future__ import annotations

import contextlib
import io
import math
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

import beamkit  # noqa: E402
from beamkit.cli import entry as cli  # noqa: E402
from beamkit.toy import VOCAB, make_state  # noqa: E402
from beamkit.toy import step_fn as toy_step  # noqa: E402

FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
ALARM_S = 20.0  # a call running longer than this is a hang


class Hang(BaseException):
    """Raised by the alarm: the call did not return in time (a BaseException, so no ``except Exception`` eats it)."""


@contextlib.contextmanager
def no_hang(seconds: float = ALARM_S):
    def fire(signum, frame):
        raise Hang(f"no result after {seconds} s")

    previous = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def outcome(call) -> Any:
    """``call()``'s result, or the ValueError / TypeError it raised (with a non-empty message)."""
    with no_hang():
        try:
            return call()
        except (ValueError, TypeError) as exc:
            assert str(exc).strip(), f"{type(exc).__name__} without a message"
            return exc


# --- strategies --------------------------------------------------------------------------------------------

WRONG = st.sampled_from([None, "3", 2.5, [1], {"a": 1}, object(), float("nan"), b"x"])
SMALL_INT = st.integers(-3, 6)
FLOATS = st.floats(allow_nan=True, allow_infinity=True, width=64)


def maybe_wrong(strategy):
    return st.one_of(strategy, strategy, strategy, WRONG, st.booleans())


EOS = st.one_of(st.integers(-2, VOCAB + 3), st.lists(st.integers(-1, VOCAB + 1), max_size=3), st.none())
OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "policy": st.sampled_from(["narrow", "pool", "compete", "beam"]),
        "length_penalty": st.one_of(FLOATS, WRONG),
        "num_return": maybe_wrong(SMALL_INT),
        "min_len": maybe_wrong(SMALL_INT),
        "early_stopping": st.sampled_from([True, False, "never", "sometimes", None]),
        "patience": st.one_of(FLOATS, WRONG),
        "process_logits": st.booleans(),
    },
)


def check_hypotheses(
    result: Any, requests: int, beam_size: int, max_len: int, vocab: int, eos: Any, tol: float = 1e-9
) -> None:
    """The shape every search result must have (``tol``: rounding of the logits' dtype, per token)."""
    assert isinstance(result, list) and len(result) == requests
    stops = set() if eos is None else ({eos} if isinstance(eos, int) else set(eos))
    for hyps in result:
        assert isinstance(hyps, list) and 1 <= len(hyps) <= beam_size
        for h in hyps:
            assert isinstance(h, beamkit.Hypothesis)
            assert all(isinstance(t, int) and 0 <= t < vocab for t in h.tokens), h.tokens
            assert len(h.tokens) <= max_len
            assert not math.isnan(h.logprob) and h.logprob <= tol * max(1, len(h.tokens))
            assert len(h.token_logprobs) == len(h.tokens)
            if h.finished:
                assert h.tokens and h.tokens[-1] in stops
            assert not any(t in stops for t in h.tokens[:-1])


# --- the search API ----------------------------------------------------------------------------------------


@FUZZ
@given(
    beam_size=maybe_wrong(st.one_of(SMALL_INT, st.just(60))),  # 60 > V: wider than the vocabulary
    max_len=maybe_wrong(st.integers(-1, 7)),
    eos=st.one_of(EOS, WRONG),
    bos=st.one_of(st.integers(-2, VOCAB + 2), st.lists(st.integers(-1, VOCAB), max_size=4), WRONG),
    requests=st.sampled_from([1, 2, 3, 64]),
    options=OPTIONS,
)
def test_search_batch_options(beam_size, max_len, eos, bos, requests, options):
    out = outcome(lambda: beamkit.search_batch(toy_step, make_state(requests), bos, eos, beam_size, max_len, **options))
    if not isinstance(out, Exception):
        k = max(1, options.get("num_return") or beam_size) if options.get("num_return") else beam_size
        check_hypotheses(out, requests, max(k, beam_size), max_len, VOCAB, eos)


LOGIT_DTYPES = st.sampled_from(["float16", "float32", "float64", "int64", "int8", "bool", "complex128", "object"])


@st.composite
def logit_banks(draw):
    """A bank of logits ``[16, V]`` the step function serves rows from: any dtype, NaN, inf, huge values."""
    vocab = draw(st.sampled_from([1, 2, 3, 7, 40, 5000]))
    dtype = draw(LOGIT_DTYPES)
    if dtype == "object":
        return np.array([[draw(st.sampled_from([0.0, "x", None, 1]))] * vocab] * 16, dtype=object)
    values = st.sampled_from([0.0, -1.0, 2.5, -1e30, 1e30, np.inf, -np.inf, np.nan, 1e308, -5e-324])
    base = draw(hnp.arrays(np.float64, (16, vocab), elements=values))
    with np.errstate(all="ignore"):
        return (
            base.astype(dtype) if dtype not in ("int64", "int8") else np.nan_to_num(base).clip(-100, 100).astype(dtype)
        )


@FUZZ
@given(
    bank=logit_banks(),
    as_list=st.booleans(),
    beam_size=st.integers(1, 4),
    max_len=st.integers(1, 5),
    requests=st.integers(1, 3),
    policy=st.sampled_from(["narrow", "pool", "compete"]),
)
def test_search_batch_logits(bank, as_list, beam_size, max_len, requests, policy):
    vocab = bank.shape[1]

    def step(state, y_prev):
        rows = len(state)
        logits = np.roll(bank, int(state[0]), axis=0)[:rows]  # shape: (rows, V)
        return (logits.tolist() if as_list else logits), state + 1

    init = np.zeros(requests, dtype=np.int64)
    out = outcome(lambda: beamkit.search_batch(step, init, -1, 0, beam_size, max_len, policy=policy))
    if not isinstance(out, Exception):
        tol = float(np.finfo(bank.dtype).eps) * 16 if bank.dtype.kind == "f" else 1e-9  # log-softmax in float32/16
        check_hypotheses(out, requests, beam_size, max_len, vocab, 0, tol)


@FUZZ
@given(
    rows_off=st.sampled_from([-1, 1, 2]),
    shape=st.sampled_from(["1d", "3d", "scalar", "empty_v"]),
    which=st.sampled_from(["rows", "shape"]),
)
def test_step_function_returning_the_wrong_logits_shape(rows_off, shape, which):
    def step(state, y_prev):
        rows = len(state)
        if which == "rows":
            return np.zeros((max(0, rows + rows_off), 5)), state
        return {"1d": np.zeros(5), "3d": np.zeros((rows, 5, 2)), "scalar": np.float64(0.0)}.get(
            shape, np.zeros((rows, 0))
        ), state

    out = outcome(lambda: beamkit.search_batch(step, np.zeros(2, dtype=np.int64), -1, 0, 2, 3))
    assert isinstance(out, (ValueError, TypeError)), out


@FUZZ
@given(
    state=st.sampled_from(["none", "scalar", "1d", "3d", "empty", "list", "str", "wide"]),
    beam_size=st.integers(1, 3),
)
def test_bad_initial_states(state, beam_size):
    init = {
        "none": None,
        "scalar": np.int64(3),
        "1d": np.zeros(2, dtype=np.int64),
        "3d": np.zeros((1, 2, 2), dtype=np.int64),
        "empty": np.zeros((0, 2), dtype=np.int64),
        "list": [[0, 0]],
        "str": "state",
        "wide": np.zeros((1, 3), dtype=np.int64),
    }[state]
    out = outcome(lambda: beamkit.search_batch(toy_step, init, -1, 0, beam_size, 4))
    if state == "empty":
        assert out == []  # no request, no result
    else:
        assert isinstance(out, (ValueError, TypeError)), out


@FUZZ
@given(
    beam_size=maybe_wrong(SMALL_INT),
    max_len=maybe_wrong(st.integers(-1, 6)),
    eos=st.one_of(st.integers(-1, VOCAB + 2), WRONG),
    length_penalty=st.one_of(FLOATS, WRONG),
    greedy=st.booleans(),
)
def test_beam_search_and_greedy_decode(beam_size, max_len, eos, length_penalty, greedy):
    state = make_state(1)
    if greedy:
        out = outcome(lambda: beamkit.greedy_decode(toy_step, state, -1, eos, max_len=max_len))
        if not isinstance(out, Exception):
            check_hypotheses([[out]], 1, 1, max_len, VOCAB, eos)
        return
    out = outcome(lambda: beamkit.beam_search(toy_step, state, -1, eos, beam_size, max_len, length_penalty))
    if not isinstance(out, Exception):
        check_hypotheses([out], 1, beam_size, max_len, VOCAB, eos)


TOKENS = st.lists(st.integers(-2, VOCAB + 2), max_size=3)


@st.composite
def processors(draw):
    """A processor built from random (often wrong) arguments; None when construction refused them."""
    kind = draw(st.sampled_from(["min", "ngram", "bad", "suppress", "bias", "forced", "rep", "temp"]))
    build = {
        "min": lambda: beamkit.MinLength(draw(maybe_wrong(SMALL_INT))),
        "ngram": lambda: beamkit.NoRepeatNGram(draw(maybe_wrong(SMALL_INT))),
        "bad": lambda: beamkit.BadWords(draw(st.one_of(st.lists(TOKENS, max_size=2).map(tuple), WRONG))),
        "suppress": lambda: beamkit.SuppressTokens(draw(st.one_of(TOKENS.map(tuple), WRONG))),
        "bias": lambda: beamkit.SequenceBias(
            draw(st.one_of(st.lists(st.tuples(TOKENS.map(tuple), FLOATS), max_size=2).map(tuple), WRONG))
        ),
        "forced": lambda: beamkit.ForcedPrefix(draw(st.one_of(st.lists(TOKENS.map(tuple), max_size=2), WRONG))),
        "rep": lambda: beamkit.RepetitionPenalty(draw(st.one_of(FLOATS, WRONG))),
        "temp": lambda: beamkit.Temperature(draw(st.one_of(FLOATS, WRONG))),
    }[kind]
    made = outcome(build)
    return None if isinstance(made, Exception) else made


@FUZZ
@given(procs=st.lists(processors(), min_size=1, max_size=3), requests=st.integers(1, 2), beam=st.integers(1, 3))
def test_processors(procs, requests, beam):
    procs = [p for p in procs if p is not None]
    out = outcome(lambda: beamkit.search_batch(toy_step, make_state(requests), -1, 0, beam, 4, processors=procs))
    if not isinstance(out, Exception):
        raised = any(getattr(p, "raises_scores", False) for p in procs)  # a positive SequenceBias: scores > 0
        check_hypotheses(out, requests, beam, 4, VOCAB, 0, tol=math.inf if raised else 1e-9)


@st.composite
def samplers(draw):
    kind = draw(st.sampled_from(["topk", "topp", "multi", "beamsample", "gumbel"]))
    seed = draw(st.one_of(st.integers(0, 2**32), st.integers(-5, -1), WRONG))
    build = {
        "topk": lambda: beamkit.TopK(k=draw(maybe_wrong(SMALL_INT)), seed=seed),
        "topp": lambda: beamkit.TopP(p=draw(st.one_of(FLOATS, WRONG)), seed=seed),
        "multi": lambda: beamkit.Multinomial(seed=seed),
        "beamsample": lambda: beamkit.BeamSample(seed=seed),
        "gumbel": lambda: beamkit.GumbelTopK(seed=seed),
    }[kind]
    return outcome(build)


@FUZZ
@given(
    selector=samplers(),
    beam=maybe_wrong(st.integers(0, 4)),
    requests=st.integers(1, 2),
    stochastic=st.booleans(),
    seed=st.one_of(st.integers(0, 100), WRONG),
)
def test_samplers(selector, beam, requests, stochastic, seed):
    state = make_state(requests)
    if stochastic:
        out = outcome(lambda: beamkit.stochastic_beam_search(toy_step, state, -1, 0, beam, 4, seed=seed))
        if not isinstance(out, Exception):
            check_hypotheses([[s.hypothesis for s in r] for r in out], requests, beam, 4, VOCAB, 0)
        return
    if isinstance(selector, Exception):
        return
    out = outcome(lambda: beamkit.search_batch(toy_step, state, -1, 0, beam, 4, selector=selector))
    if not isinstance(out, Exception):
        check_hypotheses(out, requests, beam, 4, VOCAB, 0)


# --- the CTC decoder API (called, not owned here) ------------------------------------------------------------

LABELS = st.lists(st.sampled_from(["", " ", "|", "a", "b", "c", "<pad>", "\u2581ab", "_", "ab", "a"]), max_size=6)


@st.composite
def ctc_matrices(draw, vocab: int):
    shape = draw(st.sampled_from(["ok", "ok", "ok", "wide", "narrow", "empty_t", "1d", "3d"]))
    t = 0 if shape == "empty_t" else draw(st.integers(1, 6))
    v = {"wide": vocab + 1, "narrow": max(0, vocab - 1)}.get(shape, vocab)
    dtype = draw(st.sampled_from(["float32", "float64", "float16", "bool", "int32", "complex64"]))
    values = st.sampled_from([0.0, -0.5, -3.0, -20.0, 0.3, np.nan, -np.inf, np.inf, -1e30])
    arr = draw(hnp.arrays(np.float64, (t, v), elements=values))
    if shape == "1d":
        arr = arr.reshape(-1)
    elif shape == "3d":
        arr = arr[None]
    with np.errstate(all="ignore"):
        return arr.astype(dtype) if dtype not in ("int32", "bool") else np.nan_to_num(arr).astype(dtype)


@FUZZ
@given(data=st.data(), labels=LABELS, call=st.sampled_from(["decode", "beams", "batch", "greedy"]))
def test_ctc_decoder_api(data, labels, call):
    from beamkit.ctc import greedy_ctc
    from tests.ctc_legacy import build_legacy_decoder as build_ctcdecoder

    decoder = outcome(lambda: build_ctcdecoder(labels))
    if isinstance(decoder, Exception):
        return
    mat = data.draw(ctc_matrices(len(labels)))
    width = data.draw(st.one_of(st.integers(-1, 8), WRONG))
    if call == "decode":
        out = outcome(lambda: decoder.decode(mat, beam_width=width))
        assert isinstance(out, (str, Exception))
    elif call == "beams":
        out = outcome(lambda: decoder.decode_beams(mat, beam_width=width))
        if not isinstance(out, Exception):
            assert isinstance(out, list) and 1 <= len(out) <= max(1, width)
            assert all(isinstance(b[0], str) and not math.isnan(b[-1]) for b in out)
    elif call == "batch":
        out = outcome(lambda: decoder.decode_batch(None, [mat, mat], beam_width=width))
        if not isinstance(out, Exception):
            assert isinstance(out, list) and len(out) == 2 and all(isinstance(x, str) for x in out)
    else:
        out = outcome(lambda: greedy_ctc(mat, decoder.vocab))
        assert isinstance(out, (str, Exception))


# --- the command line ----------------------------------------------------------------------------------------

NPY: dict[str, Path] = {}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """Inputs the CLI fuzz refers to: matrices of several dtypes and shapes, labels, corpora, a folder."""
    root = tmp_path_factory.mktemp("cli_fuzz")
    good = np.log(np.full((4, 4), 0.25))
    arrays = {
        "good": good,
        "nan": np.full((3, 4), np.nan),
        "empty": np.zeros((0, 4)),
        "onedim": np.zeros(4),
        "fourdim": np.zeros((1, 1, 2, 4)),
        "ints": np.zeros((3, 4), dtype=np.int64),
        "wide": np.zeros((3, 9)),
    }
    for name, arr in arrays.items():
        np.save(root / f"{name}.npy", arr)
    (root / "notnpy.npy").write_bytes(b"not a numpy file")
    (root / "labels.txt").write_text("\n<space>\na\nb\n")
    (root / "corpus.txt").write_text("a b\nb a a\n")
    (root / "empty.txt").write_text("")
    (root / "dir").mkdir()
    return root


ARG_VALUES = st.sampled_from(["1", "0", "-1", "2", "x", "", "1e9", "nan", "3.5", "-", "1,2", "99999999999999999999"])


@st.composite
def argvs(draw, root: Path):
    path = st.sampled_from(
        [str(root / n) for n in ["good.npy", "nan.npy", "empty.npy", "onedim.npy", "fourdim.npy", "notnpy.npy"]]
        + [str(root / n) for n in ["ints.npy", "wide.npy", "labels.txt", "corpus.txt", "empty.txt", "dir"]]
        + ["/nonexistent/x", ""]
    )
    command = draw(st.sampled_from(["translate", "ctc", "lm", "models", "demo", "eval", "nonsense", "", "--bogus"]))
    argv = [command] if command else []
    options: list[str] = []
    if command == "translate":
        options = ["--beam", "--n-best", "--length-penalty", "--max-len", "--model"]
        argv += draw(st.lists(st.sampled_from(["1999.3.3", "", "3 M\u00e4rz", "x" * 200, "03/04/99"]), max_size=2))
        argv += draw(st.sampled_from([[], ["--json"], ["--quiet"]]))
    elif command == "ctc":
        argv += ["decode", draw(path), "--labels", draw(st.one_of(path, st.sampled_from([" ab", "ab", ""])))]
        options = ["--beam", "--alpha", "--beta", "--top", "--lm"]
        argv += draw(st.sampled_from([[], ["--json"], ["--greedy"], ["--lm-backend", "arpa"]]))
    elif command == "lm":
        argv += ["build", draw(path), "-o", draw(st.sampled_from([str(root / "out.arpa"), str(root / "dir")]))]
        options = ["--order"]
    elif command == "eval":
        argv += ["dates", "--limit", draw(st.sampled_from(["2", "0", "-1", "x"])), "--beams", draw(ARG_VALUES)]
    for _ in range(draw(st.integers(0, 2))):
        if options:
            opt = draw(st.sampled_from(options))
            argv += [opt, draw(path) if opt in ("--model", "--lm") else draw(ARG_VALUES)]
    if draw(st.booleans()):
        argv.append(draw(st.sampled_from(["--unknown-flag", "extra"])))
    return argv


HUGE = "99999999999999999999"


def run_cli(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), no_hang():
        try:
            code = cli.main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return code, err.getvalue()


@pytest.mark.usefixtures("one_torch_thread")
def test_cli(files):
    pytest.importorskip("torch")

    @settings(FUZZ, max_examples=70)
    @given(argv=argvs(files))
    def check(argv):
        code, err = run_cli(argv)
        assert code in (0, 1, 2), (argv, code, err)
        assert "Traceback" not in err, (argv, err)
        if code != 0:
            errors = [line for line in err.splitlines() if "error:" in line]
            assert len(errors) == 1, (argv, err)
            assert errors[0].startswith("beamkit"), (argv, err)

    check()


# --- failures found in code this file does not own: minimal reproducers, fixed elsewhere ----------------------
# Each runs the exact input that failed; xfail(strict=True): when the owner fixes it, the test passes, pytest
# reports the strict xfail as a failure, and the mark (and the matching ``assume`` / ``known_failure`` filter
# above) should be removed.


def test_huge_beam_size():
    # `beamkit translate --beam 99999999999999999999 x` gives the same OverflowError traceback
    out = outcome(lambda: beamkit.search_batch(toy_step, make_state(1), -1, 0, 10**20, 3))
    assert isinstance(out, ValueError)


def test_logits_width_that_changes_between_steps():
    def step(state, y_prev):
        width = 6 if int(state[0]) == 0 else 9  # shape: (rows, 6) on the first call, (rows, 9) afterwards
        return np.zeros((len(state), width)), state + 1

    out = outcome(lambda: beamkit.search_batch(step, np.zeros(1, dtype=np.int64), -1, 5, 2, 3))
    assert isinstance(out, ValueError), out  # today: hypotheses holding token 8 of a 6-token vocabulary


def test_state_leaves_with_different_row_counts():
    def step(state, y_prev):
        return np.zeros((len(state[0]), 4)), state

    init = (np.zeros((2, 2)), np.zeros((3, 1)))  # 2 rows in one leaf, 3 in the other
    out = outcome(lambda: beamkit.search_batch(step, init, -1, 0, 2, 3))
    assert isinstance(out, ValueError), out  # today: a result, as if the batch had 2 requests


def test_ctc_decode_of_an_empty_file(files):
    code, err = run_cli(["ctc", "decode", str(files / "empty.txt"), "--labels", " ab"])
    assert code == 2 and "Traceback" not in err


@pytest.mark.parametrize("dtype", ["complex128", "bool"])
def test_ctc_decoder_refuses_complex_and_bool_posteriors(dtype):
    from tests.ctc_legacy import build_legacy_decoder as build_ctcdecoder

    decoder = build_ctcdecoder(["", " ", "a", "b"])
    mat = np.log(np.full((3, 4), 0.25)).astype(dtype) if dtype != "bool" else np.ones((3, 4), dtype=bool)
    out = outcome(lambda: decoder.decode(mat))
    assert isinstance(out, (ValueError, TypeError)), out
