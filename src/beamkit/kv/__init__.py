"""Key/value caches for step functions: a paged cache whose beams share prefix blocks (copy-on-write), attention
that reads a request's shared blocks once for all its beams, and the gather index that reads every row's
positions whole, kept from step to step."""

from beamkit.kv.attention import PrefixPlan, plan_prefix, shared_prefix_attention
from beamkit.kv.gather import GatherIndex, gather_slots
from beamkit.kv.paged import CacheFullError, PagedKVCache, PagedRows, Pages

__all__ = [
    "CacheFullError",
    "GatherIndex",
    "PagedKVCache",
    "PagedRows",
    "Pages",
    "PrefixPlan",
    "gather_slots",
    "plan_prefix",
    "shared_prefix_attention",
]
