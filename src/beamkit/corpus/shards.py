"""Resumable sharded output: ``OUT.parts/`` holds a manifest and one JSONL file per finished shard.

Every file is written to a temporary name and renamed into place, so a reader (or a rerun) sees a shard either
complete or not at all. The manifest names the run (input digest and decoding options); a rerun of the same
command keeps the finished shards and decodes the rest; a different input or option is refused.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FORMAT = "beamkit-corpus/1"


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def encode_records(records: list[dict[str, Any]]) -> bytes:
    """JSON lines (UTF-8, one object per line, newline-terminated)."""
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


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

    def shard_path(self, shard: int) -> Path:
        """Where shard ``shard`` lives once finished."""
        return self.folder / f"shard-{shard:05d}.jsonl"

    def open(self) -> list[int]:
        """Create the folder and manifest, or check an existing one is this run; return the finished shards.

        Temporary files a killed run left behind (never visible as shards) are removed."""
        self.folder.mkdir(parents=True, exist_ok=True)
        stale = [*self.folder.glob(".*.tmp"), *self.output.parent.glob(f".{self.output.name}.*.tmp")]
        for leftover in stale:
            leftover.unlink(missing_ok=True)
        if self.manifest_path.exists():
            try:
                old = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise ValueError(f"{self.manifest_path} is unreadable ({exc}); delete {self.folder}") from exc
            if old.get("run") != self.run:
                raise ValueError(
                    f"{self.folder} holds shards of a different run (input or options changed); delete it or "
                    "choose another --output"
                )
        done = [s for s in range(self.plan.shards) if self._complete(s)]
        self._write_manifest(done)
        return done

    def _complete(self, shard: int) -> bool:
        path = self.shard_path(shard)
        if not path.is_file():
            return False
        return path.read_bytes().count(b"\n") == len(self.plan.span(shard))

    def _write_manifest(self, done: list[int]) -> None:
        body = {
            "run": self.run,
            "shards": self.plan.shards,
            "done": sorted(done),
            "files": {s: self.shard_path(s).name for s in sorted(done)},
        }
        write_atomic(self.manifest_path, (json.dumps(body, indent=1) + "\n").encode("utf-8"))

    def finish_shard(self, shard: int, records: list[dict[str, Any]], done: list[int]) -> None:
        """Write shard ``shard`` (its records in input order) and record it, with ``done``, in the manifest."""
        if len(records) != len(self.plan.span(shard)):
            raise RuntimeError(f"shard {shard}: {len(records)} records for {len(self.plan.span(shard))} inputs")
        write_atomic(self.shard_path(shard), encode_records(records))
        self._write_manifest([*done, shard])

    def assemble(self) -> str:
        """Concatenate the shards into the output file (temporary name, then rename); return its SHA-256."""
        digest = hashlib.sha256()
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
