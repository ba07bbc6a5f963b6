"""beamkit.Trie: the dictionary of valid outputs, its lookups, its processor on the engine and its Hugging Face
callable. Oracles: the entries themselves as Python tuples (what may follow a prefix, computed by scanning every
entry), brute-force enumeration of every entry scored by the model directly (tests/toy.py's plain-Python
log-softmax, or a tiny GPT-2's forward over the whole sequence), and ``model.generate`` running the same callable
row by row.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import beamkit
from beamkit import Trie

try:
    import torch
    import transformers

    import beamkit.hf as bh
except ImportError:  # the Hugging Face tests are skipped, the others run
    torch = transformers = bh = None
from beamkit.constraints import DEAD, PrefixFn, TrieTable
from tests.test_hf import engine_generate
from tests.toy import BOS, ToyModel, log_softmax_ref

needs_hf = pytest.mark.skipif(bh is None, reason="needs torch and transformers")

EOS = 0


def allowed_by_scan(entries: set[tuple[int, ...]], prefix: tuple[int, ...], eos: int | None = None) -> list[int]:
    """The oracle of ``Trie.allowed``: scan every entry."""
    out = {e[len(prefix)] for e in entries if len(e) > len(prefix) and e[: len(prefix)] == prefix}
    if eos is not None and prefix in entries:
        out.add(eos)
    return sorted(out)


def random_entries(seed: int, n: int, vocab: int, longest: int) -> list[tuple[int, ...]]:
    rng = np.random.default_rng(seed)
    return [tuple(rng.integers(0, vocab, rng.integers(1, longest + 1)).tolist()) for _ in range(n)]


# ------------------------------------------------------------------------------------------------ the trie
@pytest.mark.parametrize("seed", range(6))
def test_allowed_matches_a_scan_of_every_entry(seed):
    """Ragged entries, duplicates, entries that are prefixes of others: every prefix of every entry (and some
    that are not prefixes) gets exactly the ids a scan finds; an entry that ends at a prefix adds the stop
    token; len() counts distinct entries."""
    entries = random_entries(seed, 200, 6, 5)
    entries += entries[:20]  # duplicates
    trie = Trie(entries)
    distinct = set(entries)
    assert len(trie) == len(distinct)
    prefixes = {e[:k] for e in distinct for k in range(len(e) + 1)} | {(5, 5, 5, 5, 5, 5), (9,)}
    for p in prefixes:
        assert trie.allowed(p) == allowed_by_scan(distinct, p), p
        assert trie.allowed(p, eos=99) == allowed_by_scan(distinct, p, 99), p
    for e in distinct:
        assert e in trie
    assert all((p in trie) == (p in distinct) for p in prefixes)
    assert trie.depth == max(len(e) for e in distinct)


def test_csr_arrays_have_sorted_children_and_fit_together():
    trie = Trie(random_entries(1, 300, 50, 4))
    assert trie.indptr[0] == 0 and trie.indptr[-1] == trie.labels.shape[0] == trie.nodes - 1
    for node in range(trie.nodes):
        kids = trie.children(node)
        assert np.all(np.diff(kids) > 0)  # strictly ascending: sorted, no repeats
    leaves = np.flatnonzero(np.diff(trie.indptr) == 0)
    assert trie.terminal[leaves].all()  # every leaf ends an entry


def test_the_same_trie_from_a_list_an_array_a_padded_array_a_text_file_and_npy(tmp_path):
    entries = [(3, 1, 4), (1, 5), (9, 2, 6), (1, 5)]
    ragged = Trie(entries)
    padded = np.array([[3, 1, 4], [1, 5, -7], [9, 2, 6], [1, 5, -7]])
    from_pad = Trie(padded, pad=-7)
    (tmp_path / "ids.txt").write_text("3 1 4\n1 5\n\n9 2 6\n1 5\n")
    from_text = Trie(tmp_path / "ids.txt")
    np.save(tmp_path / "ids.npy", padded)
    from_npy = Trie(str(tmp_path / "ids.npy"), pad=-7)
    square = Trie(np.array([[3, 1, 4], [9, 2, 6]]))
    for other in (from_pad, from_text, from_npy):
        for name in ("indptr", "labels", "terminal"):
            assert np.array_equal(getattr(other, name), getattr(ragged, name))
        assert len(other) == 3
    assert len(square) == 2 and square.allowed([9]) == [2]


def test_save_and_load_round_trip(tmp_path):
    trie = Trie(random_entries(2, 500, 30, 4), vocab_size=30)
    trie.save(tmp_path / "t.npz")
    back = Trie.load(tmp_path / "t.npz")
    for name in ("indptr", "labels", "terminal"):
        assert np.array_equal(getattr(back, name), getattr(trie, name))
    assert (len(back), back.depth, back.vocab_size) == (len(trie), trie.depth, 30)
    with pytest.raises(ValueError, match="saved trie: use Trie.load"):
        Trie(tmp_path / "t.npz")
    np.savez(tmp_path / "other.npz", a=np.zeros(3))
    with pytest.raises(ValueError, match="not a saved Trie"):
        Trie.load(tmp_path / "other.npz")
    (tmp_path / "junk.npz").write_text("not a zip")
    with pytest.raises(ValueError, match="cannot read a trie"):
        Trie.load(tmp_path / "junk.npz")


def test_child_and_walk_are_vectorised_lookups():
    entries = {(1, 2, 3), (1, 4), (5,)}
    trie = Trie(entries)
    tokens = np.array([[1, 2, 3], [1, 4, 0], [5, 5, 5], [2, 2, 2]])
    node = trie.walk(tokens[:, :2])
    assert node[3] == DEAD and node[2] == DEAD  # (2, ...) is no prefix; (5, 5) goes past the entry (5,)
    assert trie.terminal[node[1]] and not trie.terminal[node[0]]
    assert trie.children(int(node[0])).tolist() == [3]


@pytest.mark.parametrize(
    ("source", "kwargs", "error", "needle"),
    [
        ([], {}, ValueError, "empty"),
        ([[1, 2], []], {}, ValueError, "sequence 1 of the dictionary is empty"),
        ([[1, -2]], {}, ValueError, "must be >= 0"),
        ([[1, 20]], {"vocab_size": 20}, ValueError, "outside the vocabulary of 20"),
        ([[1.5, 2]], {}, TypeError, "integer token ids"),
        ([["a", "b"]], {}, TypeError, "integer token ids"),
        ([[True, False]], {}, TypeError, "booleans"),
        ([1, 2, 3], {}, TypeError, "sequence of token ids"),
        (np.zeros((2, 2, 2), int), {}, ValueError, r"\[n, L\]"),
        (np.array([[1, -1, 2]]), {"pad": -1}, ValueError, "before a token id"),
        (b"123", {}, TypeError, "token-id sequences"),
        (42, {}, TypeError, "token-id sequences"),
        ([[1, 2]], {"vocab_size": 0}, ValueError, "vocab_size"),
    ],
)
def test_bad_dictionaries_are_clear_errors(source, kwargs, error, needle):
    with pytest.raises(error, match=needle):
        Trie(source, **kwargs)


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="no dictionary file"):
        Trie(tmp_path / "missing.txt")
    (tmp_path / "bad.txt").write_text("1 2\n3 x\n")
    with pytest.raises(ValueError, match="token ids separated by spaces"):
        Trie(tmp_path / "bad.txt")
    (tmp_path / "empty.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        Trie(tmp_path / "empty.txt")


# ------------------------------------------------------------------------------------------------ the engine
def exact_logprob(model: ToyModel, seq: tuple[int, ...]) -> float:
    """The oracle: a sequence's log-probability, summed from the model's plain-Python log-softmax."""
    return sum(log_softmax_ref(model.logits(seq[:i]))[t] for i, t in enumerate(seq))


def toy_dictionary(seed: int, n: int, vocab: int) -> set[tuple[int, ...]]:
    """Entries of 1-3 ids from 1..vocab-1 (some prefixes of others), each ending with the stop token."""
    return {e + (EOS,) for e in random_entries(seed, n, vocab - 1, 3) if EOS not in e} | {
        tuple(t + 1 for t in e) + (EOS,) for e in random_entries(seed + 100, n, vocab - 1, 3)
    }


@pytest.mark.parametrize("seed", range(4))
def test_width_at_least_the_items_gives_the_brute_force_ranking(seed):
    """Width >= the number of entries: the n-best is every entry, ranked by its exact log-probability."""
    model = ToyModel(12, seed=seed)
    entries = {e for e in toy_dictionary(seed, 25, 12) if all(0 < t < 12 for t in e[:-1])}
    trie = Trie(entries)
    want = sorted(entries, key=lambda e: -exact_logprob(model, e))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hyps = beamkit.beam_search(
            model.step, model.init(), BOS, EOS, beam_size=len(entries) + 3, max_len=5, length_penalty=0.0,
            processors=[trie.mask()],
        )  # fmt: skip
    assert [tuple(h.tokens) for h in hyps] == want
    for h in hyps:
        assert h.logprob == pytest.approx(exact_logprob(model, tuple(h.tokens)), abs=1e-9)
    # fewer entries than the width: fewer hypotheses, and a warning says so
    assert any("fewer sequences than the" in str(w.message) for w in caught)


def test_narrow_beams_return_only_entries_and_the_best_matches_brute_force_often():
    """A narrow beam may miss the best entry (search error), but never returns a non-entry; over several
    models the top-1 equals the brute-force best in most cases (beam search is not exact)."""
    hits = 0
    for seed in range(8):
        model = ToyModel(10, seed=seed)
        entries = {e for e in toy_dictionary(seed, 40, 10) if all(0 < t < 10 for t in e[:-1])}
        trie = Trie(entries)
        hyps = beamkit.beam_search(
            model.step, model.init(), BOS, EOS, beam_size=4, max_len=5, length_penalty=0.0, processors=[trie.mask()]
        )
        assert hyps and all(tuple(h.tokens) in entries for h in hyps)
        best = max(entries, key=lambda e: exact_logprob(model, e))
        hits += tuple(hyps[0].tokens) == best
    assert hits >= 6


def test_entries_without_a_stop_token_end_at_max_len():
    """Fixed-length IDs and no stop token: the search runs to max_len = the IDs' length; every output is an
    entry, ranked as brute force ranks them."""
    model = ToyModel(9, seed=5)
    entries = {tuple(e) for e in np.random.default_rng(0).integers(1, 9, (30, 3)).tolist()}
    trie = Trie(entries)
    hyps = beamkit.beam_search(
        model.step, model.init(), BOS, None, beam_size=64, max_len=3, length_penalty=0.0, processors=[trie.mask()]
    )
    assert [tuple(h.tokens) for h in hyps] == sorted(entries, key=lambda e: -exact_logprob(model, e))


def test_a_prefix_entry_may_stop_or_go_on():
    """(1,) and (1, 2) are both entries (no stop token in them): after 1 the search may stop (the stop token is
    allowed at a terminal node) or take 2; after (1, 2) only the stop token."""
    model = ToyModel(5, seed=1)
    trie = Trie([[1], [1, 2]])
    hyps = beamkit.beam_search(
        model.step, model.init(), BOS, EOS, beam_size=4, max_len=4, length_penalty=0.0, processors=[trie.mask()]
    )
    assert sorted(tuple(h.tokens) for h in hyps) == [(1, 0), (1, 2, 0)]


def test_requests_of_different_widths_decoded_together_match_each_alone():
    """The carried trie node follows each row through joins, compaction and parent gathers: a batch of
    requests (different prompts, widths) equals each decoded alone."""
    entries = toy_dictionary(7, 60, 12)
    entries = {e for e in entries if all(0 < t < 12 for t in e[:-1])}
    trie = Trie(entries)
    model = ToyModel(12, seed=2)
    engine = beamkit.Engine(model.step, max_len=5, length_penalty=0.0, processors=[trie.mask()])
    starts = [(), (3,), (7, 1)]
    widths = [1, 6, 30]
    ids = []
    done = {}
    for s, w in zip(starts, widths, strict=True):
        state = np.empty(1, dtype=object)
        state[0] = s
        ids.append(engine.add(state, BOS, EOS, beam_size=w))
        for c in engine.step():  # joining at different steps
            done[c.request_id] = c
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    for rid, s, w in zip(ids, starts, widths, strict=True):
        m2 = ToyModel(12, seed=2)
        state = np.empty(1, dtype=object)
        state[0] = s
        alone = beamkit.beam_search(
            m2.step, state, BOS, EOS, beam_size=w, max_len=5, length_penalty=0.0, processors=[trie.mask()]
        )
        assert [h.tokens for h in done[rid].hypotheses] == [h.tokens for h in alone]
        assert all(tuple(h.tokens) in entries for h in alone)


def test_a_dictionary_past_the_models_vocabulary_is_a_clear_error():
    model = ToyModel(5, seed=0)
    trie = Trie([[1, 7, 0]])
    result = beamkit.BeamSearch(beamkit.SearchOptions(beam_size=2, max_len=3, processors=(trie.mask(),)))
    with pytest.raises(ValueError, match="token id 7 but the model's vocabulary has 5 ids"):
        result.search(model.step, model.init(), BOS, EOS)


def test_trie_table_constrains_each_request_by_its_own_dictionary():
    """Two dictionaries and an unconstrained request in one engine: each as decoded alone."""
    a = Trie([[1, 2, 0], [3, 0], [4, 4, 0]])
    b = Trie([[5, 0], [6, 7, 0], [8, 0], [2, 2, 2, 0]])
    model = ToyModel(10, seed=4)
    table = TrieTable({"a": a, "b": b})
    engine = beamkit.Engine(model.step, max_len=5, length_penalty=0.0, processors=[table])
    rids = []
    for name in ("a", "b", None):
        rid = engine.add(model.init(), BOS, EOS, beam_size=4)
        table.assign(rid, name)
        rids.append(rid)
    with pytest.raises(ValueError, match="no dictionary 'c'"):
        table.assign(99, "c")
    done = {}
    while not engine.idle:
        for c in engine.step():
            done[c.request_id] = c
    for rid, proc in zip(rids, ([a.mask()], [b.mask()], []), strict=True):
        alone = beamkit.beam_search(
            ToyModel(10, seed=4).step, model.init(), BOS, EOS, beam_size=4, max_len=5, length_penalty=0.0,
            processors=proc,
        )  # fmt: skip
        assert [h.tokens for h in done[rid].hypotheses] == [h.tokens for h in alone]


# ------------------------------------------------------------------------------------------------ Hugging Face
V, P = 40, 6


@pytest.fixture(scope="module")
def gpt2():  # only the tests marked needs_hf use it
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=V, n_positions=64)
    cfg.bos_token_id = cfg.eos_token_id = EOS
    return transformers.GPT2LMHeadModel(cfg).eval()


def semantic_ids(n: int, seed: int = 0) -> np.ndarray:
    """``n`` distinct 3-level IDs over codes 1..V-1, each ending with the stop token."""
    rng = np.random.default_rng(seed)
    ids = np.unique(rng.integers(1, V, (3 * n, 3)), axis=0)[:n]
    return np.concatenate([ids, np.zeros((len(ids), 1), np.int64)], axis=1)


def gpt2_logprob(model, prompt: torch.Tensor, seq: np.ndarray) -> float:
    """The oracle: log P(seq | prompt) from one forward over prompt + seq (float64 sums of float32 terms)."""
    full = torch.cat([prompt, torch.as_tensor(seq, dtype=torch.long)])[None]
    with torch.no_grad():
        logp = torch.log_softmax(model(full).logits[0].double(), dim=-1)
    return float(sum(logp[len(prompt) - 1 + i, int(t)] for i, t in enumerate(seq)))


class Counting:
    """Counts calls of PrefixFn.__call__ (the per-row Python path) while active."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = PrefixFn.__call__

        def counted(fn, batch_id, input_ids):
            self.calls += 1
            return original(fn, batch_id, input_ids)

        monkeypatch.setattr(PrefixFn, "__call__", counted)


