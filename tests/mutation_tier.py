"""The tests mutmut runs against each mutant (`make mutate`, loaded with `-p tests.mutation_tier`): the fast tier
without the tests that run a flow on the session's Prefect API. Those take about a second each and reach nearly
every function, so one surviving mutant would cost minutes; the kernel-level tests decide in milliseconds.
What only a flow run can reach shows as "no test reaches it" in the score (tests/mutation_score.py)."""
from __future__ import annotations

FLOW_FIXTURES = {"prefect_api", "run"}


def pytest_collection_modifyitems(config, items):
    kept = [item for item in items if not FLOW_FIXTURES & set(getattr(item, "fixturenames", ()))]
    dropped = [item for item in items if item not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
