"""What a ``beamkit.Trie`` reads: saved tries (``Trie.load``), dictionary files, lists with ``pad=``, lookups.

Oracles: a saved trie altered by hand (each alteration breaks one rule of the layout the :class:`beamkit.Trie`
docstring states, checked here against the arrays themselves); the same entries given another way (an array with
``pad``, the entries without their padding); Python's own integers (an id beyond int64 is named as it was
written). Every error must name the file it read, and never suggest unpickling.
"""

from __future__ import annotations

import numpy as np
import pytest

from beamkit import Trie
from beamkit.cli import main
from beamkit.cli.serve import load_tries

ENTRIES = [[3, 4, 1], [3, 5, 1], [6, 1], [6, 2, 2, 1], [7, 1]]


def saved(tmp_path, **change):
    """A trie of ENTRIES saved to an .npz, with the arrays in ``change`` put in place of its own."""
    trie = Trie(ENTRIES, vocab_size=10)
    arrays = {
        "indptr": trie.indptr,
        "labels": trie.labels,
        "terminal": trie.terminal,
        "count": np.int64(trie.count),
        "depth": np.int64(trie.depth),
        "vocab_size": np.int64(10),
    }
    arrays.update(change)
    path = tmp_path / "t.npz"
    np.savez(path, **{k: v for k, v in arrays.items() if v is not None})
    return path


def test_the_unaltered_trie_loads_and_answers_as_built(tmp_path):
    back = Trie.load(saved(tmp_path))
    for prefix, want in (([], [3, 6, 7]), ([3], [4, 5]), ([6], [1, 2]), ([6, 2], [2]), ([9], [])):
        assert back.allowed(prefix) == want
    assert all(e in back for e in ENTRIES) and [3, 4] not in back


def tampered() -> list[tuple[str, dict]]:
    """(what is wrong, the arrays that replace the saved ones)."""
    t = Trie(ENTRIES, vocab_size=10)
    ptr, lab, term = t.indptr.copy(), t.labels.copy(), t.terminal.copy()
    # the layout (checked here, not by the code under test): 13 nodes; root's children are nodes 1..3 (3, 6, 7)
    assert ptr.tolist()[:2] == [0, 3] and lab[:3].tolist() == [3, 6, 7] and term.size == 13
    swapped = ptr.copy()
    swapped[1], swapped[2] = swapped[2], swapped[1]
    beyond = ptr.copy()
    beyond[-1] += 5
    shifted = ptr.copy()
    shifted[0] = 1
    unsorted = lab.copy()
    unsorted[0], unsorted[1] = unsorted[1], unsorted[0]
    twice = lab.copy()
    twice[1] = twice[0]
    negative = lab.copy()
    negative[2] = -4
    huge = lab.copy()
    huge[2] = 12  # past the saved vocab_size of 10
    root_ends = term.copy()
    root_ends[0] = True
    leaf_open = term.copy()
    leaf_open[np.flatnonzero(term)[-1]] = False
    cycle = np.zeros_like(ptr)  # node 0 has no children, node 1 holds all others: node 1 is no child of anyone
    cycle[2:] = ptr[-1]
    return [
        ("indptr not ascending", {"indptr": swapped}),
        ("indptr past the labels", {"indptr": beyond}),
        ("indptr not from 0", {"indptr": shifted}),
        ("labels unsorted", {"labels": unsorted}),
        ("labels repeated", {"labels": twice}),
        ("label negative", {"labels": negative}),
        ("label past vocab_size", {"labels": huge}),
        ("labels of floats", {"labels": lab.astype(np.float64)}),
        ("labels 2-d", {"labels": lab.reshape(1, -1)}),
        ("root ends an entry", {"terminal": root_ends}),
        ("a leaf ends nothing", {"terminal": leaf_open}),
        ("terminal of ints", {"terminal": term.astype(np.int64) * 7}),
        ("count negative", {"count": np.int64(-3)}),
        ("count wrong", {"count": np.int64(t.count + 1)}),
        ("count an array", {"count": np.array([t.count, 1])}),
        ("depth wrong", {"depth": np.int64(t.depth + 2)}),
        ("vocab_size zero", {"vocab_size": np.int64(0)}),
        ("not one tree", {"indptr": cycle}),
        ("sizes apart", {"terminal": term[:-1]}),
    ]


@pytest.mark.parametrize(("what", "change"), tampered(), ids=[w for w, _ in tampered()])
def test_a_tampered_saved_trie_is_refused_naming_the_file(tmp_path, what, change):
    path = saved(tmp_path, **change)
    with pytest.raises(ValueError) as err:
        Trie.load(path)
    message = str(err.value)
    assert str(path) in message and "\n" not in message, message
    assert "pickle" not in message


def test_a_file_that_is_no_saved_trie_is_refused_without_suggesting_unpickling(tmp_path):
    text = tmp_path / "text.npz"
    text.write_text("3 4 1\n6 1\n")
    npy = tmp_path / "array.npz"
    np.save(tmp_path / "a.npy", np.array([[3, 4, 1]]))
    npy.write_bytes((tmp_path / "a.npy").read_bytes())
    cut = tmp_path / "cut.npz"
    cut.write_bytes(saved(tmp_path).read_bytes()[:120])
    objects = tmp_path / "objects.npz"
    np.savez(objects, indptr=np.array([0, 1], dtype=object), labels=np.zeros(1), terminal=np.ones(2, bool),
             count=np.int64(1), depth=np.int64(1))  # fmt: skip
    for path in (text, npy, cut, objects, tmp_path / "missing.npz", tmp_path):
        with pytest.raises(ValueError) as err:
            Trie.load(path)
        message = str(err.value)
        assert str(path) in message and "pickle" not in message.lower() and "\n" not in message, message


