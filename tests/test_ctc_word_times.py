"""Word start and end frames (``word_frames``) for subword vocabularies: BPE pieces (``▁`` starts a word) and
word pieces (``##`` continues one), against alignments worked out by hand and against the frames read off
the label path that built the posteriors."""

from __future__ import annotations

import numpy as np
import pytest

from beamkit.ctc import CTCOptions, Decoder

PEAK = 0.999  # the path's label carries almost all the mass: the best alignment is the path itself


def peaked(labels: list[str], path: list[str]) -> np.ndarray:
    """``(T, V)`` log-probabilities whose most probable alignment is ``path`` (one label per frame)."""
    V = len(labels)
    m = np.full((len(path), V), (1 - PEAK) / (V - 1))  # shape: (T, V)
    for t, lab in enumerate(path):
        m[t, labels.index(lab)] = PEAK
    return np.log(m)


def frames_of(labels: list[str], path: list[str], blank: int = 0) -> list[tuple[str, tuple[int, int]]]:
    """Decode one path with beam 8 and return the best hypothesis's word frames."""
    dec = Decoder(labels, None, CTCOptions(beam_width=8), blank=blank)
    (best, *_) = dec.decode([peaked(labels, path)])[0]
    return best.word_frames


BPE = ["<blank>", "▁the", "▁c", "at", "▁", "s", "▁sat", "▁a"]
PIECES = ["[PAD]", "the", "c", "##at", "s", "##a", "##t", "a"]


def test_bpe_words_start_at_their_first_piece() -> None:
    path = ["▁the", "▁the", "<blank>", "▁c", "at", "<blank>", "▁sat", "▁sat", "<blank>", "<blank>"]
    assert frames_of(BPE, path) == [("the", (0, 2)), ("cat", (3, 5)), ("sat", (6, 8))]


def test_a_lone_word_marker_is_not_part_of_the_word() -> None:
    # "▁" then "s" "at": the word "sat" starts with its first letter (frame 7), as a word after a space does
    path = ["<blank>", "▁the", "<blank>", "▁c", "<blank>", "at", "at", "▁", "▁", "s", "at", "▁", "<blank>"]
    assert frames_of(BPE, path) == [("the", (1, 2)), ("cat", (3, 7)), ("sat", (9, 11))]


def test_one_piece_words_keep_their_start() -> None:
    # pyctcdecode's BPE word starts go missing or late when a word is one repeated piece; here every word
    # has its own start: "the" (frames 1-2), "the" again after a blank (frame 4), "a" (5), "sat" (6-7)
    path = ["<blank>", "▁the", "▁the", "<blank>", "▁the", "▁a", "▁sat", "▁sat", "<blank>"]
    got = frames_of(BPE, path)
    assert got == [("the", (1, 3)), ("the", (4, 5)), ("a", (5, 6)), ("sat", (6, 8))]
    assert all(start >= 0 and end > start for _, (start, end) in got)


def test_an_utterance_may_open_with_a_continuation_piece() -> None:
    path = ["<blank>", "at", "at", "<blank>", "▁the", "<blank>"]
    assert frames_of(BPE, path) == [("at", (1, 3)), ("the", (4, 5))]


def test_word_pieces_continue_with_hashes() -> None:
    path = ["[PAD]", "the", "the", "[PAD]", "c", "##at", "[PAD]", "s", "##a", "[PAD]", "##t", "a", "[PAD]"]
    assert frames_of(PIECES, path) == [("the", (1, 3)), ("cat", (4, 6)), ("sat", (7, 11)), ("a", (11, 12))]


WORDS = {"the": ["▁the"], "cat": ["▁c", "at"], "sat": ["▁sat"], "a": ["▁a"], "sats": ["▁sat", "s"]}


def random_path(rng: np.random.Generator) -> tuple[list[str], list[tuple[str, tuple[int, int]]]]:
    """A label path over :data:`BPE` spelling random words, with the frames of each word read off the path:
    from the first frame of the word's first piece to one past the last frame of its last piece. A word is
    opened by its ``▁`` piece or by a lone ``▁`` and then a bare piece ("s" "at" spells "sat")."""
    path: list[str] = ["<blank>"] * int(rng.integers(0, 3))
    want: list[tuple[str, tuple[int, int]]] = []
    for _ in range(int(rng.integers(1, 6))):
        word = str(rng.choice(list(WORDS)))
        pieces = list(WORDS[word])
        if word == "sat" and rng.random() < 0.5:
            path += ["▁"] * int(rng.integers(1, 3))
            pieces = ["s", "at"]
        start = -1
        for piece in pieces:
            if path and path[-1] == piece:
                path.append("<blank>")  # a repeat needs a blank in between
            if start < 0:
                start = len(path)
            path += [piece] * int(rng.integers(1, 3))
            end = len(path)
            path += ["<blank>"] * int(rng.integers(0, 2))
        want.append((word, (start, end)))
    return path + ["<blank>"], want


@pytest.mark.parametrize("seed", range(3))
def test_word_frames_follow_random_piece_paths(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cases = [random_path(rng) for _ in range(20)]
    dec = Decoder(BPE, None, CTCOptions(beam_width=8))
    got = dec.decode([peaked(BPE, path) for path, _ in cases])
    for (path, want), hyps in zip(cases, got, strict=True):
        assert hyps[0].word_frames == want, path
