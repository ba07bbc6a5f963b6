"""The step-wise search engine: one step loop for every search beamkit runs.

One step, for all live rows of all requests at once::

    logits, state = step_fn(state, y_prev)            # shape: (rows, V), one model call
    scores, offset = normalise(logits)                 # log-probabilities, eos masked below min_len, processors
    logp, tok, key = selector(scores, offset)          # shape: (rows, m), per-row preselection on the device
    view = rank(...)                                   # host, O(rows * m): key desc, row asc, token asc
    decision = policy.step(view)                       # survivors, pools, stop reasons (beamkit.search.policies)
    commit(decision)                                   # pools, completed requests, state = select_state(parents)

Rows are compact: a request starts with one row, a finished request leaves the batch. Any request's candidates
are ranked by the same keys whatever else is in the batch, so decoding N requests together gives exactly the
results of decoding each alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from beamkit import ops
from beamkit._checks import check_choice, check_int
from beamkit.hypothesis import Hypothesis
from beamkit.scoring import LengthPenalty
from beamkit.search.book import Book
from beamkit.search.entries import Scoring
from beamkit.search.expand import Expander
from beamkit.search.inputs import StepFn, bos_array, count_requests, eos_ids, unpack_step
from beamkit.search.options import EARLY_MODES, RequestOptions, SearchOptions, make_options
from beamkit.search.policies import make_policy
from beamkit.search.ranking import requests_of, without
from beamkit.search.records import Completed, EngineStats, Join, Rows, StepDecision, StepView, Stop, StopReason
from beamkit.search.view import Ranker
from beamkit.state import check_rows, concat_state, first_array, is_identity, select_state

if TYPE_CHECKING:
    from beamkit.search.recorder import Recorder


class Engine:
    """The step-wise search engine: requests join and leave the running rows at every step (continuous batching).

    ``Engine(step_fn, **options)`` takes the fields of :class:`SearchOptions`. The policy, selector, processors
    and the other search-wide fields are shared by all requests; ``beam_size``, ``max_len``, ``min_len``,
    ``num_return``, ``length_penalty``, ``early_stopping``, ``patience`` and ``temperature`` are defaults that each
    :meth:`add` may override. Each :meth:`step` makes one ``step_fn`` call for every live row of every
    request and returns the requests that ended at it::

        engine = Engine(model.step, beam_size=5, max_len=64, policy="pool")
        rid = engine.add(model.init_state(src), bos, eos, RequestOptions(beam_size=3))
        while not engine.idle:
            for done in engine.step():
                deliver(done.request_id, done.hypotheses, done.error)

    Every request gets exactly the hypotheses it would get decoded alone: candidates are ranked within their
    request, each request stops by its own rules, and what processors and selectors see of a row (the step,
    the token history) is that request's own. Joining mid-flight: the running state and the new states are
    joined with :func:`beamkit.concat_state` (``[running, new...]``, rows in request order), and the new rows
    get their ``bos`` as ``y_prev``; see the README for what a step function must do to allow it.

    ``on_step_error``: what happens when ``step_fn`` (or a processor, selector or final scorer) raises or returns
    something malformed (the whole call is lost, so every request in it is): ``"fail"`` completes each of them
    with the error, ``"raise"`` re-raises. ``stats_window``: keep only about that many calls in the per-call
    lists of :attr:`stats` (a long-running server); ``None`` keeps all.

    Request ids are the engine's own, counting from 0. Internally a request lives in a *slot* of the per-request
    arrays; slots of completed requests are reclaimed (renumbered in order) when many have piled up, so a
    long-running engine stays as large as the requests it holds. Processors and selectors see slots in
    ``StepContext.request``: equal to the ids while no slot was reclaimed (always, for a closed batch).
    """

    def __init__(
        self,
        step_fn: StepFn,
        options: SearchOptions | None = None,
        *,
        on_step_error: Literal["fail", "raise"] = "fail",
        stats_window: int | None = None,
        **fields: Any,
    ):
        if not callable(step_fn):
            raise TypeError(
                f"step_fn must be callable as step_fn(state, y_prev) -> (logits, new_state), got {step_fn!r}"
            )
        check_choice("on_step_error", on_step_error, ("fail", "raise"))
        if options is not None and fields:
            raise TypeError("give Engine either options= or keyword fields, not both")
        self._need_max_len = options is None and "max_len" not in fields
        if options is None:
            options = make_options(fields.pop("beam_size", 1), fields.pop("max_len", 1), **fields)
        self.options = options  # the shared fields, and the defaults of the per-request ones
        self.step_fn = step_fn
        self.on_step_error = on_step_error
        self.stats_window = stats_window  # keep only about this many calls in the per-call lists (a server)
        self.policy = make_policy(options.policy, options.exact_exit)  # StepView -> StepDecision
        self.book = Book()
        self.stats = EngineStats()
        # processors that carry a per-row value (StepContext.carry): processor index -> column of Rows.carry
        procs = options.processors or ()
        carried = {i: k for k, i in enumerate(i for i, p in enumerate(procs) if getattr(p, "carries", False))}
        self._eos: list[tuple[int, ...]] = []  # distinct stop-token sets, indexed by book.eos
        self._lps: list[LengthPenalty] = []  # distinct length penalties, indexed by book.lp
        # the step's pipeline, each stage reading the book's columns (never the engine): expand -> rank -> decide
        self.expander = Expander(options, self.book, self._eos, carried)
        ordered = bool(getattr(options.selector, "ordered", False))  # see Selector
        self.ranker = Ranker(self.book, self.policy, self.expander.is_eos, ordered, options.beam_threshold)
        self.scoring = Scoring(options, self.book, self._lps)
        self._rows = Rows.start(np.zeros(0, np.int64), 0, len(carried))
        self._state: Any = None
        self._y = np.zeros(0, np.int64)  # shape: (rows,) host copy of the next y_prev
        self._ref: Any = None  # y_prev follows this array's library and device (the last logits)
        self._ref_of: Any = None  # (type, device) of the logits _ref was made for
        self._vocab: int | None = None
        self._pending: list[Join] = []
        self._fresh = False  # requests joined since the last call (their stop tokens are checked against V)
        self._cancel: set[int] = set()
        self._index_of: dict[Any, int] = {}
        self._slot: dict[int, int] = {}  # request id -> book slot, while the request is running or waiting
        self._next_id = 0
        self._stops: dict[int, Stop] = {}  # the last decision's stop reasons, by slot
        self.recorder: Recorder | None = None
        if options.record_trace:  # see beamkit.trace
            from beamkit.search.recorder import TraceContext, TraceRecorder

            context = TraceContext(self.book, options.policy, self._eos, self.scoring.penalised)
            self.recorder = TraceRecorder(context)

    # ---------------------------------------------------------------------------------------------- requests
    def add(
        self,
        init_state: Any,
        bos: int,
        eos: int | Sequence[int] | None,
        request: RequestOptions | None = None,
        **given: Any,
    ) -> int:
        """Add one request (``init_state`` has one row on axis 0 of every array leaf); it joins at the next
        :meth:`step`. ``request``: its :class:`RequestOptions` (None: the engine's own); or, for short, the same
        fields as keywords (``beam_size``, ``max_len``, ``min_len``, ``num_return``, ``length_penalty``,
        ``early_stopping``, ``patience``, ``temperature``). Returns the request id."""
        if given:
            if request is not None:
                raise TypeError("give add() either request= or the request's options as keywords, not both")
            request = RequestOptions.of(given)
        return self.add_batch(init_state, bos, eos, 1, request=request)[0]

    def add_batch(
        self,
        init_state: Any,
        bos: int | Sequence[int],
        eos: int | Sequence[int] | None,
        n: int | None = None,
        *,
        request: RequestOptions | None = None,
    ) -> list[int]:
        """Add ``n`` requests with the same options at once (``init_state`` has one row each; ``n`` defaults to
        the rows of its first array leaf, else ``len(bos)``); returns their ids, in row order. ``request``: their
        :class:`RequestOptions` (None: the engine's own), checked against the engine's shared options (a
        ``temperature`` is a sampling selector's for these requests; the deterministic selector ignores it)."""
        if request is None:
            request = RequestOptions()
        elif not isinstance(request, RequestOptions):
            raise TypeError(f"request must be a beamkit.RequestOptions, got {type(request).__name__}")
        if self._need_max_len and request.max_len is None:
            raise ValueError("max_len is needed: give it to Engine() or to add()")
        opts = request.over(self.options)  # every rule checked on the whole
        n = count_requests(init_state, bos) if n is None else n
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"the number of requests must be an integer >= 0, got {n!r}")
        check_rows(init_state, n, "init_state")
        stop = eos_ids(eos)
        bos_arr = bos_array(bos, n)
        self._reclaim()
        ids = self.book.grow(n)  # slots
        b = self.book
        b.rid[ids] = np.arange(self._next_id, self._next_id + n)
        self._slot.update(zip(b.rid[ids].tolist(), ids.tolist(), strict=True))
        self._next_id += n
        b.beam[ids] = opts.beam_size
        b.max_len[ids] = opts.max_len
        b.min_len[ids] = opts.min_len
        b.m[ids] = 2 * opts.beam_size if opts.policy == "pool" else opts.beam_size  # candidates per row
        b.pool[ids] = opts.pool_size
        b.es[ids] = EARLY_MODES[opts.early_stopping]
        b.patience[ids] = opts.patience
        b.lp[ids] = self._index(self._lps, opts.length_penalty)
        b.alpha[ids] = opts.length_penalty.alpha
        b.eos[ids] = self._index(self._eos, stop)
        b.nret[ids] = opts.num_return or 0
        b.temp[ids] = np.nan if opts.temperature is None else opts.temperature
        b.t[ids] = 0
        b.count[ids] = 0
        b.worst[ids] = b.nth[ids] = -np.inf
        if n:
            self._pending.append(Join(ids, init_state, bos_arr))
        return b.rid[ids].tolist()

    def stop_tokens(self, slot: int) -> tuple[int, ...]:
        """The stop tokens of the request in ``slot``."""
        return self._eos[int(self.book.eos[slot])]

    def _index(self, table: list[Any], value: Any) -> int:
        """Position of ``value`` in ``table`` (appended when new): per-request values stored as small ints."""
        key = (id(table), value)
        if key not in self._index_of:
            self._index_of[key] = len(table)
            table.append(value)
        return self._index_of[key]

    def _reclaim(self) -> None:
        """Renumber the slots of the requests still held (in order) once completed ones dominate the arrays."""
        b = self.book
        if b.size < 1024 or b.size < 2 * len(b.held) or self.recorder is not None:  # traces are kept by slot
            return
        remap = b.compact(np.array(sorted(b.held), dtype=np.int64))
        self._rows = replace(self._rows, req=remap[self._rows.req], _slots=None, _reqs=None)
        self._pending = [j._replace(ids=remap[j.ids]) for j in self._pending]
        self._cancel = {int(remap[r]) for r in self._cancel}
        self._slot = {int(b.rid[i]): i for i in range(b.size)}

    def cancel(self, request_id: int) -> bool:
        """Cancel a waiting or running request: its rows leave before the next model call and it completes with
        the error ``"cancelled"``. Returns False when it had already completed; an id this engine never gave out
        raises ValueError (TypeError for one that is not an integer)."""
        r = self._slot_of(request_id)
        if r is None or r in self._cancel:
            return False
        self._cancel.add(r)
        return True

    def _slot_of(self, request_id: int) -> int | None:
        """The slot of a waiting or running request, None once it has completed; an id this engine never gave
        out raises."""
        rid = check_int("request_id", request_id, 0)
        if rid >= self._next_id:
            raise ValueError(f"no request {request_id} was added to this engine")
        return self._slot.get(rid)

    def best(self, request_id: int) -> Hypothesis | None:
        """The best hypothesis of a running request so far by score, finished (its pool) or running (scored at
        its length), for streaming; None while it waits to join or once it has completed. An id this engine never
        gave out raises ValueError, as with :meth:`cancel`."""
        r = self._slot_of(request_id)
        if r is None:
            return None
        b = self.book
        rows = np.flatnonzero(self._rows.req == r)
        mine = b.table.of(r)
        found = [b.table.hypothesis(int(mine[np.argmax(b.table.score[mine])]))] if mine.size else []
        if rows.size:
            t = int(b.t[r])
            scores = self.scoring.penalised(self._rows.lp[rows], np.full(rows.size, max(t, 1)), np.full(rows.size, r))
            j = int(np.argmax(scores))
            i = int(rows[j])
            cols = slice(self._rows.tokens.shape[1] - t, None)
            found.append(
                Hypothesis(
                    tokens=self._rows.tokens[i, cols].tolist(),
                    logprob=float(self._rows.lp[i]),
                    score=float(scores[j]),
                    finished=False,
                    token_logprobs=self._rows.token_lp[i, cols].tolist(),
                    beam_indices=self._rows.beam[i, cols].tolist(),
                    key=float(self._rows.key[i]),
                )
            )
        return max(found, key=lambda h: h.score) if found else None

    @property
    def idle(self) -> bool:
        """True when no request is running or waiting."""
        return not self._pending and self._rows.req.shape[0] == 0

    @property
    def running(self) -> int:
        """Requests added and not yet completed."""
        return len(self.book.held)

    # ---------------------------------------------------------------------------------------------- one step

    def step(self) -> list[Completed]:
        """One model call for all live rows of all requests; returns the requests that ended at it."""
        out: list[Completed] = []
        joined = self._admit(out)
        n_rows = self._rows.req.shape[0]
        if n_rows == 0:
            return out
        ended: list[Completed] = []
        try:
            logits, state, extras = self._call(n_rows)
            self.stats.record_kv(state)  # KV-cache accounting (optional state hook)
            self._advance(logits, state, extras, ended)
        except Exception as exc:  # the whole call is lost: every request in it fails, the engine goes on
            if self.on_step_error == "raise":
                raise
            self._fail_all(f"{type(exc).__name__}: {exc}", out)
            return out
        out += ended
        st = self.stats
        st.model_calls += 1
        st.rows_per_call.append(n_rows)
        st.joined_per_call.append(joined)
        st.left_per_call.append(len(ended))
        if self.stats_window is not None and len(st.rows_per_call) > 2 * self.stats_window:
            for name in ("rows_per_call", "joined_per_call", "left_per_call"):
                setattr(st, name, getattr(st, name)[-self.stats_window :])
        return out

    def _advance(self, logits: Any, state: Any, extras: dict[str, Any], ended: list[Completed]) -> None:
        """Everything after the model call, as a pipeline: expand (normalise, select) -> rank (the view) ->
        decide (the policy) -> commit (the commit comes only once nothing can fail any more)."""
        rows, every = self._rows, self.recorder is not None  # every: a recorder reads every candidate
        all_rows = every or self.options.beam_threshold is not None  # each row's own m best, not shared
        (logp, tok, key), shared = self.expander.expand(logits, extras, rows, all_rows)
        rows = self.expander.with_coverage(rows, extras)
        view = self.ranker.view(rows, logp, tok, key, every, shared)
        if view is None:  # the policy reads past its requests' m best: every row's own m best, all ranked
            view = self.ranker.view(rows, *self.expander.again(logits, extras, rows), every)
            assert view is not None
        self.stats.pruned = self.ranker.pruned
        if self.recorder is not None:
            self.recorder.considered(view)
        first_new = self.scoring.next_entry
        self.scoring.call_state = state if self.options.keep_state else None  # read by entries()
        decision = self.policy.step(view, self.book, self.scoring)
        decision.first_new = first_new
        if self.book.errors:  # a failed request's candidates do not run on
            failed = np.fromiter(self.book.errors, np.int64, len(self.book.errors))
            decision.survivors = decision.survivors[~np.isin(view.cand.req[decision.survivors], failed)]
        if self.recorder is not None:
            self.recorder.decided(view, decision)
        self._commit(view, decision, state, logits, ended)

    def _commit(self, view: StepView, decision: StepDecision, state: Any, logits: Any, ended: list[Completed]) -> None:
        """Apply a decision: pools, completed requests, the new rows and their state."""
        b, rows, cand = self.book, view.rows, view.cand
        n_rows = rows.req.shape[0]
        b.commit(decision.pool, decision.counters)
        surv = decision.survivors
        s_req = cand.req[surv]
        gone = without(rows.requests(), s_req, b.size).tolist()
        self._stops = decision.stops
        if gone:
            ended += self._complete(gone)
        parents = cand.row[surv]
        new_rows = rows.extend(cand, surv)
        b.t[requests_of(s_req)] += 1
        width = int(b.t[s_req].max()) if surv.size else 0
        if width < new_rows.tokens.shape[1]:
            new_rows = new_rows.take(np.arange(surv.shape[0]), width)
        if surv.size == 0:
            state = None
        elif not is_identity(parents, n_rows):
            state = select_state(state, parents)
        self._rows, self._state, self._y = new_rows, state, cand.tok[surv]
        where = (type(logits), getattr(logits, "device", None))  # the logits' library and device
        if surv.size == 0:
            self._ref, self._ref_of = None, None
        elif where != self._ref_of:  # an empty array in that library and on that device, not the data
            self._ref, self._ref_of = ops.like(self._y[:0], logits), where

    def _admit(self, out: list[Completed]) -> int:
        """Before a call: join the waiting requests, then drop the rows of cancelled ones; returns how many
        requests joined. Requests whose state cannot join the running state fail alone."""
        joined = 0
        if self._pending:
            pending, self._pending = self._pending, []
            try:
                self._join(pending)
                joined = sum(j.ids.shape[0] for j in pending)
            except Exception:
                if self.on_step_error == "raise":
                    raise
                for j in pending:  # find the ones that cannot join
                    try:
                        self._join([j])
                        joined += j.ids.shape[0]
                    except Exception as exc:
                        for r in j.ids.tolist():
                            self.book.errors[r] = f"cannot join the running state: {type(exc).__name__}: {exc}"
                        out += self._complete(j.ids.tolist())
        if self._cancel:
            gone = np.fromiter(self._cancel, np.int64)
            self._cancel = set()
            keep = np.flatnonzero(~np.isin(self._rows.req, gone))
            if keep.shape[0] < self._rows.req.shape[0]:
                self._rows = self._rows.take(keep)
                self._y = self._y[keep]
                self._state = select_state(self._state, keep) if keep.size else None
            for r in gone.tolist():
                self.book.errors[r] = "cancelled"
            out += self._complete(gone.tolist())
        return joined

    def _join(self, pending: list[Join]) -> None:
        """Join waiting requests to the running rows (state first: it is the part that can fail)."""
        states = [j.state for j in pending]
        if self._rows.req.shape[0]:
            state = concat_state([self._state, *states])
        else:
            state = states[0] if len(states) == 1 else concat_state(states)
            self._ref, self._ref_of = first_array(states[0]), None
        ids = np.concatenate([j.ids for j in pending])
        self._state = state
        self._rows = self._rows.join(ids)
        self._y = np.concatenate([self._y, *[j.bos for j in pending]])
        self._fresh = True

    def _call(self, n_rows: int) -> tuple[Any, Any, dict[str, Any]]:
        """Run ``step_fn`` on the live rows and check what it returned."""
        y_prev = self._y if self._ref is None else ops.like(self._y, self._ref)
        logits, state, extras = unpack_step(self.step_fn(self._state, y_prev))
        ops.check_logits(logits, n_rows)
        width = int(logits.shape[1])
        if self._vocab is None:
            self._vocab = width
        elif width != self._vocab:
            raise ValueError(
                f"step_fn returned logits of width {width}, but {self._vocab} before: the vocabulary must not change"
            )
        check_rows(state, n_rows, "the state step_fn returned")
        if self.options.coverage_penalty is not None and "attention" not in extras:
            raise ValueError("coverage_penalty needs step_fn to return extras={'attention': [rows, S]}")
        if self._fresh:  # requests joined since the last call: their stop tokens must be token ids
            self._fresh = False
            b = self.book
            for r in requests_of(self._rows.req[b.t[self._rows.req] == 0]).tolist():
                stop = self._eos[b.eos[r]]
                if any(not 0 <= e < width for e in stop):
                    b.errors[r] = f"eos={list(stop)} is not a token id of the model's vocabulary of {width}"
        return logits, state, extras

    def _fail_all(self, message: str, out: list[Completed]) -> None:
        """The call failed as a whole: every request in it completes with ``message``."""
        failed = self._rows.requests().tolist()
        for r in failed:
            self.book.errors[r] = message
        out += self._complete(failed)
        self._rows = self._rows.take(np.zeros(0, np.int64))
        self._state, self._ref, self._ref_of, self._y = None, None, None, np.zeros(0, np.int64)

    def _complete(self, slots: list[int]) -> list[Completed]:
        """Hand out the requests (slots) ``slots``: each one's ranked hypotheses or its error; the slots are free
        from now on."""
        out = []
        for r, (pool, error) in self.book.release(slots).items():
            rid = int(self.book.rid[r])
            self._slot.pop(rid, None)
            steps = int(self.book.t[r]) + (0 if error == "cancelled" else 1)
            done = Completed(rid, [] if error else self.scoring.rank(r, pool), error, steps)
            if self.recorder is not None:
                done.trace = self.recorder.closed(r, done, self._stop_of(r, error))
            out.append(done)
        return out

    def _stop_of(self, r: int, error: str | None) -> Stop | None:
        """Why request (slot) r stopped: its error, else what the last decision said."""
        if error == "cancelled":
            return Stop(StopReason.CANCELLED, "cancelled")
        if error is not None:
            return Stop(StopReason.ERROR, f"error: {error}")
        return self._stops.get(r)