def binary_files(tmp_path) -> dict[str, object]:
    """Dictionary files that are not dictionaries: each must be refused naming the file."""
    files = {}
    for name, data in (
        ("binary.txt", bytes(range(256)) * 4),
        ("utf16.txt", "3 4 1\n6 1\n".encode("utf-16")),
        ("zip.txt", saved(tmp_path).read_bytes()),
        ("floats.txt", b"3 4.5 1\n"),
        ("nul.txt", b"3 4\x00 1\n"),
        ("huge.txt", b"3 99999999999999999999999 1\n"),
        ("text.npy", b"3 4 1\n"),
    ):
        path = tmp_path / name
        path.write_bytes(data)
        files[name] = path
    np.save(tmp_path / "floats.npy", np.array([[3.0, 4.0, 1.0]]))
    np.save(tmp_path / "objects.npy", np.array([[3, 4, 1]], dtype=object), allow_pickle=True)
    np.save(tmp_path / "ragged3d.npy", np.zeros((2, 2, 2), np.int64))
    for name in ("floats.npy", "objects.npy", "ragged3d.npy"):
        files[name] = tmp_path / name
    return files


def test_a_dictionary_file_that_is_not_one_is_refused_naming_the_file(tmp_path):
    for name, path in binary_files(tmp_path).items():
        with pytest.raises((ValueError, TypeError)) as err:
            Trie(path)
        message = str(err.value)
        assert type(err.value) in (ValueError, TypeError), (name, err.value)
        assert str(path) in message and "pickle" not in message.lower() and "\n" not in message, (name, message)


def test_serve_names_the_option_and_the_file_for_every_bad_dictionary(tmp_path, capsys):
    labels = Trie(ENTRIES).labels.copy()
    labels[[0, 1]] = labels[[1, 0]]  # two children of the root swapped: unsorted
    files = {**binary_files(tmp_path), "tampered.npz": saved(tmp_path, labels=labels)}
    for name, path in files.items():
        with pytest.raises(ValueError) as err:
            load_tries([("d", str(path))])
        assert str(err.value).startswith(f"--trie d={path}: ") and "\n" not in str(err.value), (name, err.value)
        assert main(["serve", "--trie", f"d={path}"]) == 2
        line = capsys.readouterr().err.strip()
        assert "\n" not in line and line.startswith("beamkit serve: error: --trie d=") and str(path) in line, line


# ------------------------------------------------------------------------------------------------ lists, ids
def test_pad_is_honoured_for_lists_as_for_arrays():
    rect = [[3, 4, 1, 0], [6, 1, 0, 0], [7, 2, 2, 1]]
    want = Trie(np.array(rect), pad=0)
    for source in (rect, [tuple(r) for r in rect], [[3, 4, 1, 0], [6, 1], [7, 2, 2, 1]]):
        got = Trie(source, pad=0)
        for name in ("indptr", "labels", "terminal"):
            assert np.array_equal(getattr(got, name), getattr(want, name))
        assert [6, 1] in got and [6, 1, 0] not in got
    with pytest.raises(ValueError, match="before a token id"):
        Trie([[3, 0, 1], [6]], pad=0)
    with pytest.raises(ValueError, match="before a token id"):
        Trie([[3, 0, 1], [6, 2, 2]], pad=0)


@pytest.mark.parametrize("prefix", [[1.9], [3.0], [True], "36", [3, 4.0], [[3]], 3])
def test_lookups_refuse_what_construction_refuses(prefix):
    trie = Trie(ENTRIES)
    with pytest.raises(TypeError):
        Trie([prefix])
    with pytest.raises(TypeError):
        trie.allowed(prefix)
    with pytest.raises(TypeError):
        _ = prefix in trie


def test_lookups_answer_for_integers_of_every_kind():
    trie = Trie(ENTRIES)
    assert trie.allowed(np.array([3], np.uint8)) == [4, 5] == trie.allowed((np.int64(3),))
    assert trie.allowed([2**70]) == [] and [2**70] not in trie  # beyond int64: in no dictionary
    assert trie.allowed([6], eos=9) == [1, 2]  # (6,) is no entry: no stop token
    with pytest.raises(TypeError):
        trie.allowed([6, 2, 2, 1], eos=1.5)


@pytest.mark.parametrize("big", [2**63, 2**64 - 1, 2**70, -(2**70)])
def test_ids_beyond_int64_are_named_as_written(big):
    for source in ([[3, big]], [[3], [big, 4]]):
        with pytest.raises(ValueError) as err:
            Trie(source)
        assert str(big) in str(err.value) and "float64" not in str(err.value) and "object" not in str(err.value)
    with pytest.raises(ValueError, match=str(2**64 - 1)):
        Trie(np.array([[3, 2**64 - 1]], dtype=np.uint64))


def test_nested_sequences_are_refused_not_flattened():
    with pytest.raises(TypeError, match="one sequence of ids per row"):
        Trie([[[3, 4]], [[6, 1]]])
    with pytest.raises(TypeError):
        Trie([[[3, 4]], [[6, 1, 2]]])
    with pytest.raises(TypeError):
        Trie([[3, [4, 5]], [6]])


def test_what_is_no_path_or_no_trie_is_a_type_error_naming_it():
    from beamkit.constraints import TrieTable

    for bad in (123, None, [1, 2], b"t.npz"):
        with pytest.raises(TypeError, match="Trie.load takes the path"):
            Trie.load(bad)
    for tries in ({"a": [[1, 2]]}, [Trie(ENTRIES)], {"a": Trie(ENTRIES), "b": "file.txt"}):
        with pytest.raises(TypeError, match="TrieTable takes a dict of beamkit.Trie"):
            TrieTable(tries)