@needs_hf
def test_hf_generate_matches_model_generate_with_the_same_callable(gpt2, monkeypatch):
    items = semantic_ids(300)
    trie = Trie(items, vocab_size=V)
    fn = trie.prefix_allowed_tokens_fn(prompt_len=P)
    ids = torch.randint(1, V, (3, P), generator=torch.Generator().manual_seed(1))
    kw = dict(
        num_beams=10, num_return_sequences=10, max_new_tokens=5, eos_token_id=EOS, pad_token_id=EOS,
        return_dict_in_generate=True, output_scores=True, attention_mask=torch.ones_like(ids),
    )  # fmt: skip
    counter = Counting(monkeypatch)
    want = gpt2.generate(ids, prefix_allowed_tokens_fn=fn, **kw)
    assert counter.calls > 0  # Hugging Face runs the callable row by row
    counter.calls = 0
    got = engine_generate(gpt2, ids, prefix_allowed_tokens_fn=fn, **kw)
    assert counter.calls == 0  # beamkit applies the trie itself
    entries = {tuple(r) for r in items.tolist()}
    assert got.sequences.shape == want.sequences.shape
    for b in range(3):
        mine = [tuple(r) for r in got.sequences[b * 10 : (b + 1) * 10, P:].tolist()]
        theirs = [tuple(r) for r in want.sequences[b * 10 : (b + 1) * 10, P:].tolist()]
        assert mine[0] == theirs[0]
        assert len(set(mine) & set(theirs)) >= 9
        assert all(m in entries for m in mine)
    torch.testing.assert_close(got.sequences_scores, want.sequences_scores, atol=1e-4, rtol=1e-5)


