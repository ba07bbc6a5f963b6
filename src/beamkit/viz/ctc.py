"""Drawing a CTC prefix-search trace (:class:`beamkit.ctc.trace.CTCTrace`): SVG and Graphviz DOT.

One column per frame, a node per entry (merged candidate beam: kept, or pruned by threshold / beam width /
history), an edge from each entry to its source beam in the previous frame, the root (the empty prefix before
frame 0) on the left. In each column the frame's beams come first, best first, then the pruned entries next to
the beam they extend. A box shows the prefix's tail, marked ``ε`` when all its alignments end in blank (with split
beams a prefix can hold two entries). Returned hypotheses (and the beams they descend from) and the greedy
decoding's prefixes are highlighted; hovering shows p_b, p_nb, LM score, total and merged count.

Quiet frames: a frame where every beam only absorbs a blank (no new prefix, nothing pruned, every entry kept in
the order of the previous frame's beams) changes nothing but the numbers. A run of such frames can be compressed
(the default in the HTML page and the SVG): only the run's last frame is drawn, headed ``t a-b``, and the edges
of the frame after the run go to the run's last frame. Every entry stays in the document (hidden when
compressed); the page's checkboxes switch between the four layouts (pruned branches shown or folded, quiet runs
shown or compressed). DOT always draws every frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape

from beamkit.ctc.trace import BLANK_TEXT, CTCEntry, CTCTrace
from beamkit.viz.layout import BOX_H, BOX_W, COL_W, MARGIN, ROW_H
from beamkit.viz.render import (
    CSS,
    DOT_ROOT,
    dot_end,
    dot_head,
    dot_string,
    dot_style,
    edge_path,
    node_box,
    svg_document,
)

MODES = ("full", "fold", "full-q", "fold-q")  # pruned shown / folded, x quiet runs shown / compressed
DEFAULT_MODE = "full-q"
_TOP = 52  # room for the two header lines


@dataclass
class CTCNode:
    """A drawn node: the root (``frame`` -1, ``entry`` None) or entry ``index`` of frame ``frame``."""

    id: int
    frame: int
    index: int
    parent: int | None
    entry: CTCEntry | None


@dataclass
class CTCLayout:
    """The nodes, and per mode: each node's box corner (None: hidden), each frame's column x (None: hidden),
    the drawing size; the quiet frames; the highlighted node ids."""

    nodes: list[CTCNode]
    pos: dict[str, list[tuple[float, float] | None]]
    column: dict[str, list[float | None]]
    size: dict[str, tuple[float, float]]
    quiet: list[bool]
    result: set[int]
    best: set[int]
    greedy: set[int]
    greedy_leaves: int | None  # first frame where no entry holds the greedy prefix (None: never)


def nodes_of(trace: CTCTrace) -> list[CTCNode]:
    """The root and every entry as drawn nodes, ids in frame order (root 0)."""
    nodes = [CTCNode(0, -1, 0, None, None)]
    kept_ids = [0]  # node id of each kept entry of the previous frame
    for f in trace.frames:
        ids = []
        for j, e in enumerate(f.entries):
            parent = kept_ids[e.source] if 0 <= e.source < len(kept_ids) else None
            nodes.append(CTCNode(len(nodes), f.t, j, parent, e))
            ids.append(nodes[-1].id)
        kept_ids = [i for i, e in zip(ids, f.entries, strict=True) if e.fate == "kept"]
    return nodes


def quiet_frames(trace: CTCTrace) -> list[bool]:
    """Per frame: whether every beam only absorbed a blank (same beams as the previous frame, in order)."""
    out = []
    prev = [(0, True)]  # the root: the empty prefix, ending in blank
    for f in trace.frames:
        now = [(e.prefix, e.ends_in_blank) for e in f.entries]
        same = all(e.fate == "kept" and e.label == -1 and e.source == j for j, e in enumerate(f.entries))
        out.append(same and now == prev)
        prev = [(e.prefix, e.ends_in_blank) for e in f.entries if e.fate == "kept"]
    return out


def _norm(text: str) -> str:
    return " ".join(text.split())


def greedy_nodes(trace: CTCTrace, nodes: list[CTCNode]) -> tuple[set[int], int | None]:
    """The node of each frame holding the greedy decoding's prefix (its blank flag matching when the prefix
    appears twice; kept before pruned), and the first frame where none does."""
    found: set[int] = {0}
    leaves = None
    start = 1
    best = trace.best_path()
    for t, (f, want) in enumerate(zip(trace.frames, trace.greedy_prefixes(), strict=True)):
        ids = range(start, start + len(f.entries))
        start += len(f.entries)
        hits = [i for i in ids if _norm(nodes[i].entry.text) == want]  # type: ignore[union-attr]
        if not hits:
            leaves = t if leaves is None else leaves
            continue
        blank_end = best[t] == trace.blank
        prefs = {}
        for i in hits:
            e = nodes[i].entry
            assert e is not None
            prefs[i] = (e.ends_in_blank != blank_end, e.fate != "kept", e.rank)
        found.add(min(hits, key=prefs.__getitem__))
    return found, leaves


def _ancestors(nodes: list[CTCNode], i: int) -> list[int]:
    out = []
    at: int | None = i
    while at is not None:
        out.append(at)
        at = nodes[at].parent
    return out


def ctc_layout(trace: CTCTrace) -> CTCLayout:
    """Positions of every node in the four modes (see :data:`MODES`) and the highlighted nodes."""
    nodes = nodes_of(trace)
    quiet = quiet_frames(trace)
    n = len(trace.frames)
    hidden_q = [quiet[t] and t + 1 < n and quiet[t + 1] for t in range(n)]
    pos: dict[str, list[tuple[float, float] | None]] = {}
    column: dict[str, list[float | None]] = {}
    size: dict[str, tuple[float, float]] = {}
    for mode in MODES:
        fold, compress = mode.startswith("fold"), mode.endswith("-q")
        cols: list[float | None] = []
        x = MARGIN + COL_W
        for t in range(n):
            if compress and hidden_q[t]:
                cols.append(None)
            else:
                cols.append(float(x))
                x += COL_W
        at: list[tuple[float, float] | None] = [None] * len(nodes)
        at[0] = (float(MARGIN), float(MARGIN + _TOP))
        by_frame: dict[int, list[int]] = {}
        for node in nodes[1:]:
            e = node.entry
            assert e is not None
            if cols[node.frame] is None or (fold and e.fate != "kept"):
                continue
            by_frame.setdefault(node.frame, []).append(node.id)
        tallest = 1
        for t in range(n):
            ids = by_frame.get(t, [])

            # the frame's beams on top in rank order, then the pruned entries next to the beam they extend
            keys: dict[int, tuple[bool, float, int]] = {}
            for i in ids:
                e = nodes[i].entry
                assert e is not None
                p = _visible_parent(nodes, at, i)
                placed = at[p] if p is not None else None
                y = 0.0 if e.fate == "kept" or placed is None else placed[1]
                keys[i] = (e.fate != "kept", y, nodes[i].index)
            ids.sort(key=keys.__getitem__)
            for j, i in enumerate(ids):
                at[i] = (cols[t], float(MARGIN + _TOP + j * ROW_H))  # type: ignore[assignment]
            tallest = max(tallest, len(ids))
        pos[mode] = at
        column[mode] = cols
        size[mode] = (x + MARGIN, MARGIN * 2 + _TOP + tallest * ROW_H)
    result: set[int] = set()
    best: set[int] = set()
    last = [nd.id for nd in nodes if nd.frame == n - 1 and nd.entry is not None and nd.entry.fate == "kept"]
    for k, h in enumerate(trace.hypotheses):
        for j in h.entries:
            chain = _ancestors(nodes, last[j]) if j < len(last) else [0]
            result.update(chain)
            if k == 0:
                best.update(chain)
    if trace.hypotheses and not trace.frames:
        result.add(0)
        best.add(0)
    greedy, leaves = greedy_nodes(trace, nodes)
    return CTCLayout(nodes, pos, column, size, quiet, result, best, greedy, leaves)


def _visible_parent(nodes: list[CTCNode], at: list[tuple[float, float] | None], i: int) -> int | None:
    """The nearest ancestor of node i that is placed in ``at`` (hidden quiet frames are skipped)."""
    p = nodes[i].parent
    while p is not None and at[p] is None:
        p = nodes[p].parent
    return p


def _fmt(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else ("-inf" if x < 0 else str(x))


def _show(text: str) -> str:
    return text.replace(" ", "␣") if text else "∅"


def box_text(node: CTCNode) -> str:
    """A node's box text: the tail of its prefix (spaces as ␣, the empty prefix as ∅), then ``ε`` when the
    entry's alignments all end in blank (with split beams the same prefix may also end in its label)."""
    if node.entry is None:
        return "root"
    text = _show(node.entry.text)
    mark = "ε" if node.entry.ends_in_blank else ""
    room = 8 - len(mark)
    return (text if len(text) <= room else "…" + text[-(room - 1) :]) + mark


