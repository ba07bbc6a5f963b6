"""Drawing search traces: the interactive HTML tree, SVG and Graphviz DOT (see :mod:`beamkit.trace`)."""

from beamkit.viz.page import to_html
from beamkit.viz.render import to_dot, to_svg

__all__ = ["to_dot", "to_html", "to_svg"]
