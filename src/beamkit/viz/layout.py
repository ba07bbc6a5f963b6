"""Where each node of a :class:`beamkit.trace.Trace` is drawn: one column per step, two layouts (all nodes, and
pruned branches folded away), plus the greedy decode's path along the tree (ghost nodes where it leaves it)."""

from __future__ import annotations

from dataclasses import dataclass

from beamkit.trace import Trace

COL_W, ROW_H, BOX_W, BOX_H, MARGIN = 96, 22, 64, 17, 16


@dataclass
class Ghost:
    """A node of the greedy path that the beam never considered: drawn dashed, after ``parent`` (a node id or
    the previous ghost's negative index)."""

    index: int
    step: int
    token: int
    parent: int


@dataclass
class Layout:
    """Positions (box top-left corners) of every node, full and folded (None: hidden when folded), the greedy
    path (node ids), ghosts and their positions, the drawing's size in both modes."""

    full: list[tuple[float, float]]
    folded: list[tuple[float, float] | None]
    greedy: list[int]
    ghosts: list[Ghost]
    ghost_full: list[tuple[float, float]]
    ghost_folded: list[tuple[float, float]]
    size_full: tuple[float, float]
    size_folded: tuple[float, float]


def greedy_path(trace: Trace) -> tuple[list[int], list[Ghost]]:
    """The greedy tokens of ``trace.greedy`` followed along the tree: node ids while they exist, ghosts after."""
    if not trace.greedy:
        return [], []
    children: dict[tuple[int, int], int] = {}
    for n in trace.nodes:
        if n.parent is not None and n.token is not None:
            children.setdefault((n.parent, n.token), n.id)
    path: list[int] = []
    ghosts: list[Ghost] = []
    at = 0
    for step, tok in enumerate(trace.greedy):
        nxt = children.get((at, tok)) if not ghosts else None
        if nxt is not None:
            path.append(nxt)
            at = nxt
        else:
            parent = at if not ghosts else -len(ghosts)
            ghosts.append(Ghost(len(ghosts) + 1, step, int(tok), parent))
    return path, ghosts


def _columns(trace: Trace, visible: list[bool]) -> tuple[list[tuple[float, float] | None], list[int]]:
    """Stack the visible nodes of each step in their column, ordered by their parent's place, then rank."""
    pos: list[tuple[float, float] | None] = [None] * len(trace.nodes)
    by_step: dict[int, list[int]] = {}
    for n in trace.nodes:
        if visible[n.id]:
            by_step.setdefault(n.step, []).append(n.id)
    heights = []
    for step in sorted(by_step):
        ids = by_step[step]

        def order(i: int) -> tuple[float, int]:
            parent = trace.nodes[i].parent
            py = pos[parent][1] if parent is not None and pos[parent] is not None else 0.0  # type: ignore[index]
            return (py, trace.nodes[i].rank)

        ids.sort(key=order)
        for j, i in enumerate(ids):
            pos[i] = (MARGIN + (step + 1) * COL_W, MARGIN + 40 + j * ROW_H)
        heights.append(len(ids))
    return pos, heights


def layout(trace: Trace) -> Layout:
    """Both layouts of ``trace`` and its greedy path."""
    full, h_full = _columns(trace, [True] * len(trace.nodes))
    folded, h_fold = _columns(trace, [n.status != "pruned" for n in trace.nodes])
    path, ghosts = greedy_path(trace)
    n_full = {s: 0 for s in range(-1, trace.max_len + 1)}
    n_fold = dict(n_full)
    for n in trace.nodes:
        n_full[n.step] = n_full.get(n.step, 0) + 1
        if n.status != "pruned":
            n_fold[n.step] = n_fold.get(n.step, 0) + 1
    g_full: list[tuple[float, float]] = []
    g_fold: list[tuple[float, float]] = []
    for g in ghosts:  # below the column's nodes
        x = float(MARGIN + (g.step + 1) * COL_W)
        g_full.append((x, MARGIN + 40 + n_full.get(g.step, 0) * ROW_H + ROW_H / 2))
        g_fold.append((x, MARGIN + 40 + n_fold.get(g.step, 0) * ROW_H + ROW_H / 2))
    steps = max([n.step for n in trace.nodes] + [g.step for g in ghosts]) + 2
    width = 2 * MARGIN + steps * COL_W
    tall_full = max(h_full + [0]) + (2 if ghosts else 0)
    tall_fold = max(h_fold + [0]) + (2 if ghosts else 0)
    return Layout(
        full,  # type: ignore[arg-type]
        folded,
        path,
        ghosts,
        g_full,
        g_fold,
        (width, MARGIN * 2 + 40 + tall_full * ROW_H),
        (width, MARGIN * 2 + 40 + tall_fold * ROW_H),
    )