_FATE_TEXT = {
    "kept": "kept",
    "threshold": "pruned: below best + beam_prune_logp",
    "beam": "pruned: beam width",
    "history": "pruned: history (same last words as a better beam)",
}


def describe_ctc(trace: CTCTrace, lay: CTCLayout, node: CTCNode) -> str:
    """The hover text of a node: its prefix, where it came from, p_b / p_nb / LM / total, merged count, fate."""
    e = node.entry
    if e is None:
        return "root: the empty prefix before frame 0 (p_b 0, p_nb -inf)"
    parent = lay.nodes[node.parent].entry if node.parent is not None else None
    src = f'"{parent.text}"' if parent is not None else "root"
    how = f"{src} + '{e.label_text}'" if e.label >= 0 else f"{src} (same prefix)"
    unit = "ends in blank" if e.ends_in_blank else "ends in a label"
    return (
        f'"{e.text}" ({unit})\nframe {node.frame}, rank {e.rank}: {_FATE_TEXT[e.fate]}\nfrom {how}; '
        f"{e.merged} extension{'s' if e.merged != 1 else ''} merged\n"
        f"p_b {_fmt(e.p_b)}  p_nb {_fmt(e.p_nb)}  logaddexp {_fmt(e.logit)}\n"
        f"LM {_fmt(e.lm)}  total {_fmt(e.total)}"
    )


