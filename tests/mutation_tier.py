"""The tests mutmut runs against each mutant (`make mutate`, loaded with `-p mutation_tier`): the fast tier
without the tests that run a flow on the session's Prefect API. Those take about a second each and reach nearly
every function, so one surviving mutant would cost minutes; the kernel-level tests decide in milliseconds.
What only a flow run can reach shows as "no test reaches it" in the score (tests/mutation_score.py).

mutmut runs each mutant's tests in a process forked from a server that has collected them, never run one
(pyproject.toml, process_isolation). Should anything the collection imports have started fsspec's event loop, our
cached S3 filesystem or the fetch-ahead pools (tasks/storage/ahead.py), none of them survives a fork ("This class
is not fork-safe" would fail every S3 test, a false kill; work sent to a pool made before the fork never runs, a
false timeout), so each session starts them afresh. A mutant that allocates without end (a directory walk that
never ends) meets an address-space limit and fails with MemoryError, a kill, instead of taking the machine's memory."""
from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path

FLOW_FIXTURES = {"prefect_api", "run"}
ADDRESS_SPACE = 8 << 30
# mutmut sends a mutant's output to /dev/null: a process that crashes (SIGSEGV, SIGABRT) or that mutmut stops at
# its time limit (SIGXCPU) would leave no trace. Its Python stacks go to faults/<mutant name>.txt under mutmut's
# working folder (mutants/) instead; the file is removed when the session ends, so one is left only by a crash or
# a timeout (tests/mutation_score.py names it).
FAULTS = Path("faults")
_trace = None  # the open stacks file of this session's mutant


def pytest_sessionstart(session):
    global _trace
    mutant = os.environ.get("MUTANT_UNDER_TEST")
    if mutant:
        FAULTS.mkdir(exist_ok=True)
        _trace = open(FAULTS / f"{mutant}.txt", "w")  # noqa: SIM115 (open until the session ends)
        faulthandler.enable(_trace, all_threads=True)
        faulthandler.register(signal.SIGXCPU, _trace, all_threads=True, chain=True)

    import resource

    import fsspec.asyn

    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, resource.getrlimit(resource.RLIMIT_AS)[1]))

    from tasks.storage import ahead, s3

    fsspec.asyn.reset_lock()
    s3._s3.cache_clear()
    ahead._pools.cache_clear()
    ahead._waiting.clear()


def pytest_sessionfinish(session):
    global _trace
    if _trace is not None:
        faulthandler.disable()
        faulthandler.unregister(signal.SIGXCPU)
        _trace.close()
        os.unlink(_trace.name)
        _trace = None


def pytest_collection_modifyitems(config, items):
    kept = [item for item in items if not FLOW_FIXTURES & set(getattr(item, "fixturenames", ()))]
    dropped = [item for item in items if item not in kept]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
