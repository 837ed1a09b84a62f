"""The Prefect flows, the command line and their runners (docs/architecture.md)."""
import os

# Before anything imports pyarrow (a flow run of a deployment imports flows.merge first): all of Arrow's
# allocations, the parquet reader's included, from jemalloc, which returns a shard's freed windows to the system
# (tasks/windows.py, use_returning_memory_pool); a pool chosen by the user is kept.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "jemalloc")
