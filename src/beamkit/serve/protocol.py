"""The OpenAI completions request, checked field by field, and the error objects the server answers with.

Every problem raises :class:`ApiError` naming the field (``param``) before anything reaches the engine.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from beamkit._checks import check_int
from beamkit.adapters import Ask, ModelAdapter
from beamkit.scoring import LengthPenalty
from beamkit.search.options import EarlyStopping

MAX_STOP = 4  # as OpenAI
MAX_BODY_BYTES = 1 << 20  # a completions body of 1 MiB at most (413 beyond)
MAX_REQUEST_COST = 64 * 16 * 256  # prompts x beam width x max_tokens of one request at most (400 beyond)
MAX_PROMPTS = 64  # prompts in one request (each is one engine request)
MAX_BEST_OF = 1000  # beam width ('best_of') and returned hypotheses ('n') of one request at most
ECHO_LIMIT = 200  # characters of a client's input an error message quotes at most
MAX_MESSAGE = 1000  # characters of an error message at most (a decoding error may quote anything)
# fields OpenAI clients may send that change nothing for a beam search
IGNORED = frozenset({"user", "seed", "stream_options", "echo_prompt"})
KNOWN = frozenset(
    {
        "model",
        "prompt",
        "max_tokens",
        "n",
        "best_of",
        "use_beam_search",
        "length_penalty",
        "early_stopping",
        "min_tokens",
        "stop",
        "logprobs",
        "stream",
        "temperature",
        "echo",
        "trie",
    }
)


@dataclass(frozen=True)
class Limits:
    """A server's limits, checked when made (ValueError naming the field): on one request, its body's bytes and
    its cost (prompts x beam width x ``max_tokens``); on the engine, ``max_rows`` beam rows at most (a request's
    beam must fit; a job is admitted when its beam fits next to the running ones), ``max_queue`` requests waiting
    at most (a request waits while any of its jobs has not joined the engine, however many prompts it has), and
    ``request_rows`` rows one request holds at most once it has a job running (None: half of ``max_rows``)."""

    max_body_bytes: int = MAX_BODY_BYTES
    max_request_cost: int = MAX_REQUEST_COST
    max_rows: int = 256
    max_queue: int = 64
    request_rows: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_request_cost", "max_rows", "max_queue"):
            check_int(name, getattr(self, name), 1)
        check_int("request_rows", self.rows_per_request, 1, self.max_rows)

    @property
    def rows_per_request(self) -> int:
        """Rows one request holds at most: ``request_rows``, or half of ``max_rows``."""
        return max(1, self.max_rows // 2) if self.request_rows is None else self.request_rows


class ApiError(Exception):
    """An error answered as OpenAI's ``{"error": {"message", "type", "param", "code"}}`` with ``status``."""

    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        message = message if len(message) <= MAX_MESSAGE else f"{message[:MAX_MESSAGE]}..."
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def body(self) -> dict[str, Any]:
        """The JSON error object."""
        code = {
            401: "invalid_api_key",
            404: "model_not_found",
            413: "request_too_large",
            503: "server_busy",
            500: "decoding_failed",
        }.get(self.status)
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": code}}


@dataclass(frozen=True)
class Completion:
    """A checked completions request: one engine request per prompt, all with the same options."""

    prompts: tuple[str, ...]
    prompt_ids: tuple[tuple[int, ...], ...]
    max_tokens: int
    n: int
    beam: int
    length_penalty: float | None  # None: the model's own (a Hugging Face model's generation config)
    early_stopping: EarlyStopping | None  # None: the model's own
    min_tokens: int
    stop: tuple[str, ...]
    logprobs: bool
    stream: bool
    trie: str | None = None  # the dictionary (``serve --trie NAME=FILE``) the outputs are constrained to

    def ask(self) -> Ask:
        """What the request asks of the model (the model's adapter turns it into the engine's
        :class:`beamkit.RequestOptions`); limits a model counts from the prompt count from the longest one."""
        longest = max(len(ids) for ids in self.prompt_ids)
        return Ask(
            self.beam, self.n, self.max_tokens, self.length_penalty, self.early_stopping, self.min_tokens, longest
        )