def _classes(node: CTCNode, lay: CTCLayout) -> str:
    if node.entry is None:
        out = ["node", "s-root"]
    else:
        kept = node.entry.fate == "kept"
        out = ["node", "s-kept" if kept else "s-pruned", f"f-{node.entry.fate}"]
        if lay.quiet[node.frame]:
            out.append("quiet")
    if node.id in lay.result:
        out.append("result")
    if node.id in lay.greedy:
        out.append("greedy")
    return " ".join(out)


def _xy(p: tuple[float, float] | None) -> str:
    return "" if p is None else f"{p[0]:.1f},{p[1]:.1f}"


def _header(trace: CTCTrace, t: int) -> str:
    """A frame's best candidate and its probability (the second header line)."""
    best = max(trace.frames[t].candidates, key=lambda c: (c.logprob, -c.label))
    return f"{_show(best.text) if best.label != trace.blank else BLANK_TEXT} {math.exp(best.logprob):.2f}"


def _run_start(lay: CTCLayout, t: int) -> int:
    """The first frame of the quiet run ending at frame t (t itself when t is not quiet)."""
    s = t
    while lay.quiet[t] and s > 0 and lay.quiet[s - 1]:
        s -= 1
    return s


def _placed(lay: CTCLayout, x: dict[str, float | None], only: tuple[str, ...] = MODES) -> tuple[str, str]:
    """A header group's per-mode positions (``x,0``; empty: hidden) and its transform in the default mode."""
    attrs = " ".join(f'data-{m}="{f"{x[m]:.0f},0" if x[m] is not None and m in only else ""}"' for m in MODES)
    x0 = x[DEFAULT_MODE] if DEFAULT_MODE in only else None
    shown = f'transform="translate({x0:.0f},0)"' if x0 is not None else 'style="display:none"'
    return attrs, shown


# the CTC fates on top of the search tree's sheet
CTC_CSS = """
.bk-tree .s-kept rect{fill:#dbe9ff;stroke:#2b6cd1}
.bk-tree .f-threshold rect{fill:#f6f6f6;stroke:#bbb;stroke-dasharray:3 2}
.bk-tree .f-beam rect{fill:#f9eeee;stroke:#c77c7c;stroke-dasharray:3 2}
.bk-tree .f-history rect{fill:#fff3dc;stroke:#d98c1a;stroke-dasharray:1 2}
.bk-tree .quiet rect{fill:#eef3fa}
.bk-tree .edge.s-kept{stroke:#8aa4c0}
.bk-tree .hdr.cand{fill:#888;font-size:10px}
"""


