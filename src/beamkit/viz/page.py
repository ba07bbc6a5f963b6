"""The interactive search tree: one self-contained HTML page (inline CSS and JS, nothing fetched, opens offline)."""

from __future__ import annotations

import itertools
import math
from html import escape
from typing import Any

from beamkit.trace import Trace
from beamkit.viz.layout import greedy_path
from beamkit.viz.render import CSS, to_svg

_PAGE_CSS = """
.bk-view{font:13px 'DejaVu Sans',sans-serif;color:#222}
.bk-view h1{font-size:16px;margin:4px 0}
.bk-view .meta{color:#555;margin:2px 0}
.bk-view table{border-collapse:collapse;margin:6px 0}
.bk-view td,.bk-view th{padding:1px 8px;text-align:left;font-family:'DejaVu Sans Mono',monospace;font-size:12px}
.bk-view .legend span{display:inline-block;margin-right:10px}
.bk-view .legend i{display:inline-block;width:14px;height:10px;border:1.5px solid;margin-right:3px;
 vertical-align:middle}
.bk-view .info{font-family:'DejaVu Sans Mono',monospace;font-size:12px;white-space:pre;background:#fafafa;
 border:1px solid #ddd;padding:4px 8px;min-height:4.5em;margin:6px 0}
.bk-view .tree{overflow:auto;border:1px solid #ddd}
.bk-view .bk-tree .node{cursor:pointer}
"""

# the page's script: hover shows a node's numbers and highlights its path; the checkbox folds pruned branches
_JS = """
(function () {
  var root = document.getElementById(%(id)s);
  var svg = root.querySelector('svg.bk-tree');
  var info = root.querySelector('.info');
  var nodes = svg.querySelectorAll('g.node');
  var byId = {};
  var parent = {};
  var edgeOf = {};
  nodes.forEach(function (g) { byId[g.getAttribute('data-id')] = g; });
  svg.querySelectorAll('path.edge[data-child]').forEach(function (p) {
    edgeOf[p.getAttribute('data-child')] = p;
  });
  var data = JSON.parse(root.querySelector('script.bk-data').textContent);
  data.nodes.forEach(function (n) { parent[n.id] = n.parent; });
  function ancestors(id) {
    var out = [];
    while (id !== null && id !== undefined) { out.push(String(id)); id = parent[id]; }
    return out;
  }
  function mark(id, on) {
    ancestors(id).forEach(function (a) {
      byId[a].classList.toggle('hl', on);
      if (edgeOf[a]) { edgeOf[a].classList.toggle('hl', on); }
    });
  }
  nodes.forEach(function (g) {
    var title = g.querySelector('title');
    var text = title ? title.textContent : '';
    g.addEventListener('mouseenter', function () { info.textContent = text; mark(g.getAttribute('data-id'), true); });
    g.addEventListener('mouseleave', function () { mark(g.getAttribute('data-id'), false); });
  });
  function place(folded) {
    var key = folded ? 'data-fold' : 'data-full';
    svg.classList.toggle('folded', folded);
    svg.querySelectorAll('g.node, g.ghost').forEach(function (g) {
      var at = g.getAttribute(key);
      if (at) { g.setAttribute('transform', 'translate(' + at + ')'); }
    });
    svg.querySelectorAll('path.edge').forEach(function (p) {
      var d = p.getAttribute(folded ? 'data-d-fold' : 'data-d-full');
      if (d) { p.setAttribute('d', d); }
    });
    var size = svg.getAttribute(folded ? 'data-fold-size' : 'data-full-size').split(' ');
    svg.setAttribute('width', size[0]);
    svg.setAttribute('height', size[1]);
    svg.setAttribute('viewBox', '0 0 ' + size[0] + ' ' + size[1]);
  }
  var fold = root.querySelector('input.fold');
  fold.addEventListener('change', function () { place(fold.checked); });
  place(fold.checked);
  root.setAttribute('data-rendered', String(nodes.length));
})();
"""

_LEGEND = (
    ("running", "#dbe9ff", "#2b6cd1", "ran on"),
    ("pruned", "#f6f6f6", "#bbb", "pruned"),
    ("finished", "#d5f2cc", "#2e8b2e", "finished (eos)"),
    ("unfinished", "#ffe8c4", "#d98c1a", "cut at max_len"),
    ("evicted", "#fbdada", "#c0392b", "evicted from the pool"),
    ("result", "#fff", "#b8860b", "returned n-best"),
    ("greedy", "#fff", "#8e44ad", "greedy path"),
)
_ids = itertools.count()


def _num(x: float) -> str:
    return f"{x:.4f}" if math.isfinite(x) else "-inf"


def _summary(trace: Trace) -> str:
    rows = []
    for rank, i in enumerate(trace.result, 1):
        n = trace.nodes[i]
        text = " ".join(trace.text(t) for t in trace.tokens(i))
        flag = "" if n.status == "finished" else " (unfinished)"
        rows.append(
            f"<tr><td>#{rank}</td><td>{escape(text)}{flag}</td><td>logprob {_num(n.logprob)}</td>"
            f"<td>score {_num(n.score)}</td></tr>"
        )
    if trace.greedy is not None:
        path, ghosts = greedy_path(trace)
        where = "leaves the beam's tree" if ghosts else "inside the tree"
        text = " ".join(trace.text(t) for t in trace.greedy)
        rows.append(f"<tr><td>greedy</td><td>{escape(text)}</td><td colspan=2>({where})</td></tr>")
    return "<table>" + "".join(rows) + "</table>"


def to_html(trace: Trace, vocab: Any = None, standalone: bool = True, title: str | None = None) -> str:
    """The interactive search tree of ``trace`` as HTML: one column per step, nodes for the candidates with their
    tokens, edges to their parents, distinct styles for running / pruned / finished / cut / evicted nodes, the
    returned n-best and the greedy path highlighted, numbers on hover, a control to fold pruned branches.

    ``vocab`` (a list of strings, a mapping, a beamkit Vocab or a tokenizer) maps token ids to text.
    ``standalone``: a whole page (``<!DOCTYPE html>``...); else a fragment (Jupyter). Everything is inline.
    """
    if vocab is not None:
        trace.with_vocab(vocab)
    uid = f"bk-trace-{next(_ids)}"
    data = trace.to_json().replace("</", "<\\/")
    head = escape(title or (f"search tree: {trace.source}" if trace.source else "search tree"))
    params = (
        f"policy {trace.policy}, beam {trace.beam_size}, max_len {trace.max_len}, length penalty alpha "
        f"{trace.alpha:g}; {len(trace.nodes) - 1} candidates over {len(trace.steps)} steps"
    )
    legend = "".join(
        f'<span><i style="background:{bg};border-color:{fg}"></i>{escape(txt)}</span>' for _, bg, fg, txt in _LEGEND
    )
    body = (
        f'<div class="bk-view" id="{uid}"><h1>{head}</h1><div class="meta">{escape(params)}</div>'
        f'<div class="meta">stopped: {escape(trace.stop_reason or "-")}</div>{_summary(trace)}'
        f'<div class="legend">{legend}</div>'
        f'<label><input type="checkbox" class="fold"> fold pruned branches</label>'
        f'<div class="info">hover a node for its prefix, log-probability, score and fate</div>'
        f'<div class="tree">{to_svg(trace, style=False)}</div>'
        f'<script type="application/json" class="bk-data">{data}</script>'
        f"<style>{CSS}{_PAGE_CSS}</style><script>{_JS % {'id': repr(uid)}}</script></div>"
    )
    if not standalone:
        return body
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{head}</title></head><body>{body}</body></html>\n"
    )
