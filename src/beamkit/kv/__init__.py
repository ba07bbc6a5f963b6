"""Key/value caches for step functions: a paged cache whose beams share prefix blocks (copy-on-write), and
attention that reads a request's shared blocks once for all its beams."""

from beamkit.kv.attention import PrefixPlan, plan_prefix, shared_prefix_attention
from beamkit.kv.paged import CacheFullError, PagedKVCache, PagedRows, Pages

__all__ = [
    "CacheFullError",
    "PagedKVCache",
    "PagedRows",
    "Pages",
    "PrefixPlan",
    "plan_prefix",
    "shared_prefix_attention",
]