def ctc_svg(trace: CTCTrace, style: bool = True, lay: CTCLayout | None = None) -> str:
    """The prefix search as an SVG document, compressed quiet runs (see the module docstring).

    Every node is a ``<g class="node ...">`` with ``data-id``, ``data-parent``, its position in each mode
    (``data-full``, ``data-fold``, ``data-full-q``, ``data-fold-q``; empty: hidden) and a ``<title>``; edges
    (``data-child``) are drawn for the default mode, and the page's script redraws them from the nodes.
    ``lay``: the layout when already computed."""
    lay = lay if lay is not None else ctc_layout(trace)
    mode = DEFAULT_MODE
    w, h = lay.size[mode]
    sizes = " ".join(f'data-{m}-size="{lay.size[m][0]:.0f} {lay.size[m][1]:.0f}"' for m in MODES)
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="bk-tree bk-ctc" width="{w:.0f}" height="{h:.0f}" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" {sizes} data-box="{BOX_W} {BOX_H}">'
    )
    headers = [f'<text class="hdr" x="{MARGIN}" y="{MARGIN + 14}">start</text>']
    for t in range(len(trace.frames)):
        attrs, shown = _placed(lay, {m: lay.column[m][t] for m in MODES})
        headers.append(
            f'<g class="hdr-col" {attrs} {shown}><text class="hdr" x="0" y="{MARGIN + 14}">t {t}</text>'
            f'<text class="hdr cand" x="0" y="{MARGIN + 28}">{escape(_header(trace, t))}</text></g>'
        )
        s = _run_start(lay, t)
        if s < t and (t + 1 == len(trace.frames) or not lay.quiet[t + 1]):  # a compressed run ends here
            attrs, shown = _placed(lay, {m: lay.column[m][t] for m in MODES}, ("full-q", "fold-q"))
            headers.append(
                f'<g class="hdr-col run" {attrs} {shown}><text class="hdr" x="0" y="{MARGIN + 42}">'
                f"(t {s}-{t}: ε)</text></g>"
            )
    edges: list[str] = []
    for node in lay.nodes[1:]:
        e = node.entry
        assert e is not None
        b = lay.pos[mode][node.id]
        p = _visible_parent(lay.nodes, lay.pos[mode], node.id)
        a = lay.pos[mode][p] if p is not None else None
        d = edge_path(a, b) if a is not None and b is not None else ""
        cls = ["edge", "s-kept" if e.fate == "kept" else "s-pruned"]
        if node.id in lay.best:
            cls.append("result")
        if node.id in lay.greedy and node.parent in lay.greedy:
            cls.append("greedy")
        hide = ' style="display:none"' if not d else ""
        # the page's script redraws edges from the node positions when the layout changes
        edges.append(f'<path class="{" ".join(cls)}" data-child="{node.id}" d="{d or "M0,0"}"{hide}/>')
    nodes: list[str] = []
    for node in lay.nodes:
        at0 = lay.pos[mode][node.id]
        places = " ".join(f'data-{m}="{_xy(lay.pos[m][node.id])}"' for m in MODES)
        hide = ' style="display:none"' if at0 is None else ""
        parent = "" if node.parent is None else str(node.parent)
        attrs = f'data-id="{node.id}" data-parent="{parent}" {places}{hide}'
        at = at0 if at0 is not None else (0.0, 0.0)
        nodes.append(node_box(_classes(node, lay), at, attrs, describe_ctc(trace, lay, node), box_text(node)))
    return svg_document(head, CSS + CTC_CSS if style else None, headers, edges, nodes)


_DOT_STYLE = {
    "root": DOT_ROOT,
    "kept": dot_style("#dbe9ff", "#2b6cd1"),
    "threshold": dot_style("#f6f6f6", "#bbbbbb", pruned=True),
    "beam": dot_style("#f6f6f6", "#c77c7c", pruned=True),
    "history": dot_style("#fff3dc", "#d98c1a", pruned=True),
}


def ctc_dot(trace: CTCTrace) -> str:
    """The prefix search as Graphviz DOT: left to right, one rank per frame (every frame drawn), fates as
    fill colours, the returned hypotheses' beams with a thick gold border, greedy edges purple."""
    lay = ctc_layout(trace)
    lines = dot_head("ctc_search")
    for node in lay.nodes:
        fate = "root" if node.entry is None else node.entry.fate
        extra = ' penwidth=3 color="#b8860b"' if node.id in lay.result else ""
        lines.append(
            f"  n{node.id} [label={dot_string(box_text(node))} tooltip={dot_string(describe_ctc(trace, lay, node))} "
            f"{_DOT_STYLE[fate]}{extra}];"
        )
    for node in lay.nodes[1:]:
        if node.parent is None:
            continue
        attrs = 'color="#dddddd"' if node.entry is not None and node.entry.fate != "kept" else ""
        if node.id in lay.greedy and node.parent in lay.greedy:
            attrs = 'color="#8e44ad" penwidth=2'
        lines.append(f"  n{node.parent} -> n{node.id} [{attrs}];")
    return dot_end(lines, [(node.frame, node.id) for node in lay.nodes])
