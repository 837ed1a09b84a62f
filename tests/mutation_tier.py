"""The tests mutmut runs against each mutant (`make mutate`, loaded with `-p mutation_tier`): the fast tier
without the tests that run a flow on the session's Prefect API. Those take about a second each and reach nearly
every function, so one surviving mutant would cost minutes; the kernel-level tests decide in milliseconds.
What only a flow run can reach shows as "no test reaches it" in the score (tests/mutation_score.py).

mutmut runs each mutant's tests in a process forked from one that has run tests before: fsspec's event loop
and our cached S3 filesystem are not fork-safe ("This class is not fork-safe" fails every S3 test, which
mutmut would count as a kill), so each session starts them afresh; so are thread pools made before the fork
(the fetch-ahead pools of tasks/storage/ahead.py: work submitted to them in the child never runs, and every
test that fetches ahead would wait until mutmut's CPU limit, a false timeout), so they are made anew too. A mutant that allocates without end (a directory walk that never ends) meets
an address-space limit and fails with MemoryError, a kill, instead of taking the machine's memory."""
from __future__ import annotations

FLOW_FIXTURES = {"prefect_api", "run"}
ADDRESS_SPACE = 8 << 30


def pytest_sessionstart(session):
    import resource

    import fsspec.asyn

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, resource.getrlimit(resource.RLIMIT_AS)[1]))

    from tasks.storage import ahead, s3

    fsspec.asyn.reset_lock()
    s3._s3.cache_clear()
    ahead._pools.cache_clear()
    ahead._waiting.clear()


def pytest_collection_modifyitems(config, items):
    kept = [item for item in items if not FLOW_FIXTURES & set(getattr(item, "fixturenames", ()))]
    dropped = [item for item in items if item not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