@needs_hf
def test_hf_generate_width_at_least_the_items_ranks_every_item_exactly(gpt2):
    """20 items, 24 beams: the 20 returned (then Hugging Face's -1e9 placeholders) are every item, ranked by
    the exact log-probability of one forward over prompt + item; the output keeps model.generate's shape."""
    items = semantic_ids(20, seed=3)
    fn = Trie(items).prefix_allowed_tokens_fn(prompt_len=P)
    prompt = torch.randint(1, V, (P,), generator=torch.Generator().manual_seed(2))
    kw = dict(
        num_beams=24, num_return_sequences=24, max_new_tokens=4, eos_token_id=EOS, pad_token_id=EOS,
        length_penalty=0.0, return_dict_in_generate=True, output_scores=True, early_stopping=True,
    )  # fmt: skip
    got = engine_generate(gpt2, prompt[None], prefix_allowed_tokens_fn=fn, **kw)
    want = gpt2.generate(prompt[None], prefix_allowed_tokens_fn=fn, **kw)
    assert got.sequences.shape[0] == want.sequences.shape[0] == 24
    exact = sorted(((gpt2_logprob(gpt2, prompt, it), tuple(it)) for it in items.tolist()), reverse=True)
    mine = [tuple(r) for r in got.sequences[:20, P:].tolist()]
    assert mine == [it for _, it in exact]
    np.testing.assert_allclose(got.sequences_scores[:20].numpy(), [lp for lp, _ in exact], atol=1e-4)
    assert (got.sequences_scores[20:] == -1e9).all()  # Hugging Face's placeholder score for missing rows
    assert torch.equal(got.sequences_scores[20:], want.sequences_scores[20:])  # ... which model.generate gives
    assert (got.sequences[20:, P:] == EOS).all()  # padding, where Hugging Face fills in IDs outside the dictionary
    theirs = [tuple(r) for r in want.sequences[:20, P:].tolist()]
    assert theirs == mine  # Hugging Face ranks the 20 items the same way


