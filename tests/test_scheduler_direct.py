"""The shard scheduler (flows/scheduler.py) driven directly, without a flow run or a Prefect API: `run_window`
over real Prefect futures whose concurrent futures this test completes (at once, or when it releases them),
the flow run context's result links it forgets, `Finished.error`, `ShardThreadRunner` with Prefect's task
engine replaced by a plain call (the engine itself needs an API), `make_runner` and `forwarded_env`.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import queue
import threading
import uuid
from types import SimpleNamespace

import pytest
from prefect.context import FlowRunContext
from prefect.futures import PrefectConcurrentFuture
from prefect.states import Cancelled, Completed, Crashed, Failed

from flows import compat, scheduler
from flows.interrupt import Stop
from flows.runconfig import RunnerChoice
from flows.scheduler import (FORWARDED_ENV, FORWARDED_ENV_PREFIXES, Finished, ShardThreadRunner, Window,
                             forwarded_env, make_runner, run_window)

# Under a broken scheduler a test could wait forever; pytest-timeout ends it as a failure. Each test takes
# milliseconds; the limit is short so that a mutant that hangs fails within mutmut's own limit for these tests
# (~19 s of wall time, pyproject.toml's [tool.mutmut]), a kill rather than a timeout.
pytestmark = pytest.mark.timeout(5)


class RefLike(cf.Future):
    """A wrapped future without `cancel`, as a Ray ObjectRef is."""

    @property
    def cancel(self):
        raise AttributeError("cancel")


def future_in(state, wrapped: cf.Future | None = None) -> PrefectConcurrentFuture:
    """A Prefect future over a concurrent one, completed with `state` (None: left pending)."""
    future = PrefectConcurrentFuture(uuid.uuid4(), wrapped or cf.Future())
    if state is not None:
        state.state_details.task_run_id = future.task_run_id
        future.wrapped_future.set_result(state)
    return future


class Chains:
    """`submit` for run_window: each item gets a chain of `length` futures, completed Completed((item, step))
    at once, except the last step of items in `held` (pending until `release(item)`). Records what it was
    asked."""

    def __init__(self, length: int = 1, held=(), wrapped=cf.Future, on_submit=None):
        self.length, self.held, self.wrapped, self.on_submit = length, set(held), wrapped, on_submit
        self.submitted: list = []
        self.chains: dict = {}
        self.yielded: list = []
        self.inflight_at_submit: list = []

    def __call__(self, item) -> list:
        self.inflight_at_submit.append(len(self.submitted) - len(self.yielded))
        self.submitted.append(item)
        chain = [future_in(Completed(data=(item, step)), self.wrapped()) for step in range(self.length - 1)]
        last_held = item in self.held
        last = None if last_held else Completed(data=(item, self.length - 1))
        chain.append(future_in(last, self.wrapped()))
        self.chains[item] = chain
        if self.on_submit:
            self.on_submit(item)
        return chain

    def release(self, item) -> None:
        last = self.chains[item][-1]
        last.wrapped_future.set_result(Completed(data=(item, self.length - 1)))

    def consume(self, items, max_inflight, stop=None, window=None, each=None) -> list[Finished]:
        done = []
        for finished in run_window(items, self, max_inflight, stop, window):
            self.yielded.append(finished.item)
            done.append(finished)
            if each:
                each(finished)
        return done


def request_in_order(stop: Stop, reason: str, grace: float | None = None) -> None:
    """`stop.request`, whose wake-ups (run from new threads, as a signal handler needs) are made here instead,
    so that what the test does next comes after the scheduler was woken."""
    wakers = list(stop.wakers)
    stop.wakers.clear()
    stop.request(reason, grace)
    stop.wakers.extend(wakers)
    for wake in wakers:
        wake()


# ------------------------------------------------------------------------------------ run_window: the window

@pytest.mark.parametrize("max_inflight, expected", [(0, [0] * 7), (1, [0] * 7), (3, [0, 1, 2, 2, 2, 2, 2])])
@pytest.mark.parametrize("pass_window", [True, False], ids=["window", "no-window"])
def test_the_window_bounds_what_is_in_flight_and_yields_every_item_once(max_inflight, expected, pass_window):
    chains = Chains(length=3)
    window = Window() if pass_window else None
    done = chains.consume(range(7), max_inflight, window=window)
    assert chains.inflight_at_submit == expected  # items submitted before and not yet yielded
    assert chains.submitted == list(range(7))
    assert [d.item for d in done] == list(range(7))  # completed at once: in submission order
    for d in done:
        assert d.futures == chains.chains[d.item]
        assert d.ok and d.result() == (d.item, 2)  # the last step's state
    if pass_window:
        assert window.submitted == 7 and window.abandoned == []


def test_finished_links_are_forgotten_every_forget_every_task_runs_and_at_the_end(monkeypatch):
    """Prefect keeps a link from every task result to its state for the whole flow run: the scheduler drops
    those of finished shards once FORGET_EVERY task runs have finished, and when nothing is left in flight."""
    monkeypatch.setattr(scheduler, "FORGET_EVERY", 2)
    other = Completed(data="not a shard's")
    other.state_details.task_run_id = uuid.uuid4()
    context = FlowRunContext.model_construct(run_results={id(other): (other, "task", None)})
    chains = Chains()

    def link(item):
        state = scheduler.final_state(chains.chains[item][0])
        context.run_results[id(state)] = (state, "task", None)

    chains.on_submit = link
    left = []

    def linked(finished):
        """The items whose links are left when `finished` is yielded; another task run's link stays."""
        item_of = {chains.chains[item][0].task_run_id: item for item in chains.submitted}
        states = [link[0] for link in context.run_results.values()]
        left.append(sorted(item_of[s.state_details.task_run_id] for s in states if s is not other))
        assert any(s is other for s in states)

    with context:
        chains.consume(range(5), 2, each=linked)
    assert left == [[0, 1], [2], [2, 3], [4], []]


