"""Arrow's high-water mark of what runs inside a `with`, in a memory pool of its own."""
from __future__ import annotations

from contextlib import contextmanager

import pyarrow as pa

# Every pool arrow_peak made, kept for the process: a buffer is freed through the pool it came from, and pyarrow's
# set_memory_pool holds no reference, so a buffer that outlived a collected pool was freed through freed memory
# (the whole pytest process died of a segfault in CI; tests/test_arrowpeak.py).
PROXY_POOLS: list[pa.MemoryPool] = []


@contextmanager
def arrow_peak():
    """Arrow's high-water mark of what runs inside, in a pool of its own (pyarrow's default for the while)."""
    before = pa.default_memory_pool()
    pool = pa.proxy_memory_pool(before)
    PROXY_POOLS.append(pool)
    pa.set_memory_pool(pool)
    try:
        yield pool
    finally:
        pa.set_memory_pool(before)
