"""The search engine: options, records, the per-request book, policies, the step-wise engine, recorders and
drivers (see each module)."""

from beamkit.search.book import Book
from beamkit.search.drivers import BeamSearch, search_batch, traced_search
from beamkit.search.engine import Engine
from beamkit.search.inputs import StepFn, bos_array, count_requests, eos_ids, unpack_step
from beamkit.search.options import (
    EarlyStopping,
    RequestOptions,
    SearchOptions,
    make_options,
)
from beamkit.search.policies import Compete, Narrow, Policy, Pool, make_policy, survivor_mask
from beamkit.search.ranking import group_starts, rank_candidates
from beamkit.search.recorder import Recorder, TraceContext, TraceRecorder
from beamkit.search.records import (
    Candidates,
    Completed,
    EngineStats,
    PoolTable,
    Rows,
    SearchResult,
    StepDecision,
    StepView,
    Stop,
    StopReason,
)
from beamkit.search.selectors import Deterministic, Selector

__all__ = [
    "BeamSearch",
    "Book",
    "Candidates",
    "Compete",
    "Completed",
    "Deterministic",
    "EarlyStopping",
    "Engine",
    "EngineStats",
    "Narrow",
    "Policy",
    "Pool",
    "PoolTable",
    "Recorder",
    "RequestOptions",
    "Rows",
    "SearchOptions",
    "SearchResult",
    "Selector",
    "StepDecision",
    "StepFn",
    "StepView",
    "Stop",
    "StopReason",
    "TraceContext",
    "TraceRecorder",
    "bos_array",
    "count_requests",
    "eos_ids",
    "group_starts",
    "make_options",
    "make_policy",
    "rank_candidates",
    "search_batch",
    "traced_search",
    "survivor_mask",
    "unpack_step",
]