def test_without_a_flow_run_there_are_no_links_to_forget():
    scheduler.forget_results({uuid.uuid4()})  # outside a flow run: nothing to do, no error


# -------------------------------------------------------------------------------- run_window: stopping early

@pytest.mark.parametrize("grace", [None, 600.0], ids=["no-deadline", "long-grace"])
def test_a_stop_submits_nothing_more_and_yields_what_is_in_flight(grace):
    stop, window = Stop(), Window()
    chains = Chains(length=2)
    chains.on_submit = lambda item: item == 1 and request_in_order(stop, "SIGTERM", grace)
    done = chains.consume(range(5), 2, stop, window)
    assert chains.submitted == [0, 1]
    assert [d.item for d in done] == [0, 1]
    assert window.submitted == 2 and window.abandoned == []
    assert stop.wakers == []


def test_a_stop_while_draining_the_last_items_still_waits_for_them():
    """Woken by a stop while the last items finish (nothing left to submit), the scheduler keeps waiting."""
    stop, window = Stop(), Window()
    chains = Chains(held={1})

    def then(finished):
        if finished.item == 0:
            request_in_order(stop, "--fail-fast")
            chains.release(1)

    done = chains.consume(range(2), 2, stop, window, each=then)
    assert [d.item for d in done] == [0, 1] and window.abandoned == []


@pytest.mark.parametrize("grace", [0.0, 0.2])
def test_when_the_grace_runs_out_what_is_in_flight_is_abandoned_and_cancelled(grace):
    stop, window = Stop(), Window()
    chains = Chains(length=3, held={0, 1, 2, 3})
    chains.on_submit = lambda item: item == 1 and request_in_order(stop, "SIGTERM", grace)
    done = chains.consume(range(4), 2, stop, window)
    assert done == [] and chains.submitted == [0, 1]
    assert window.submitted == 2 and window.abandoned == [0, 1]
    for item in (0, 1):
        assert chains.chains[item][-1].wrapped_future.cancelled()  # a thread pool's queued task never runs
    assert stop.wakers == []


def test_abandoning_futures_that_cannot_be_cancelled():
    """Ray's ObjectRef has no `cancel`: abandoning its futures leaves them be."""
    stop, window = Stop(), Window()
    chains = Chains(held={0}, wrapped=RefLike)
    chains.on_submit = lambda item: request_in_order(stop, "SIGTERM", 0.0)
    assert chains.consume([0], 1, stop, window) == []
    assert window.abandoned == [0]


class WatchedQueue(queue.Queue):
    """The scheduler's queue of finished items, telling the test when the scheduler waits on it."""

    waiting = threading.Event()

    def get(self, block=True, timeout=None):
        type(self).waiting.set()
        return super().get(block, timeout)


def test_a_signal_while_the_scheduler_waits_wakes_it(monkeypatch):
    """A stop requested from another thread (a signal handler's) while the scheduler waits for an item that
    never finishes, with a grace of 0: the scheduler wakes and abandons it. The item's chain has finished but
    for its last task: only the last one's end counts."""
    WatchedQueue.waiting = threading.Event()
    monkeypatch.setattr(scheduler, "queue", SimpleNamespace(Queue=WatchedQueue, Empty=queue.Empty))
    stop, window = Stop(), Window()
    chains = Chains(length=3, held={0})

    def signal_when_waiting():
        WatchedQueue.waiting.wait()
        stop.request("SIGTERM", 0.0)

    helper = threading.Thread(target=signal_when_waiting, daemon=True)
    helper.start()
    assert chains.consume([0], 1, stop, window) == []
    helper.join()
    assert window.abandoned == [0] and chains.chains[0][-1].wrapped_future.cancelled()


# --------------------------------------------------------------------------------------------- Finished.error

def finished(*states) -> Finished:
    futures = [future_in(state) for state in states]
    return Finished("a/b.parquet", futures, scheduler.final_state(futures[-1]))


