"""Static drawings of a search trace: SVG (the tree the HTML page makes interactive) and Graphviz DOT."""

from __future__ import annotations

import math
from html import escape
from typing import TYPE_CHECKING

from beamkit.trace import Trace, TraceNode
from beamkit.viz.layout import BOX_H, BOX_W, COL_W, MARGIN, Layout, greedy_path, layout

if TYPE_CHECKING:
    from beamkit.ctc.trace import CTCTrace

# distinct styles per status; the HTML page uses the same sheet
CSS = """
.bk-tree text{font:11px 'DejaVu Sans Mono',monospace;dominant-baseline:middle}
.bk-tree .hdr{font-size:11px;fill:#555}
.bk-tree .node rect{stroke-width:1.2}
.bk-tree .s-root rect{fill:#eee;stroke:#555}
.bk-tree .s-running rect{fill:#dbe9ff;stroke:#2b6cd1}
.bk-tree .s-pruned rect{fill:#f6f6f6;stroke:#bbb;stroke-dasharray:3 2}
.bk-tree .s-pruned text{fill:#999}
.bk-tree .s-finished rect{fill:#d5f2cc;stroke:#2e8b2e}
.bk-tree .s-unfinished rect{fill:#ffe8c4;stroke:#d98c1a}
.bk-tree .node.evicted rect{fill:#fbdada;stroke:#c0392b;stroke-dasharray:5 2}
.bk-tree .node.evicted text{text-decoration:line-through;fill:#a33}
.bk-tree .node.result rect{stroke:#b8860b;stroke-width:3}
.bk-tree .node.greedy rect{stroke:#8e44ad;stroke-width:2}
.bk-tree .node.result.greedy rect{stroke:#b8860b;stroke-width:3;filter:drop-shadow(0 0 2px #8e44ad)}
.bk-tree .edge{fill:none;stroke:#8aa4c0;stroke-width:1.2}
.bk-tree .edge.s-pruned{stroke:#ddd}
.bk-tree .edge.result{stroke:#b8860b;stroke-width:2.5}
.bk-tree .edge.greedy{stroke:#8e44ad;stroke-width:2.5;stroke-dasharray:6 3}
.bk-tree .ghost rect{fill:#fff;stroke:#8e44ad;stroke-dasharray:2 2}
.bk-tree .ghost text{fill:#8e44ad}
.bk-tree.folded .s-pruned{display:none}
.bk-tree .hl rect{stroke:#000;stroke-width:2.5}
.bk-tree .edge.hl{stroke:#000;stroke-width:2.5}
"""