@needs_hf
def test_patch_runs_the_callable_vectorised_with_model_generates_exact_output(gpt2, monkeypatch):
    items = semantic_ids(200, seed=5)
    fn = Trie(items).prefix_allowed_tokens_fn(prompt_len=P)
    ids = torch.randint(1, V, (2, P), generator=torch.Generator().manual_seed(3))
    kw = dict(
        num_beams=6, num_return_sequences=3, max_new_tokens=5, eos_token_id=EOS, pad_token_id=EOS,
        return_dict_in_generate=True, output_scores=True, attention_mask=torch.ones_like(ids),
    )  # fmt: skip
    want = gpt2.generate(ids, prefix_allowed_tokens_fn=fn, **kw)
    counter = Counting(monkeypatch)
    with bh.patch(gpt2) as patch:
        got = gpt2.generate(ids, prefix_allowed_tokens_fn=fn, **kw)
        greedy = gpt2.generate(ids, prefix_allowed_tokens_fn=fn, max_new_tokens=5, eos_token_id=EOS, pad_token_id=EOS)
    assert patch.fallbacks == [] and counter.calls == 0
    assert torch.equal(got.sequences, want.sequences)
    assert torch.equal(got.sequences_scores, want.sequences_scores)
    greedy_want = gpt2.generate(ids, prefix_allowed_tokens_fn=fn, max_new_tokens=5, eos_token_id=EOS, pad_token_id=EOS)
    assert torch.equal(greedy, greedy_want)


