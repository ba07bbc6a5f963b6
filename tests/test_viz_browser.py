"""The search tree page in a real browser: headless Chromium over the DevTools protocol (127.0.0.1 only).

The page must load from a file with no request beyond it (offline), log no console error or exception, draw one
node per trace node, fold the pruned branches on its checkbox and show a node's numbers on hover; a screenshot
is taken and must not be blank. Chromium is Debian's ``chromium`` (``.ci/run`` installs it); without it the test
skips, except in CI (``CI`` or ``BEAMKIT_CI`` set), where it fails.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import queue
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from beamkit.demo import NAMES
from beamkit.search import traced_search
from beamkit.trace import Trace
from beamkit.viz import to_html
from tests.toy import BOS, ToyModel

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--remote-debugging-address=127.0.0.1",
    "--remote-debugging-port=0",
]


def _need(what: str, how: str) -> None:
    """Skip for want of ``what`` on a workstation; fail in CI, where it must be there."""
    if os.environ.get("CI") or os.environ.get("BEAMKIT_CI"):
        pytest.fail(f"{what} is missing in CI: {how}")
    pytest.skip(f"{what} is not installed ({how}); this test is required in CI")


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        _need("chromium", "apt-get install -y chromium fonts-dejavu-core, as .ci/run does")
    try:
        import websocket  # noqa: F401
    except ImportError:
        _need("websocket-client", "pip install -e '.[dev]'")
    assert path is not None
    return path


class DevTools:
    """A minimal DevTools client on one page session: commands by id, events kept in order."""

    def __init__(self, url: str):
        import websocket

        self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict] = []
        self.session: str | None = None

    def send(self, method: str, **params) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params}
        if self.session is not None:
            msg["sessionId"] = self.session
        self.ws.send(json.dumps(msg))
        while True:
            reply = json.loads(self.ws.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, seconds: float = 30) -> dict:
        end = time.monotonic() + seconds
        seen = 0
        while time.monotonic() < end:
            for ev in self.events[seen:]:
                if ev.get("method") == method:
                    return ev
            seen = len(self.events)
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(method)

    def evaluate(self, expression: str):
        got = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in got:
            raise AssertionError(f"{expression}: {got['exceptionDetails']}")
        return got["result"].get("value")


def _launch(binary: str, profile: Path) -> tuple[subprocess.Popen, str]:
    """Start Chromium; return the process and its browser DevTools websocket address (from stderr)."""
    proc = subprocess.Popen(
        [binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            line = lines.get(timeout=1)
        except queue.Empty:
            if proc.poll() is not None:
                break
            continue
        found = re.search(r"DevTools listening on (ws://127\.0\.0\.1:\d+/\S+)", line)
        if found:
            return proc, found.group(1)
    proc.kill()
    proc.wait()
    raise RuntimeError("chromium did not report its DevTools address")


def _trace() -> Trace:
    """The dates example of the README when the shipped model loads, else a toy search (pool policy, evictions)."""
    try:
        from beamkit.explain import explain_dates

        return explain_dates("3rd of March 1999", beam_size=5)
    except ImportError:
        model = ToyModel(5, seed=4, scale=2.0, eos_bias=1.0)
        _, traces = traced_search(model.step, model.init(), BOS, 0, 3, 6, policy="pool")
        return traces[0].with_vocab([NAMES.get(i, str(i)) for i in range(5)])


@contextlib.contextmanager
def open_page(tmp_path: Path, html: str) -> Iterator[tuple[DevTools, Path]]:
    """Write ``html`` to a file and load it in a fresh headless Chromium (1400x900): the DevTools session on the
    loaded page and the page's path. Chromium is ended by its PID on the way out."""
    binary = _chromium()
    page = tmp_path / "page.html"
    page.write_text(html, encoding="utf-8")
    proc, address = _launch(binary, tmp_path / "profile")
    try:
        dt = DevTools(address)
        target = dt.send("Target.createTarget", url="about:blank")["targetId"]
        dt.session = dt.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            dt.send(f"{domain}.enable")
        dt.send("Emulation.setDeviceMetricsOverride", width=1400, height=900, deviceScaleFactor=1, mobile=False)
        dt.send("Page.navigate", url=page.as_uri())
        dt.wait_for("Page.loadEventFired")
        yield dt, page
        dt.ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def assert_clean_offline_load(dt: DevTools, page: Path) -> None:
    """No exception, console error/assert or log error; no request but the page's own file."""
    errors = [
        ev
        for ev in dt.events
        if ev.get("method") == "Runtime.exceptionThrown"
        or (ev.get("method") == "Runtime.consoleAPICalled" and ev["params"]["type"] in ("error", "assert"))
        or (ev.get("method") == "Log.entryAdded" and ev["params"]["entry"]["level"] == "error")
    ]
    assert errors == []
    sent = [ev for ev in dt.events if ev.get("method") == "Network.requestWillBeSent"]
    requests = [ev["params"]["request"]["url"] for ev in sent]
    assert requests and all(u == page.as_uri() for u in requests), requests  # nothing fetched but the page


VISIBLE = "[...document.querySelectorAll('g.node')].filter(g => getComputedStyle(g).display !== 'none')"


def hover(dt: DevTools, node: int) -> str:
    """Hover node ``node`` and return the info box's text."""
    return dt.evaluate(
        f"document.querySelector('g.node[data-id=\"{node}\"]').dispatchEvent(new MouseEvent('mouseenter'));"
        "document.querySelector('.bk-view .info').textContent"
    )


@pytest.mark.slow
def test_search_tree_page_in_headless_chromium(tmp_path):
    trace = _trace()
    with open_page(tmp_path, to_html(trace)) as (dt, page):
        nodes = dt.evaluate("document.querySelectorAll('svg.bk-tree g.node').length")
        rendered = dt.evaluate("document.querySelector('.bk-view').getAttribute('data-rendered')")
        assert nodes == len(trace.nodes) and rendered == str(len(trace.nodes))  # the script ran to its end
        # fold: only the pruned nodes disappear
        assert dt.evaluate(f"{VISIBLE}.length") == len(trace.nodes)
        dt.evaluate("document.querySelector('input.fold').click()")
        assert dt.evaluate(f"{VISIBLE}.length") == sum(1 for n in trace.nodes if n.status != "pruned")
        dt.evaluate("document.querySelector('input.fold').click()")
        # hover: the info box shows the node's prefix and log-probability
        best = trace.result[0]
        assert f"logprob {trace.nodes[best].logprob:.4f}" in hover(dt, best)
        shot = base64.b64decode(dt.send("Page.captureScreenshot", format="png")["data"])
        (tmp_path / "search.png").write_bytes(shot)
        assert_clean_offline_load(dt, page)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n"
    image = pytest.importorskip("PIL.Image").open(io.BytesIO(shot)).convert("RGB")
    pixels = np.asarray(image)
    assert pixels.shape[:2] == (900, 1400)
    # the tree is drawn: the running-node blue and the finished-node green both appear
    colours = {tuple(int(c) for c in p) for p in pixels.reshape(-1, 3)[::7]}
    assert (0xDB, 0xE9, 0xFF) in colours and (0xD5, 0xF2, 0xCC) in colours
