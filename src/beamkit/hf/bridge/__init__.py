"""The bridge: a ``generate`` call read as Hugging Face reads it and sent where it runs.

A call's arguments are merged over its generation config once and read into one frozen
:class:`~beamkit.hf.bridge.settings.Settings` (:mod:`~beamkit.hf.bridge.settings`, with the refusal tables and the
checks of its inputs in :mod:`~beamkit.hf.bridge.inputs`); :func:`~beamkit.hf.bridge.route.route` decides once,
as a printable record, whether it runs on beamkit's engine, in beamkit's loop inside Hugging Face's ``generate``
(:mod:`beamkit.hf.loop`) or in Hugging Face's own decoding. On the engine the settings become beamkit processors
(:mod:`~beamkit.hf.bridge.processors`), a search or one of its variants (:mod:`~beamkit.hf.bridge.search`) over
the step functions of :mod:`beamkit.hf.steps` (:mod:`~beamkit.hf.bridge.generation`), and Hugging Face's return
values (:mod:`~beamkit.hf.bridge.output`). :func:`~beamkit.hf.bridge.patching.patch` routes a model's own
``generate`` the same way.
"""