@needs_hf
def test_a_callable_of_another_prompt_length_or_kind_goes_to_the_loop(gpt2):
    """beamkit.hf.generate takes only a Trie's callable made for the call's prompt length on the engine; a plain
    function or another prompt length runs in the loop, with model.generate's output."""
    items = semantic_ids(50, seed=6)
    trie = Trie(items)
    ids = torch.randint(1, V, (1, P), generator=torch.Generator().manual_seed(4))
    kw = dict(num_beams=4, max_new_tokens=4, eos_token_id=EOS, pad_token_id=EOS)
    plain = trie.prefix_allowed_tokens_fn(prompt_len=P)

    def by_hand(batch_id, input_ids):
        return plain(batch_id, input_ids)

    for fn in (by_hand, trie.prefix_allowed_tokens_fn(prompt_len=P - 1)):
        assert torch.equal(bh.generate(gpt2, ids, prefix_allowed_tokens_fn=fn, **kw),
                           gpt2.generate(ids, prefix_allowed_tokens_fn=fn, **kw))  # fmt: skip


@needs_hf
def test_a_dictionary_past_the_models_vocabulary_is_refused_by_every_route(gpt2):
    """An id the model cannot produce: beamkit.hf.generate refuses before decoding, the patched loop at its
    first step, both naming the id and the vocabulary."""
    fn = Trie([[3, V + 5, EOS]]).prefix_allowed_tokens_fn(prompt_len=P)
    ids = torch.randint(1, V, (1, P), generator=torch.Generator().manual_seed(5))
    kw = dict(num_beams=2, max_new_tokens=3, eos_token_id=EOS, pad_token_id=EOS)
    with pytest.raises(ValueError, match=f"token id {V + 5} but the model's vocabulary has {V} ids"):
        bh.generate(gpt2, ids, prefix_allowed_tokens_fn=fn, **kw)
    with bh.patch(gpt2), pytest.raises(ValueError, match=f"token id {V + 5} but the model's vocabulary has {V} ids"):
        gpt2.generate(ids, prefix_allowed_tokens_fn=fn, **kw)