def _fmt(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else ("-inf" if x < 0 else str(x))


def label(trace: Trace, node: TraceNode) -> str:
    """A node's box text: its token (shortened to fit the box)."""
    if node.token is None:
        return "<bos>"
    text = trace.text(node.token)
    return text if len(text) <= 8 else text[:7] + "…"


def describe(trace: Trace, node: TraceNode) -> str:
    """The hover text of a node: its prefix, numbers and fate."""
    if node.token is None:
        return "root (empty prefix)"
    prefix = " ".join(trace.text(t) for t in trace.tokens(node.id))
    fate = node.status + (f" ({node.reason})" if node.reason else "")
    if node.evicted is not None:
        fate += f", evicted from the pool at step {node.evicted}"
    return (
        f"{prefix}\nstep {node.step}, rank {node.rank}: {fate}\nlogprob {_fmt(node.logprob)} "
        f"(token {_fmt(node.token_logprob)})\nscore {_fmt(node.score)}  key {_fmt(node.key)}"
    )


def _classes(trace: Trace, node: TraceNode, lay: Layout, on_result: set[int]) -> str:
    out = ["node", f"s-{node.status}"]
    if node.evicted is not None:
        out.append("evicted")
    if node.id in on_result:
        out.append("result")
    if node.id in lay.greedy:
        out.append("greedy")
    return " ".join(out)


def _parent(node: TraceNode) -> str:
    return "" if node.parent is None else str(node.parent)


def edge_path(a: tuple[float, float], b: tuple[float, float]) -> str:
    """An SVG path from the right side of the box at ``a`` to the left side of the box at ``b``."""
    x1, y1 = a[0] + BOX_W, a[1] + BOX_H / 2
    x2, y2 = b[0], b[1] + BOX_H / 2
    mid = (x1 + x2) / 2
    return f"M{x1:.1f},{y1:.1f} C{mid:.1f},{y1:.1f} {mid:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"


def node_box(cls: str, at: tuple[float, float], attrs: str, title: str, label: str) -> str:
    """One drawn node: a ``<g class="cls">`` at ``at`` (``attrs``: its other attributes, for the page's script)
    holding its hover text ``title``, its box and its ``label`` (both escaped here)."""
    return (
        f'<g class="{cls}" {attrs} transform="translate({at[0]:.1f},{at[1]:.1f})"><title>{escape(title)}</title>'
        f'<rect width="{BOX_W}" height="{BOX_H}" rx="3"/><text x="4" y="{BOX_H / 2 + 1}">{escape(label)}</text></g>'
    )


def svg_document(head: str, css: str | None, headers: list[str], edges: list[str], nodes: list[str]) -> str:
    """A tree drawn as one SVG document: ``head`` (the opening ``<svg>`` tag), its style sheet (``css``; None:
    none), a white background, the column ``headers``, then the ``edges`` drawn under the ``nodes``."""
    style = [] if css is None else [f"<style>{css}</style>"]
    background = '<rect width="100%" height="100%" fill="#fff"/>'
    return "".join(
        [head, *style, background, *headers, '<g class="edges">', *edges, '</g><g class="nodes">', *nodes, "</g></svg>"]
    )


def dot_style(fill: str, line: str, pruned: bool = False) -> str:
    """A DOT node's colours (``fill``, ``line``); a ``pruned`` node dashed and greyed."""
    return f'fillcolor="{fill}" color="{line}"' + (' style="filled,dashed" fontcolor="#999999"' if pruned else "")


DOT_ROOT = dot_style("#eeeeee", "#555555")  # the start node of every drawing


def to_svg(trace: Trace | CTCTrace, style: bool = True) -> str:
    """The search tree as an SVG document (with its style sheet unless ``style=False``).

    Every node is a ``<g class="node s-STATUS">`` carrying ``data-id``, ``data-parent``, its two positions
    (``data-full``, ``data-fold``) and a ``<title>`` with its numbers; the greedy path's nodes outside the tree are
    ``<g class="ghost">``. A CTC trace is drawn by :func:`beamkit.viz.ctc.ctc_svg`.
    """
    if not isinstance(trace, Trace):
        from beamkit.viz.ctc import ctc_svg
        from beamkit.viz.page import as_ctc_trace

        return ctc_svg(as_ctc_trace(trace), style=style)
    lay = layout(trace)
    on_result = {i for r in trace.result for i in trace.path(r)}
    best = set(trace.path(trace.result[0])) if trace.result else set()
    w, h = lay.size_full
    head = (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="bk-tree" width="{w:.0f}" height="{h:.0f}" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" data-full-size="{w:.0f} {h:.0f}" '
        f'data-fold-size="{lay.size_folded[0]:.0f} {lay.size_folded[1]:.0f}">'
    )
    headers = [
        f'<text class="hdr" x="{MARGIN + (s + 1) * COL_W}" y="{MARGIN + 16}">{"start" if s < 0 else f"step {s}"}</text>'
        for s in range(-1, max(n.step for n in trace.nodes) + 1)
    ]
    edges: list[str] = []
    for n in trace.nodes:
        if n.parent is None:
            continue
        a, b = lay.full[n.parent], lay.full[n.id]
        fa, fb = lay.folded[n.parent], lay.folded[n.id]
        cls = ["edge", f"s-{n.status}"]
        if n.id in best:
            cls.append("result")
        if n.id in lay.greedy:
            cls.append("greedy")
        fold = edge_path(fa, fb) if fa is not None and fb is not None else ""
        edges.append(
            f'<path class="{" ".join(cls)}" data-child="{n.id}" d="{edge_path(a, b)}" data-d-full="{edge_path(a, b)}" '
            f'data-d-fold="{fold}"/>'
        )
    for g, (gf, gd) in enumerate(zip(lay.ghost_full, lay.ghost_folded, strict=True)):
        ghost = lay.ghosts[g]
        if ghost.parent >= 0:
            pa, pd = lay.full[ghost.parent], lay.folded[ghost.parent] or lay.full[ghost.parent]
        else:
            pa, pd = lay.ghost_full[-ghost.parent - 1], lay.ghost_folded[-ghost.parent - 1]
        edges.append(
            f'<path class="edge greedy ghost-edge" d="{edge_path(pa, gf)}" data-d-full="{edge_path(pa, gf)}" '
            f'data-d-fold="{edge_path(pd, gd)}"/>'
        )
    nodes: list[str] = []
    for n in trace.nodes:
        x, y = lay.full[n.id]
        at = lay.folded[n.id]
        fold_attr = f"{at[0]:.1f},{at[1]:.1f}" if at is not None else ""
        attrs = f'data-id="{n.id}" data-parent="{_parent(n)}" data-full="{x:.1f},{y:.1f}" data-fold="{fold_attr}"'
        nodes.append(node_box(_classes(trace, n, lay, on_result), (x, y), attrs, describe(trace, n), label(trace, n)))
    for ghost, (gx, gy), (fx, fy) in zip(lay.ghosts, lay.ghost_full, lay.ghost_folded, strict=True):
        text = trace.text(ghost.token)
        attrs = f'data-full="{gx:.1f},{gy:.1f}" data-fold="{fx:.1f},{fy:.1f}"'
        nodes.append(node_box("ghost", (gx, gy), attrs, f"greedy: {text} (never a beam candidate)", text[:8]))
    return svg_document(head, CSS if style else None, headers, edges, nodes)


_DOT_STYLE = {
    "root": DOT_ROOT,
    "running": dot_style("#dbe9ff", "#2b6cd1"),
    "pruned": dot_style("#f6f6f6", "#bbbbbb", pruned=True),
    "finished": dot_style("#d5f2cc", "#2e8b2e"),
    "unfinished": dot_style("#ffe8c4", "#d98c1a"),
}


def dot_string(text: str) -> str:
    """``text`` as a quoted DOT string."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_dot(trace: Trace | CTCTrace) -> str:
    """The search tree as Graphviz DOT (left to right, one rank per step, statuses as fill colours); a CTC
    trace is drawn by :func:`beamkit.viz.ctc.ctc_dot`."""
    if not isinstance(trace, Trace):
        from beamkit.viz.ctc import ctc_dot
        from beamkit.viz.page import as_ctc_trace

        return ctc_dot(as_ctc_trace(trace))
    on_result = {i for r in trace.result for i in trace.path(r)}
    greedy, _ = greedy_path(trace)
    lines = dot_head("search")
    for n in trace.nodes:
        extra = ""
        if n.evicted is not None:
            extra += ' color="#c0392b" style="filled,dashed"'
        if n.id in on_result:
            extra += ' penwidth=3 color="#b8860b"'
        lines.append(
            f"  n{n.id} [label={dot_string(label(trace, n))} tooltip={dot_string(describe(trace, n))} "
            f"{_DOT_STYLE[n.status]}{extra}];"
        )
    for n in trace.nodes:
        if n.parent is not None:
            attrs = 'color="#dddddd"' if n.status == "pruned" else ""
            if n.id in greedy:
                attrs = 'color="#8e44ad" penwidth=2'
            lines.append(f"  n{n.parent} -> n{n.id} [{attrs}];")
    return dot_end(lines, [(n.step, n.id) for n in trace.nodes])


def dot_head(name: str) -> list[str]:
    """The first lines of a left-to-right DOT graph of boxes."""
    return [
        f"digraph {name} {{",
        "  rankdir=LR;",
        '  node [shape=box style=filled fontname="DejaVu Sans Mono" fontsize=10];',
    ]


def dot_end(lines: list[str], columns: list[tuple[int, int]]) -> str:
    """The DOT text of ``lines`` closed with one ``rank=same`` group per column (``(column, node id)`` pairs)."""
    by_column: dict[int, list[int]] = {}
    for col, i in columns:
        by_column.setdefault(col, []).append(i)
    for ids in by_column.values():
        lines.append("  { rank=same; " + " ".join(f"n{i};" for i in ids) + " }")
    lines.append("}")
    return "\n".join(lines) + "\n"
