"""Key/value caches for step functions: a paged cache whose beams share prefix blocks (copy-on-write)."""

from beamkit.kv.paged import CacheFullError, PagedKVCache, PagedRows, Pages

__all__ = ["CacheFullError", "PagedKVCache", "PagedRows", "Pages"]
