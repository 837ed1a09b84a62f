"""`pytest --stream ray|rest`: the suite in two parts, which `make test-all` runs side by side (tests/both_streams).

"ray" is every module holding a test marked `ray` or `cluster` (every test that starts a local Ray instance or a
cluster is so marked), "rest" every other module. So one process starts every Ray instance and cluster of the
suite, one at a time as the whole suite would, and a module is never split: its module-scoped fixtures (a cluster,
a PostgreSQL, a Prefect server) start once. A pytest plugin loaded by tests/conftest.py.
"""
from __future__ import annotations

import pytest

STREAMS = ("ray", "rest")
RAY_MARKERS = ("ray", "cluster")


def pytest_addoption(parser):
    parser.addoption("--stream", choices=STREAMS, default=None,
                     help="run only the modules that start Ray (ray) or only the others (rest)")


def ray_modules(items: list[pytest.Item]) -> set:
    return {item.path for item in items if any(item.get_closest_marker(m) for m in RAY_MARKERS)}


def pytest_collection_modifyitems(config, items):
    stream = config.getoption("stream")
    if stream is None:
        return
    ray = ray_modules(items)
    keep = [item for item in items if (item.path in ray) == (stream == "ray")]
    if len(keep) < len(items):
        kept = set(map(id, keep))
        config.hook.pytest_deselected(items=[item for item in items if id(item) not in kept])
        items[:] = keep
