"""beamkit.serve.malloc: the idle trim of a server's C heap."""

from __future__ import annotations

import asyncio
import platform
import sys

import pytest

import beamkit.serve.malloc as malloc

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def rss_anon() -> int:
    """Anonymous resident bytes of this process."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not GLIBC, reason="malloc_trim is glibc's")
def test_trim_returns_freed_heap_memory_to_the_system():
    # 2000 blocks of 100 kB (below glibc's mmap threshold: carved from the heap), all freed but the last one,
    # which keeps the heap's top in use, so glibc cannot shrink the heap by itself: ~200 MB stay resident
    blocks = [bytes(100_000) for _ in range(2000)]
    last = blocks[-1]
    del blocks
    held = rss_anon()
    assert malloc.trim()
    released = held - rss_anon()
    assert released > 100e6, f"malloc_trim released {released / 1e6:.0f} MB of ~200 MB freed"
    assert len(last) == 100_000


def test_idle_trim_waits_for_the_engine_to_stay_idle(monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(malloc, "trim", lambda: calls.append(1) or True)
    idle = [False]

    async def run() -> int:
        t = malloc.IdleTrim(lambda: idle[0], delay=0.05)
        t.poke()
        await asyncio.sleep(0.15)  # the timer fired while busy: no trim
        idle[0] = True
        t.poke()
        await asyncio.sleep(0.01)
        t.poke()  # re-armed: still one timer
        await asyncio.sleep(0.15)
        return t.trims

    assert asyncio.run(run()) == 1
    assert calls == [1]  # asyncio.run waits for the default executor, where trim ran