@needs_hf
def test_prefix_fn_protocol_and_leaves(gpt2):
    """The callable reads the row after the prompt; where an entry ends without a stop token it allows the
    stop token only when given one; a row off the dictionary gets a non-empty answer (Hugging Face raises on
    an empty one)."""
    trie = Trie([[1, 2], [1, 3, 0]])
    fn = trie.prefix_allowed_tokens_fn(prompt_len=2)
    assert fn(0, torch.tensor([9, 9])) == [1]
    assert fn(0, torch.tensor([9, 9, 1])) == [2, 3]
    assert fn(0, torch.tensor([9, 9, 1, 2])) == []
    with_eos = trie.prefix_allowed_tokens_fn(prompt_len=2, eos_token_id=EOS)
    assert with_eos(0, torch.tensor([9, 9, 1, 2])) == [EOS]
    assert with_eos(0, torch.tensor([9, 9, 7])) == [EOS]
    assert fn(0, torch.tensor([9, 9, 7])) == [1]
    with pytest.raises(ValueError, match="prompt_len"):
        trie.prefix_allowed_tokens_fn(prompt_len=-1)


def test_the_engine_carries_each_rows_node_instead_of_walking_its_tokens(monkeypatch):
    """On the engine the node follows the row (gathered by parent): the trie is never walked from the root."""
    model = ToyModel(12, seed=3)
    entries = {e for e in toy_dictionary(3, 30, 12) if all(0 < t < 12 for t in e[:-1])}
    trie = Trie(entries)
    want = beamkit.beam_search(
        model.step, model.init(), BOS, EOS, beam_size=8, max_len=5, length_penalty=0.0, processors=[trie.mask()]
    )

    def no_walk(*args, **kwargs):
        raise AssertionError("walked the prefix")

    monkeypatch.setattr(Trie, "walk", no_walk)
    got = beamkit.beam_search(
        model.step, model.init(), BOS, EOS, beam_size=8, max_len=5, length_penalty=0.0, processors=[trie.mask()]
    )
    assert [h.tokens for h in got] == [h.tokens for h in want]


