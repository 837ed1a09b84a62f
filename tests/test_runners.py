"""Tests for flows.runners: FastRayTaskRunner on a real local Ray + Prefect server.

Uses the session `prefect_api` fixture from tests/conftest.py (prefect_test_harness).
Each Ray test starts Ray through the runner (num_cpus=2); Ray is shut down after each test.
"""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pytest
import ray
from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.context import FlowRunContext, TaskRunContext
from prefect.task_runners import ThreadPoolTaskRunner
from prefect_ray.context import remote_options

from flows.compat import thread_pool_size
from flows.runconfig import RunnerChoice
from flows.scheduler import make_runner
from flows.runners import FastRayTaskRunner, make_task_runner

pytestmark = pytest.mark.ray

NOCACHE = dict(persist_result=False, cache_policy=NO_CACHE)


@pytest.fixture(autouse=True)
def _ray_cleanup():
    yield
    ray.shutdown()


def runner(**kw) -> FastRayTaskRunner:
    from prefect.settings import PREFECT_API_URL

    r = make_task_runner(api_url=PREFECT_API_URL.value(), **kw)
    r.init_kwargs.update(num_cpus=2, include_dashboard=False)
    return r


# ---------------------------------------------------------------- tasks


@task(**NOCACHE)
def inc(x: int) -> int:
    return x + 1


@task(**NOCACHE)
def make_table(n: int) -> pa.Table:
    return pa.table({"id": list(range(n)), "score": [float(i) for i in range(n)]})


@task(**NOCACHE)
def double_scores(t: pa.Table) -> pa.Table:
    return t.set_column(1, "score", pa.compute.multiply(t["score"], 2.0))


@task(**NOCACHE)
def total(t: pa.Table) -> float:
    return pa.compute.sum(t["score"]).as_py()


@task(retries=2, retry_delay_seconds=0, **NOCACHE)
def flaky(x: int) -> int:
    if TaskRunContext.get().task_run.run_count <= 1:
        raise RuntimeError("first attempt fails")
    return x * 10


@task(**NOCACHE)
def boom(x: int) -> int:
    raise ValueError(f"boom {x}")


@task(**NOCACHE)
def assigned_resources() -> dict:
    return dict(ray.get_runtime_context().get_assigned_resources())


@task(task_run_name="square-{x}", **NOCACHE)
def square(x: int) -> int:
    return x * x


# ---------------------------------------------------------------- tests


def test_a_local_instance_gets_the_runtime_envs_variables_by_inheritance(monkeypatch):
    """A local instance's raylet and workers are this process's children: the runtime env's variables go into
    this process's environment only while ray.init starts them (Ray then uses the workers it started with the
    instance), the rest of the runtime env stays, and the environment is as it was afterwards."""
    from flows.runners import environment, inherited_env

    kwargs = {"log_to_driver": False, "runtime_env": {"env_vars": {"A": "1", "B": "2"}, "pip": ["x"]}}
    rest, env_vars = inherited_env(kwargs)
    assert rest == {"log_to_driver": False, "runtime_env": {"pip": ["x"]}} and env_vars == {"A": "1", "B": "2"}
    assert inherited_env({"runtime_env": {"env_vars": {"A": "1"}}}) == ({}, {"A": "1"})
    monkeypatch.setenv("A", "before")
    monkeypatch.delenv("B", raising=False)
    with environment(env_vars):
        assert (os.environ["A"], os.environ["B"]) == ("1", "2")
    assert os.environ["A"] == "before" and "B" not in os.environ


def test_make_task_runner_choices():
    tp = make_runner(RunnerChoice(max_workers=3))
    assert isinstance(tp, ThreadPoolTaskRunner) and thread_pool_size(tp) == 3
    assert isinstance(make_runner(RunnerChoice(use_ray=True, ray_address="auto")), FastRayTaskRunner)
    r = make_task_runner(
        "auto", task_cpus=1.5, task_memory_gb=0.5, api_url="http://10.0.0.1:4200/api",
        init_kwargs={"runtime_env": {"env_vars": {"A": "1"}}},
    )
    assert r.address == "auto"
    assert r.remote_options == {"num_cpus": 1.5, "memory": 2**29}
    assert r.init_kwargs["log_to_driver"] is False
    assert r.init_kwargs["runtime_env"]["env_vars"] == {"A": "1", "PREFECT_API_URL": "http://10.0.0.1:4200/api",
                                                        "ARROW_DEFAULT_MEMORY_POOL": "jemalloc"}
    assert r.duplicate() == r
    assert make_task_runner(debug=True).init_kwargs.get("log_to_driver", True) is True


def test_chain_of_arrow_tables(prefect_api):
    @flow(task_runner=runner())
    def f():
        return total.submit(double_scores.submit(make_table.submit(100))).result()

    assert f() == 2.0 * sum(range(100))


def test_retry_and_upstream_failure(prefect_api):
    """One Ray start for both: a retried task completes; failed upstreams give NotReady."""

    @flow(task_runner=runner())
    def f():
        retried = flaky.submit(4)
        up = boom.submit(7)
        down = inc.submit(up)
        waiter = inc.submit(1, wait_for=[up])
        for fut in (retried, down, waiter):
            fut.wait()
        exc = up.result(raise_on_failure=False)
        return (
            (retried.result(), retried.state.name),
            (up.state.type.value, up.state.message, repr(exc)),
            (down.state.name, waiter.state.name),
        )

    retried, (up_type, up_msg, exc), downstream = f()
    assert retried == (40, "Completed")
    assert up_type == "FAILED" and "boom 7" in up_msg
    assert "ValueError" in exc and "boom 7" in exc
    assert downstream == ("NotReady", "NotReady")


def test_remote_options_applied(prefect_api):
    @flow(task_runner=runner(task_cpus=0.5, task_memory_gb=0.25))
    def f():
        default = assigned_resources.submit().result()
        with remote_options(num_cpus=1):
            override = assigned_resources.submit().result()
        return default, override

    default, override = f()
    assert default == {"CPU": 0.5, "memory": 2**28}
    assert override == {"CPU": 1.0, "memory": 2**28}


def test_independent_tasks_and_api_visibility(prefect_api):
    """Independent tasks give the right values; their runs reach the API with names and states."""

    @flow(task_runner=runner())
    def f():
        futs = [square.submit(i) for i in range(6)]
        return [x.result() for x in futs], str(FlowRunContext.get().flow_run.id)

    values, flow_run_id = f()
    assert values == [0, 1, 4, 9, 16, 25]
    expected = {f"square-{i}": "COMPLETED" for i in range(6)}
    # Task run states arrive as events, recorded asynchronously by the server.
    deadline = time.monotonic() + 30
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
            )
            got = {r.name: r.state.type.value if r.state else None for r in runs}
            if got == expected or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert got == expected