def test_the_error_is_the_first_failure_of_the_chain_in_one_line():
    upstream = Failed(data=RuntimeError("upstream task failed"))
    failed = Failed(data=ValueError("key mismatch in row 3\nmore detail"))
    chain = finished(Completed(data=1), failed, upstream)
    assert not chain.ok and chain.error() == "key mismatch in row 3"
    crashed = finished(Crashed(data=OSError("worker died\ntraceback")), upstream)
    assert crashed.error() == "worker died"


def test_the_error_of_a_chain_that_ended_without_failing_is_its_last_state():
    chain = finished(Completed(data=1), Cancelled(message="run cancelled by a stop\nmore"))
    assert not chain.ok and chain.error() == "run cancelled by a stop"


# ---------------------------------------------------------------------------------------- ShardThreadRunner

@pytest.fixture
def plain_engine(monkeypatch):
    """Prefect's task engine replaced by a plain call of the task's function (the engine needs an API).
    Records what each task run was given; a parameter `gate` (an Event) holds the task until it is set."""
    calls = []

    def run_task_sync(task, task_run_id, parameters, wait_for, return_type, dependencies, context):
        calls.append(SimpleNamespace(task=task, parameters=parameters, wait_for=wait_for,
                                     dependencies=dependencies))
        if gate := parameters.get("gate"):
            assert gate.wait(timeout=30)
        state = Completed(data=task.fn(**{k: v for k, v in parameters.items() if k != "gate"}))
        state.state_details.task_run_id = task_run_id
        return state

    monkeypatch.setattr("prefect.task_engine.run_task_sync", run_task_sync)
    return calls


def square_task():
    from prefect import task

    @task
    def square(x: int) -> int:
        return x * x

    return square


def test_the_thread_runner_runs_each_task_once_and_drops_its_cancel_event(plain_engine):
    square = square_task()
    runner = ShardThreadRunner(max_workers=2)
    upstream = future_in(Completed(data=0))
    deps = {"x": set()}
    with runner:
        def submit(item):
            return [runner.submit(square, {"x": item}, wait_for=[upstream], dependencies=deps)]

        done = list(run_window(range(6), submit, 3))
        events_left = dict(compat.cancel_events_of(runner))
    assert sorted((d.item, d.result()) for d in done) == [(i, i * i) for i in range(6)]
    assert sorted(call.parameters["x"] for call in plain_engine) == list(range(6))
    assert all(call.task is square and call.wait_for == [upstream] and call.dependencies is deps
               for call in plain_engine)
    assert events_left == {}  # Prefect's keeps one Event per task run for the runner's life


def test_an_abandoning_thread_runner_leaves_without_waiting_for_running_tasks(plain_engine):
    square = square_task()
    gate = threading.Event()
    runner = ShardThreadRunner(max_workers=1)
    with runner:
        running = runner.submit(square, {"x": 2, "gate": gate})
        queued = runner.submit(square, {"x": 3})
        runner.abandon()
    try:
        assert not running.wrapped_future.done()  # left running: the exit did not wait for it
        assert queued.wrapped_future.cancelled()
    finally:
        gate.set()
    assert running.wrapped_future.result().result() == 4


# -------------------------------------------------------------------------------- make_runner, forwarded_env

@pytest.fixture
def worker_env(monkeypatch):
    """Exactly one forwarded variable, one forwarded by prefix and one that is not forwarded."""
    for name in list(os.environ):
        if name in FORWARDED_ENV or name.startswith(FORWARDED_ENV_PREFIXES):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000")
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "ERROR")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "never-forwarded")
    return {"AWS_ENDPOINT_URL": "http://127.0.0.1:5000", "PREFECT_LOGGING_LEVEL": "ERROR"}


def test_only_non_secret_settings_are_forwarded_to_ray_workers(worker_env):
    assert forwarded_env() == worker_env


def test_make_runner_threads():
    runner = make_runner(RunnerChoice(max_workers=3))
    assert type(runner) is ShardThreadRunner and compat.thread_pool_size(runner) == 3


def test_make_runner_ray_takes_every_choice(worker_env):
    from flows.runners import FastRayTaskRunner

    choice = RunnerChoice(use_ray=True, ray_address="10.0.0.5:6379", task_cpus=2.0, task_memory_gb=0.5,
                          debug=True)
    runner = make_runner(choice, api_url="http://10.0.0.1:4200/api")
    assert type(runner) is FastRayTaskRunner
    assert runner.address == "10.0.0.5:6379"
    assert runner.remote_options == {"num_cpus": 2.0, "memory": 2**29}
    assert "log_to_driver" not in runner.init_kwargs  # debug: Ray's logs reach the driver
    env_vars = runner.init_kwargs["runtime_env"]["env_vars"]
    assert {k: env_vars[k] for k in (*worker_env, "PREFECT_API_URL")} == {
        **worker_env, "PREFECT_API_URL": "http://10.0.0.1:4200/api"}
    assert "AWS_SECRET_ACCESS_KEY" not in env_vars