def _shown(value: Any) -> str:
    """``value`` as JSON for an error message, cut to :data:`ECHO_LIMIT` characters: errors never echo a whole
    input back. Non-finite numbers read ``NaN`` / ``Infinity`` (the message is text, not a JSON value)."""
    return _cut(json.dumps(value))


def _cut(text: str) -> str:
    """``text`` cut to :data:`ECHO_LIMIT` characters (an error message quoting a client's input)."""
    return text if len(text) <= ECHO_LIMIT else f"{text[:ECHO_LIMIT]}... ({len(text)} characters)"


def _int(body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer, got {_shown(value)}", name)
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ApiError(400, f"'{name}' must be {bound}, got {_shown(value)}", name)
    return value


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false, got {_shown(value)}", name)
    return value


def _prompts(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and value and all(isinstance(p, str) for p in value):
        if len(value) > MAX_PROMPTS:
            raise ApiError(400, f"'prompt' holds {len(value)} prompts; at most {MAX_PROMPTS}", "prompt")
        return tuple(value)
    raise ApiError(400, "'prompt' must be a string or a non-empty list of strings", "prompt")


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying why not. ``NaN`` and ``Infinity`` are read as numbers
    (some clients send them), so that the field they are in refuses them by name."""
    try:
        body = json.loads(raw)
    except RecursionError as exc:
        raise ApiError(400, "the body is not valid JSON: it is nested too deeply") from exc
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise ApiError(400, f"the body is not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    return body


def parse_completion(body: dict[str, Any], adapter: ModelAdapter) -> Completion:
    """Check a completions body against the served model; raise :class:`ApiError` naming the first bad field.
    The envelope first (unknown fields, the model, a prompt), then each entry of :data:`FIELDS` in order."""
    unknown = sorted(set(body) - KNOWN - IGNORED)
    if unknown:
        raise ApiError(400, f"unknown field '{unknown[0]}'", unknown[0])
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError(400, "'model' must be a string naming the served model", "model")
    if model != adapter.name:
        raise ApiError(404, f"the model '{model}' does not exist; this server runs '{adapter.name}'", "model")
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required", "prompt")
    got: dict[str, Any] = {}
    for name, read in FIELDS:
        value = read(body, adapter, got)
        if name is not None:
            got[name] = value
    return Completion(**got)


Reader = Callable[[dict[str, Any], ModelAdapter, dict[str, Any]], Any]


def _read_prompts(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> tuple[str, ...]:
    return _prompts(body["prompt"])


def _refuse_echo(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> None:
    if _bool(body, "echo"):
        raise ApiError(400, "'echo' is not supported", "echo")


def _refuse_sampling(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> None:
    temperature = body.get("temperature")
    if temperature is not None and temperature != 0 and temperature != 1:
        raise ApiError(400, "'temperature' must be 0 or 1: beam search does not sample", "temperature")


def _read_beam(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> int:
    """The beam width: ``best_of``, else ``n`` (``use_beam_search`` needs a width above one)."""
    n = got["n"]
    beam_search = _bool(body, "use_beam_search")
    best_of = _int(body, "best_of", None, 1, MAX_BEST_OF)
    beam = best_of if best_of is not None else n
    if beam_search and best_of is None and n == 1:
        raise ApiError(400, "'use_beam_search' needs 'best_of' (the beam width) or 'n' > 1", "best_of")
    if n > beam:
        raise ApiError(400, f"'n' ({n}) must not exceed 'best_of' ({beam}), the beam width", "n")
    return beam


def _read_length_penalty(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> float | None:
    """``length_penalty`` checked by the search's own rule at ``max_tokens`` (None: the model's own; checked as
    the default 1)."""
    alpha = body.get("length_penalty")
    checked = 1.0 if alpha is None else alpha
    finite = isinstance(checked, int) or (isinstance(checked, float) and math.isfinite(checked))
    if isinstance(checked, bool) or not finite:
        raise ApiError(400, f"'length_penalty' must be a finite number, got {_shown(checked)}", "length_penalty")
    try:  # the search's own rule: |alpha| <= 100 and lp(max_tokens) within the float range
        LengthPenalty(float(checked)).check_max_len(got["max_tokens"])
    except OverflowError as exc:  # an integer beyond any float
        raise ApiError(
            400, f"'length_penalty' must be a finite number, got {_shown(checked)}", "length_penalty"
        ) from exc
    except ValueError as exc:
        raise ApiError(400, f"'length_penalty': {_cut(str(exc))}", "length_penalty") from exc
    return None if alpha is None else float(alpha)


def _read_early_stopping(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> EarlyStopping | None:
    early = body.get("early_stopping")
    if not (early is None or isinstance(early, bool) or early == "never"):
        raise ApiError(400, "'early_stopping' must be true, false or \"never\"", "early_stopping")
    return early  # type: ignore[no-any-return]


def _read_stop(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    stops: tuple[str, ...]
    if stop is None:
        stops = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop) and len(stop) <= MAX_STOP:
        stops = tuple(stop)
    else:
        raise ApiError(400, f"'stop' must be a string or a list of at most {MAX_STOP} strings", "stop")
    if any(s == "" for s in stops):
        raise ApiError(400, "'stop' strings must not be empty", "stop")
    return stops


def _read_trie(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> str | None:
    trie = body.get("trie")
    if trie is not None and not isinstance(trie, str):
        raise ApiError(400, f"'trie' must be the name of a dictionary the server loaded, got {_shown(trie)}", "trie")
    return trie


def _read_prompt_ids(body: dict[str, Any], adapter: ModelAdapter, got: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    """Each prompt's token ids, within the model's prompt length and, with ``max_tokens``, its positions."""
    ids = []
    max_tokens = got["max_tokens"]
    for p in got["prompts"]:
        try:
            tokens = adapter.encode(p)
        except (ValueError, TypeError) as exc:
            raise ApiError(400, f"'prompt': {_cut(str(exc))}", "prompt") from exc
        if len(tokens) > adapter.max_prompt_tokens:
            raise ApiError(
                400,
                f"'prompt' has {len(tokens)} tokens; this model takes at most {adapter.max_prompt_tokens}",
                "prompt",
            )
        if adapter.context is not None and len(tokens) + max_tokens > adapter.context:
            raise ApiError(
                400,
                f"'prompt' has {len(tokens)} tokens and 'max_tokens' is {max_tokens}: together more than the model's "
                f"{adapter.context} positions",
                "prompt",
            )
        ids.append(tuple(tokens))
    return tuple(ids)


# The fields of a completions body in the order they are checked: (the Completion field it fills, or None for a
# check alone; its reader, given the body, the served model and the fields read so far).
FIELDS: tuple[tuple[str | None, Reader], ...] = (
    ("prompts", _read_prompts),
    (None, _refuse_echo),
    (None, _refuse_sampling),
    ("max_tokens", lambda b, a, got: _int(b, "max_tokens", a.default_max_tokens, 1, a.max_tokens_limit)),
    ("n", lambda b, a, got: _int(b, "n", 1, 1, MAX_BEST_OF)),
    ("beam", _read_beam),
    ("length_penalty", _read_length_penalty),
    ("early_stopping", _read_early_stopping),
    ("min_tokens", lambda b, a, got: _int(b, "min_tokens", 0, 0, got["max_tokens"])),
    ("stop", _read_stop),
    ("logprobs", lambda b, a, got: _int(b, "logprobs", None, 0, 1) is not None),
    ("trie", _read_trie),
    ("prompt_ids", _read_prompt_ids),
    ("stream", lambda b, a, got: _bool(b, "stream")),
)


def trim_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """``text`` cut before its first stop string (OpenAI leaves the stop string out); whether one was found."""
    cut = min((i for i in (text.find(s) for s in stops) if i >= 0), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)
