"""Load a benchmark script from bench/ as a module, for the tests of its helpers."""

import importlib.util
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(name: str) -> ModuleType:
    """The module of ``bench/NAME.py``, executed fresh."""
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
