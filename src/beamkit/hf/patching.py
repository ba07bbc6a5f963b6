"""``beamkit.hf.patch(model)``: ``model.generate`` runs through beamkit where beamkit reproduces it exactly."""

from __future__ import annotations

import functools
import logging
from typing import Any

from beamkit.hf.generation import run_generate
from beamkit.hf.inputs import check_model
from beamkit.hf.settings import Unsupported

log = logging.getLogger("beamkit.hf")


class Patch:
    """A patched model's handle: ``undo()`` restores the original ``generate``; as a context manager it undoes
    at exit. ``fallbacks`` lists the reasons logged so far (each is logged once per patch)."""

    def __init__(self, model: Any):
        check_model(model)
        if getattr(getattr(model, "generate", None), "beamkit_patch", None) is not None:
            raise ValueError("model.generate is already patched by beamkit.hf")
        self.model = model
        self.had_own = "generate" in vars(model)  # an instance attribute shadowing the class method
        self.original = model.generate
        self.fallbacks: list[str] = []

        @functools.wraps(self.original)
        def generate(*args: Any, **kwargs: Any) -> Any:
            inputs = args[0] if args else None
            second = args[1] if len(args) > 1 else None
            if len(args) > 2:  # logits_processor and later positional arguments: Hugging Face's own business
                return self._fall_back("positional arguments after generation_config", args, kwargs)
            try:
                return run_generate(self.model, inputs, second, kwargs, exact_only=True)
            except Unsupported as err:
                return self._fall_back(str(err), args, kwargs)

        generate.beamkit_patch = self  # type: ignore[attr-defined]
        model.generate = generate

    def _fall_back(self, why: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Log ``why`` once, then run Hugging Face's own ``generate``."""
        if why not in self.fallbacks:
            self.fallbacks.append(why)
            log.warning("beamkit.hf.patch: %s; this call runs Hugging Face's own generate", why)
        return self.original(*args, **kwargs)

    def undo(self) -> None:
        """Restore the model's original ``generate``."""
        if self.had_own:
            self.model.generate = self.original
        else:
            vars(self.model).pop("generate", None)

    def __enter__(self) -> Patch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()


def patch(model: Any) -> Patch:
    """Make ``model.generate(...)`` run through :func:`beamkit.hf.generate` for every call beamkit reproduces
    exactly; any other call (a setting beamkit.hf refuses as :class:`~beamkit.hf.Unsupported`, per-step score
    tables, and sampling, which beamkit.hf.generate does but with its own random stream) runs Hugging Face's
    original ``generate``, with one log line per reason (logger ``beamkit.hf``). Bad input raises as with
    :func:`beamkit.hf.generate`. Returns a :class:`Patch`; ``with beamkit.hf.patch(model): ...`` restores the
    original at exit, ``patch(model).undo()`` likewise. Pipelines built on the model
    (``transformers.pipeline("text-generation", model=model, ...)``) go through the patched ``generate``
    unchanged.
    """
    return Patch(model)
