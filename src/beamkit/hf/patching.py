"""``beamkit.hf.patch(model)``: ``model.generate`` runs through beamkit where beamkit reproduces it exactly.

Each call goes to the first that takes it: beamkit's engine bridge (:func:`beamkit.hf.generation.prepare`), then
beamkit's decoding loop inside Hugging Face's own ``generate`` (:mod:`beamkit.hf.loop`), then Hugging Face's own
decoding method, with the reason logged once. No call breaks that Hugging Face would serve: whatever the bridge
refuses or rejects (a check stricter than Hugging Face's) goes on to the loop, where Hugging Face's own checks
decide.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from beamkit._checks import check_bool
from beamkit.hf.generation import generate_in_loop, prepare
from beamkit.hf.inputs import check_model
from beamkit.hf.settings import Settings, Unsupported
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
        """One patched call: the engine bridge, else beamkit's loop in Hugging Face's generate, else Hugging
        Face's own."""
        job = None
        if len(args) <= 2:
            inputs = args[0] if args else None
            second = args[1] if len(args) > 1 else None
            try:
                job = prepare(self.model, inputs, second, kwargs, exact_only=True)
            except (ValueError, TypeError):  # Unsupported among them: the loop or Hugging Face decides
                job = None
            if job is not None and not self.fast and _plain_beam_search(job.settings):
                job = None  # beam search ranks by float64 sums on the engine: exact only to float32 near-ties
        if job is not None:
            try:
                return job()
            except BatchDecodeError:  # a request the engine refused (nothing of the caller's was changed)
                pass
        try:
            return generate_in_loop(self.model, args, kwargs, self.original)
        except Unsupported as err:  # raised before anything ran: Hugging Face's own method runs the call
            return self._fall_back(str(err), args, kwargs)

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


def _plain_beam_search(settings: Settings) -> bool:
    """Whether the engine bridge would run a plain beam search (not greedy, not diverse or constrained beam
    search, which the loop does not decode)."""
    return settings.num_beams > 1 and settings.groups == 1 and not settings.force_words


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
