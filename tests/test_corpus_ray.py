"""The Ray back-end on a local Ray instance started here: the same output as the local back-end, a worker actor
killed mid-run is restarted and the output is still complete, and the ``decode_dataset`` pipeline API.

One Ray instance serves the module; after ``ray.shutdown()`` no process it started may be left running.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from beamkit.cli import main
from beamkit.corpus import DecodeOptions, decode_corpus, decode_dataset

ray = pytest.importorskip("ray")
pytest.importorskip("ray.data")
pytest.importorskip("torch")

from tests.test_corpus import LABELS, write_posteriors  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _descendants(root: int) -> dict[int, str]:
    """Processes below ``root`` (pid -> command line), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    found: dict[int, str] = {}
    todo = [root]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                try:
                    found[child] = (Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ")).decode()
                except OSError:
                    found[child] = ""
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
    yield
    started = {p: cmd for p, cmd in _descendants(os.getpid()).items() if "ray" in cmd}
    ray.shutdown()
    deadline = time.monotonic() + 90  # a loaded machine can take Ray's workers well over 30 s to exit
    while any(_alive(p) for p in started) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {p: cmd for p, cmd in started.items() if _alive(p)}
    for pid in left:  # do not leave them behind even when failing
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert not left, f"Ray processes still running after ray.shutdown(): {left}"


def _actors() -> set[int]:
    return {p for p, cmd in _descendants(os.getpid()).items() if "MapBatches(BatchDecoder)" in cmd}


def test_ray_run_with_a_killed_actor_equals_the_local_output(tmp_path, local_ray):
    """``beamkit decode --ray`` on the running instance; one actor is killed mid-run (Ray restarts it and retries
    its batch); the file is byte-identical to the local back-end's, bad lines included."""
    from beamkit.tasks.dates import split

    sources = [s for s, _ in split("test", limit=600)]
    sources[3], sources[77] = "", "3 M\u00e4rz 1999"
    src = tmp_path / "in.txt"
    src.write_text("\n".join(sources) + "\n", encoding="utf-8")
    parts = tmp_path / "ray.jsonl.parts"
    common = ["decode", "--quiet", "--input", str(src), "--beam", "3", "--batch-size", "5", "--shard-size", "20"]
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(main([*common, "--output", str(tmp_path / "ray.jsonl"),
                                                                  "--workers", "2", "--ray"])))  # fmt: skip
    thread.start()
    deadline = time.monotonic() + 120
    while not list(parts.glob("shard-*.jsonl")) and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    actors = _actors()
    assert thread.is_alive() and actors, "no running actor to kill"
    victim = min(actors)
    os.kill(victim, signal.SIGKILL)
    assert len(list(parts.glob("shard-*.jsonl"))) < 30, "the run was not interrupted mid-way"
    seen: set[int] = set()
    while thread.is_alive():
        seen |= _actors()
        thread.join(timeout=0.2)
    assert codes == [0]
    assert seen - actors, "no actor was started after the kill"
    assert not _alive(victim)
    assert ray.is_initialized()  # the command used the running instance and left it up
    assert main([*common, "--output", str(tmp_path / "local.jsonl")]) == 0
    local = (tmp_path / "local.jsonl").read_bytes()
    assert (tmp_path / "ray.jsonl").read_bytes() == local  # every input once, in order, same results
    records = [json.loads(line) for line in local.splitlines()]
    assert [i for i, r in enumerate(records) if r["error"]] == [3, 77]


def test_decode_dataset_pipeline_matches_local(tmp_path, local_ray):
    names = write_posteriors(tmp_path / "post")
    ref = tmp_path / "local.jsonl"
    options = DecodeOptions(labels=tuple(LABELS), beam=8, n_best=2)
    decode_corpus(tmp_path / "post", ref, options, batch_size=2)
    expected = {r["id"]: r for r in map(json.loads, ref.read_text().splitlines())}
    rows = [{"id": n, "path": str(tmp_path / "post" / f"{n}.npy")} for n in [*names, "u5", "u6"]]
    ds = decode_dataset(
        ray.data.from_items(rows, override_num_blocks=2), labels=LABELS, beam=8, n_best=2, concurrency=2, batch_size=2
    )
    got = {row["id"]: row for row in ds.take_all()}
    assert set(got) == set(expected)
    for key, row in got.items():
        want = expected[key]
        assert (row["error"] or None) == want["error"]
        assert json.loads(row["n_best"]) == want["n_best"]  # CTC results do not depend on the batch
        if want["n_best"]:
            assert row["text"] == want["n_best"][0]["text"]
            assert row["score"] == want["n_best"][0]["score"]
