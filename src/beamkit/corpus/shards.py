"""Resumable sharded output: ``OUT.parts/`` holds a manifest and one JSONL file per finished shard.

Every file is written to a temporary name and renamed into place, so a reader (or a rerun) sees a shard either
complete or not at all. The manifest names the run (the SHA-256 of the input, the model's files and the LM, and
the decoding options) and each finished shard's SHA-256; a rerun of the same command keeps the shards that still
verify and decodes the rest; a different run (or a manifest of another format) is refused. The folder and the
manifest are created when the first shard is written, so a run that fails before that leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from beamkit.strictjson import finite

FORMAT = "beamkit-corpus/2"
CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """SHA-256 of a file's bytes, read in chunks."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        for block in iter(lambda: fh.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def path_sha256(path: str | Path, pattern: str = "**/*") -> str:
    """SHA-256 of a file, or of the files of a folder that match ``pattern`` (default: every file below it),
    each by relative path and contents."""
    src = Path(path)
    if not src.is_dir():
        return file_sha256(src)
    digest = hashlib.sha256()
    for p in sorted(q for q in src.glob(pattern) if q.is_file()):
        digest.update(f"{p.relative_to(src).as_posix()}\0{file_sha256(p)}\n".encode())
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def encode_records(records: list[dict[str, Any]]) -> bytes:
    """JSON lines (UTF-8, one object per line, newline-terminated), strict JSON: a record holding a number that
    is not finite (``Infinity`` and ``NaN`` are not JSON) keeps its texts, its non-finite numbers become
    ``null`` and its ``error`` says why."""
    return "".join(_json_record(r) + "\n" for r in records).encode("utf-8")


def _json_record(record: dict[str, Any]) -> str:
    try:
        return json.dumps(record, ensure_ascii=False, allow_nan=False)
    except ValueError:
        pass
    why = "a score is not a finite number (infinite or NaN), written as null: lower the weights, or check the input"
    fixed = finite(record) | {"error": record.get("error") or why}
    return json.dumps(fixed, ensure_ascii=False, allow_nan=False)


@dataclass(frozen=True)
class ShardPlan:
    """The shards of a run: ``count`` inputs split into runs of ``size`` consecutive inputs."""

    count: int
    size: int

    @property
    def shards(self) -> int:
        """Number of shards."""
        return -(-self.count // self.size)

    def span(self, shard: int) -> range:
        """Input positions of shard ``shard``."""
        return range(shard * self.size, min(self.count, (shard + 1) * self.size))


class ShardStore:
    """The ``OUT.parts`` folder of a run: its manifest, finished shards and the final concatenation."""

    def __init__(self, output: str | Path, plan: ShardPlan, run: dict[str, Any]) -> None:
        """Open (or start) the store next to ``output`` for the run described by ``run`` (JSON-able)."""
        self.output = Path(output)
        self.folder = self.output.with_name(self.output.name + ".parts")
        self.plan = plan
        self.run = {"format": FORMAT, **run, "inputs": plan.count, "shard_size": plan.size}
        self.manifest_path = self.folder / "manifest.json"
        self.checksums: dict[int, str] = {}

    def shard_path(self, shard: int) -> Path:
        """Where shard ``shard`` lives once finished."""
        return self.folder / f"shard-{shard:05d}.jsonl"

    def open(self) -> list[int]:
        """Check an existing manifest is this run's; return the finished shards that still verify.

        Nothing is created here (the first finished shard creates the folder and the manifest). Shards the
        manifest does not list, or whose SHA-256 differs from the one it records, are not finished. Temporary
        files a killed run left behind (never visible as shards) are removed."""
        if not self.manifest_path.exists():
            self._remove_leftovers()
            return []
        try:
            old = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            run, files = old["run"], old["files"]
            fmt = run.get("format")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{self.manifest_path} is unreadable ({exc}); delete {self.folder}") from exc
        if fmt != FORMAT:
            raise ValueError(
                f"{self.folder} was written by another version of beamkit (manifest format {fmt!r}, this one "
                f"writes {FORMAT!r}); delete it or choose another --output"
            )
        if run != self.run:
            raise ValueError(
                f"{self.folder} holds shards of a different run (input, model, LM or options changed); delete it "
                "or choose another --output"
            )
        self._remove_leftovers()
        for shard in range(self.plan.shards):
            entry = files.get(str(shard)) if isinstance(files, dict) else None
            path = self.shard_path(shard)
            if isinstance(entry, dict) and path.is_file() and file_sha256(path) == entry.get("sha256"):
                self.checksums[shard] = entry["sha256"]
        return sorted(self.checksums)

    def _remove_leftovers(self) -> None:
        stale = [*self.folder.glob(".*.tmp"), *self.output.parent.glob(f".{self.output.name}.*.tmp")]
        for leftover in stale:
            leftover.unlink(missing_ok=True)

    def _write_manifest(self) -> None:
        body = {
            "run": self.run,
            "shards": self.plan.shards,
            "done": sorted(self.checksums),
            "files": {
                str(s): {"name": self.shard_path(s).name, "sha256": self.checksums[s]} for s in sorted(self.checksums)
            },
        }
        write_atomic(self.manifest_path, (json.dumps(body, indent=1) + "\n").encode("utf-8"))

    def finish_shard(self, shard: int, records: list[dict[str, Any]]) -> None:
        """Write shard ``shard`` (its records in input order) and record it and its SHA-256 in the manifest."""
        if len(records) != len(self.plan.span(shard)):
            raise RuntimeError(f"shard {shard}: {len(records)} records for {len(self.plan.span(shard))} inputs")
        data = encode_records(records)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.checksums[shard] = hashlib.sha256(data).hexdigest()
        self._write_manifest()  # first: a shard visible in the folder is always one the manifest lists
        write_atomic(self.shard_path(shard), data)

    def assemble(self) -> str:
        """Concatenate the shards into the output file (temporary name, then rename); return its SHA-256."""
        digest = hashlib.sha256()
        self.output.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.output.with_name(f".{self.output.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as out:
            for shard in range(self.plan.shards):
                data = self.shard_path(shard).read_bytes()
                digest.update(data)
                out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, self.output)
        return digest.hexdigest()
