"""How an error names the optional extra that a feature needs.

beamkit is installed from a checkout or a wheel, not from a package index, so the hint is the checkout's
``pip install ".[NAME]"`` (from a wheel: ``pip install "beamkit-VERSION-py3-none-any.whl[NAME]"``). The extras
themselves are listed in ``pyproject.toml``.
"""

from __future__ import annotations


def install_hint(extra: str) -> str:
    """The install command for ``extra``, as error messages quote it: ``pip install ".[hf]"`` (from a checkout)."""
    return f'pip install ".[{extra}]" from a beamkit checkout'
