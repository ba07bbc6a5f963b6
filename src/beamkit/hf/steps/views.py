"""Views of a caller's model that differ from it in one part, built beside it: the model is never written to.

A step that must run the model's own forward with something changed (its layers attending through beamkit's
paged attention, its output layer computing fewer columns) runs it on a *view*: a shallow copy of the module tree
that shares every parameter, buffer and hook with the model and differs only where asked. The model, its config
and its modules stay exactly as the caller gave them, and another thread using the model meanwhile sees nothing.
"""

from __future__ import annotations

import copy
from typing import Any

from beamkit.hf.internals import attending_with, attention_name, same_but_attention


def with_attention(model: Any, name: str, previous: Any = None) -> Any:
    """A view of ``model`` whose layers attend with the attention function registered under ``name`` in
    ``transformers``' attention registry: every module copied (parameters, buffers and hooks shared), those that
    hold the model's config given a copy of it that names ``name``. ``previous`` (a view this function made for
    the same model) is returned as it is while the model's training mode and config are unchanged; the caller
    keeps it (a step function, for its life: as with the direct step, layers replaced later are not seen)."""
    if (
        previous is not None
        and previous.training == model.training
        and same_but_attention(previous.config, model.config)
        and attention_name(previous.config) == name
    ):
        return previous
    return _copy_tree(model, model.config, attending_with(model.config, name))


def with_module(model: Any, name: str, module: Any) -> Any:
    """A view of ``model`` whose direct child ``name`` is ``module`` (``with_module(model, "lm_head", head)``):
    only the top module is copied, everything else shared."""
    view = _own_tables(model, copy.copy(model))
    view.__dict__["_modules"] = {**model._modules, name: module}
    return view


def _copy_tree(module: Any, config: Any, replacement: Any, memo: dict[int, Any] | None = None) -> Any:
    """``module`` and every module below it copied (a module met twice copied once), with ``config`` replaced
    by ``replacement`` wherever a module holds it; parameters, buffers and hooks shared."""
    memo = {} if memo is None else memo
    if id(module) in memo:
        return memo[id(module)]
    view = memo[id(module)] = _own_tables(module, copy.copy(module))
    children = module._modules.items()
    view.__dict__["_modules"] = {k: c if c is None else _copy_tree(c, config, replacement, memo) for k, c in children}
    if module.__dict__.get("config") is config:
        view.__dict__["config"] = replacement
    return view


def _own_tables(module: Any, view: Any) -> Any:
    """``view`` (a shallow copy of ``module``) given tables of its own for its parameters and buffers: the tensors
    stay shared, but a forward that assigns a tensor to one of its names (a rotary embedding that recomputes its
    frequencies for a longer input) writes into the view's table, never into the caller's module."""
    view.__dict__["_parameters"] = dict(module._parameters)
    view.__dict__["_buffers"] = dict(module._buffers)
    view.__dict__["_non_persistent_buffers_set"] = set(module._non_persistent_buffers_set)
    return view


def alias(model: Any) -> Any:
    """An object of the model's class that shares the model's attribute dictionary: it reads whatever the model
    holds now and later (its modules, config, training mode) but does not refer to the model object itself, so
    something kept beside the model (a compiled step in a weak-keyed registry) does not keep the model alive."""
    twin = object.__new__(type(model))
    object.__setattr__(twin, "__dict__", model.__dict__)
    return twin