def test_prefix_allowed_tokens_recognises_a_tries_callable_on_the_engine(monkeypatch):
    """``PrefixAllowedTokens(trie.prefix_allowed_tokens_fn(prompt_len=0))`` gives what the same callable gives
    called row by row (a plain function wrapping it), without calling it; a callable that skips a prompt is
    refused, since the engine's rows hold generated tokens only."""
    entries = {e for e in toy_dictionary(9, 40, 12) if all(0 < t < 12 for t in e[:-1])}
    fn = Trie(entries).prefix_allowed_tokens_fn(prompt_len=0)
    model = ToyModel(12, seed=9)
    opts = dict(beam_size=6, max_len=5, length_penalty=0.0)
    by_row = beamkit.beam_search(
        model.step, model.init(), BOS, EOS, processors=[beamkit.PrefixAllowedTokens(lambda b, ids: fn(b, ids))], **opts
    )
    calls = []
    monkeypatch.setattr(PrefixFn, "__call__", lambda *a: calls.append(a))
    got = beamkit.beam_search(model.step, model.init(), BOS, EOS, processors=[beamkit.PrefixAllowedTokens(fn)], **opts)
    assert [h.tokens for h in got] == [h.tokens for h in by_row] and not calls
    skipping = Trie(entries).prefix_allowed_tokens_fn(prompt_len=3)
    with pytest.raises(ValueError, match="prompt_len=0"):
        beamkit.BeamSearch(beamkit.SearchOptions(processors=(beamkit.PrefixAllowedTokens(skipping),), **opts)).search(
            model.step, model.init(), BOS, EOS
        )


@pytest.mark.parametrize("among", [None, np.array([0, 2])])
def test_keep_pairs_keeps_exactly_the_pairs_in_numpy_and_torch(among, device):
    """The mask's one scatter: in the rows ``among`` (all by default) every entry but the pairs is -inf; a row
    with no pair is all -inf; other rows are untouched. The oracle is a loop over entries."""
    from beamkit import ops

    x = np.random.default_rng(0).normal(size=(4, 6))
    rows, cols = np.array([0, 0, 2]), np.array([1, 4, 5])
    want = x.copy()
    for r in range(4) if among is None else among:
        for c in range(6):
            if (r, c) not in set(zip(rows.tolist(), cols.tolist(), strict=True)):
                want[r, c] = -np.inf
    np.testing.assert_array_equal(ops.keep_pairs(x.copy(), rows, cols, among), want)
    if torch is not None:
        got = ops.keep_pairs(torch.tensor(x, device=device), rows, cols, among).cpu().numpy()
        np.testing.assert_array_equal(got, want)
