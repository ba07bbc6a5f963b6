"""Shared test fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module's tiny models: faster, and immune to oversubscription on a shared CPU.

    The previous thread count is restored afterwards; without torch this does nothing.
    """
    try:
        import torch
    except ImportError:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
