"""A griffe extension for the reference pages: docstrings cite code with Sphinx roles (``:class:`beamkit.Engine```),
which Markdown would print as they stand; each role becomes inline code of its target (``beamkit.Engine``)."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|func|meth|attr|mod|data|obj|exc|const|term):`~?([^`]+)`")


def plain(text: str) -> str:
    """``text`` with every Sphinx cross-reference role replaced by inline code of its target."""
    return ROLE.sub(lambda m: f"`{m.group(1)}`", text)


class PlainRoles(griffe.Extension):
    """Rewrites the roles in every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s docstring in place."""
        if obj.docstring is not None:
            obj.docstring.value = plain(obj.docstring.value)
