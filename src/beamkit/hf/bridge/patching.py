"""``beamkit.hf.patch(model)``: ``model.generate`` runs through beamkit where beamkit reproduces it exactly.

Each call is routed once (:func:`beamkit.hf.bridge.route.route`): beamkit's engine bridge, else beamkit's decoding loop
inside Hugging Face's own ``generate`` (:mod:`beamkit.hf.loop`, Hugging Face's float32 arithmetic), else Hugging
Face's own decoding method, with the reason logged once. No call breaks that Hugging Face would serve: whatever
the bridge refuses or rejects (a check stricter than Hugging Face's) goes on to the loop, where Hugging Face's own
checks decide (bad input raises Hugging Face's own error).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from beamkit._checks import check_bool
from beamkit.hf.bridge.inputs import check_model
from beamkit.hf.bridge.route import route, run_route
from beamkit.hf.errors import Unsupported
from beamkit.hypothesis import BatchDecodeError

log = logging.getLogger("beamkit.hf")


class Patch:
    """A patched model's handle: ``undo()`` restores the original ``generate``; as a context manager it undoes
    at exit. ``fallbacks`` lists the reasons logged so far (each is logged once per patch)."""

    def __init__(self, model: Any, fast: bool = False):
        check_model(model)
        self._check_generates(model)
        self.fast = check_bool("fast", fast)
        if getattr(getattr(model, "generate", None), "beamkit_patch", None) is not None:
            raise ValueError("model.generate is already patched by beamkit.hf")
        self.model = model
        self.had_own = "generate" in vars(model)  # an instance attribute shadowing the class method
        self.original = model.generate
        self.fallbacks: list[str] = []

        @functools.wraps(self.original)
        def generate(*args: Any, **kwargs: Any) -> Any:
            return self._generate(args, kwargs)

        generate.beamkit_patch = self  # type: ignore[attr-defined]
        model.generate = generate

    def _generate(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """One patched call, run where :func:`beamkit.hf.bridge.route.route` sends it; a call the engine refuses at run
        time (a :class:`beamkit.BatchDecodeError`, nothing of the caller's changed) is routed again without it."""
        chosen = route(self.model, args, kwargs, patched=True, fast=self.fast)
        if chosen.kind == "engine":
            try:
                return run_route(self.model, chosen)
            except BatchDecodeError:
                chosen = route(self.model, args, kwargs, patched=True, engine=False)
        if chosen.kind == "huggingface":
            if kwargs.get("compile") not in (None, False):  # Hugging Face's generate has no such keyword
                raise Unsupported(chosen.reason)
            return self._fall_back(chosen.reason, args, kwargs)
        return run_route(self.model, chosen, self.original)

    @staticmethod
    def _check_generates(model: Any) -> None:
        """TypeError unless ``model`` has a ``generate`` to patch (a model with a language-modelling head)."""
        if not callable(getattr(model, "generate", None)):
            raise TypeError(
                f"{type(model).__name__} has no generate method to patch (a model with a language-modelling head, "
                "such as GPT2LMHeadModel rather than GPT2Model, has one)"
            )

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


def patch(model: Any, fast: bool = False) -> Patch:
    """Make ``model.generate(...)`` run through beamkit for every call beamkit reproduces exactly: greedy calls
    on beamkit's engine bridge (:func:`beamkit.hf.generate`) where it takes them, else beamkit's decoding loop
    inside Hugging Face's own ``generate`` (:mod:`beamkit.hf.loop`: Whisper, ``inputs_embeds``, per-step tables,
    sampling with Hugging Face's random stream, any model input). Calls neither takes (assisted decoding, a
    streamer, a decoding method of the caller's own, generation modes Hugging Face 5.x moved to the Hub) run
    Hugging Face's original ``generate``, with one log line per reason (logger ``beamkit.hf``). Bad input raises
    what Hugging Face raises. Beam search runs in the loop, which ranks with Hugging Face's float32 sums and tie
    order, so even near-ties come out the same; ``fast=True`` runs the beam searches the engine bridge takes on
    the engine (faster: finished requests leave the batch, paged keys/values), whose float64 sums can order
    hypotheses that tie within float32 rounding differently. Returns a :class:`Patch`;
    ``with beamkit.hf.patch(model): ...`` restores the original at exit, ``patch(model).undo()`` likewise.
    Pipelines built on the model (``transformers.pipeline("text-generation", model=model, ...)``) go through the
    patched ``generate`` unchanged.
    """
    return Patch(model, fast)
