"""flows/scheduler.py at its own level: the window of shard work `run_window` keeps, what a stop does to it, and
how a finished shard names its failure, over futures the test resolves itself (`Shard`: what run_window uses of
a Prefect future, with real Prefect states), so every step happens in an order the test chose. Runs through
Prefect's and Ray's runners: tests/test_flow_local.py, tests/test_runners.py, tests/test_interrupt*.py."""
from __future__ import annotations

import concurrent.futures
import threading
import uuid

import pytest
from prefect.states import Completed, Failed

from flows import scheduler
from flows.interrupt import Stop
from flows.runconfig import RunnerChoice
from flows.scheduler import FORWARDED_ENV, Finished, ShardThreadRunner, Window, forwarded_env, make_runner, \
    run_window


class Shard:
    """A task's future: resolved by `finish(state)` (at once when given a state), cancelled by run_window."""

    def __init__(self, state=None):
        self.task_run_id = uuid.uuid4()
        self.wrapped_future: concurrent.futures.Future = concurrent.futures.Future()
        self.state = None
        if state is not None:
            self.finish(state)

    def finish(self, state) -> None:
        self.state = state
        self.wrapped_future.set_result(None)

    def add_done_callback(self, fn) -> None:
        self.wrapped_future.add_done_callback(lambda _: fn(self))

    def wait(self) -> None:
        concurrent.futures.wait([self.wrapped_future])


def test_the_window_submits_while_fewer_than_max_inflight_are_in_flight():
    events, window = [], Window()

    def submit(item):
        events.append(f"submit {item}")
        return [Shard(Completed(data=f"step-1 {item}")), Shard(Completed(data=item * 10))]

    for done in run_window(range(5), submit, max_inflight=2, window=window):
        assert done.ok and done.futures[-1].state is done.state
        events.append(f"done {done.item}: {done.result()}")
    assert events == ["submit 0", "submit 1", "done 0: 0", "submit 2", "done 1: 10", "submit 3", "done 2: 20",
                      "submit 4", "done 3: 30", "done 4: 40"]
    assert (window.submitted, window.abandoned) == (5, [])


@pytest.mark.parametrize("reason, grace", [("--fail-fast", None), ("SIGTERM", 30.0)])
def test_a_stop_submits_nothing_more_and_lets_the_shards_in_flight_finish(reason, grace):
    """Without a deadline, or within it, what is in flight finishes and is yielded."""
    stop, events = Stop(), []

    def submit(item):
        events.append(f"submit {item}")
        if item == 1:
            stop.request(reason, grace)
        return [Shard(Completed(data=item))]

    window = Window()
    for done in run_window(range(5), submit, 3, stop, window):
        events.append(f"done {done.item}")
    assert events == ["submit 0", "submit 1", "done 0", "done 1"]
    assert (window.submitted, window.abandoned, stop.wakers) == (2, [], [])


class RayStep:
    """A step whose future cannot be cancelled from here (a Ray ObjectRef has no `cancel`: it ends with the
    driver)."""

    def __init__(self):
        self.task_run_id, self.wrapped_future = uuid.uuid4(), object()


def test_what_is_in_flight_when_the_grace_runs_out_is_abandoned_and_cancelled():
    stop, shards = Stop(), []

    def submit(item):
        shards.append(Shard())
        if item == 1:
            stop.request("SIGTERM", grace=0.0)
        return [RayStep(), shards[-1]]

    window = Window()
    assert list(run_window(range(5), submit, 3, stop, window)) == []
    assert (window.submitted, window.abandoned, stop.wakers) == (2, [0, 1], [])
    assert all(s.wrapped_future.cancelled() for s in shards)


def test_the_grace_running_out_while_waiting_for_a_shard_abandons_it():
    """The wait for a shard to finish ends at the stop's deadline (here 50 ms; the shards never finish)."""
    stop, shards = Stop(), []

    def submit(item):
        shards.append(Shard())
        if item == 1:
            stop.request("SIGTERM", grace=0.05)
        return [shards[-1]]

    window = Window()
    assert list(run_window(range(5), submit, 2, stop, window)) == []
    assert (window.submitted, window.abandoned, stop.remaining()) == (2, [0, 1], 0.0)
    assert all(s.wrapped_future.cancelled() for s in shards)


def test_result_links_are_forgotten_every_so_many_task_runs_and_when_the_window_empties(monkeypatch):
    forgotten = []
    monkeypatch.setattr(scheduler, "FORGET_EVERY", 4)
    monkeypatch.setattr(scheduler, "forget_results", lambda ids: forgotten.append(set(ids)))
    chains = {}

    def submit(item):
        chains[item] = [Shard(Completed(data=1)), Shard(Completed(data=item))]
        return chains[item]

    assert [done.item for done in run_window(range(5), submit, 3)] == [0, 1, 2, 3, 4]

    def ids(*items):
        return {s.task_run_id for item in items for s in chains[item]}

    assert forgotten == [ids(0, 1), ids(2, 3), ids(4)]


def test_a_finished_chain_names_its_first_failure_in_one_line():
    first = Shard(Failed(data=ValueError("shard a.parquet: key mismatch at row 3\ntraceback follows")))
    last = Shard(Failed(data=RuntimeError("upstream task failed")))
    done = Finished("a.parquet", [Shard(Completed(data=1)), first, last], last.state)
    assert not done.ok
    assert done.error() == "shard a.parquet: key mismatch at row 3"
    crashed = Shard(Failed(data=OSError("worker died")))
    crashed.state = crashed.state.model_copy(update={"type": "CRASHED"})
    assert Finished("b", [crashed], crashed.state).error() == "worker died"
    alone = Finished("c", [], Failed(data=ValueError("only the last state")))
    assert alone.error() == "only the last state"


def test_a_run_on_threads_gets_a_shard_thread_pool_of_the_chosen_size():
    runner = make_runner(RunnerChoice(max_workers=3))
    assert type(runner) is ShardThreadRunner and runner._max_workers == 3


def test_ray_workers_get_the_storage_settings_and_logging_never_credentials(monkeypatch):
    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    monkeypatch.setenv("PREFECT_LOGGING_LEVEL", "DEBUG")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("HOME_AWS_REGION", "not-a-setting")
    env = forwarded_env()
    assert env["AWS_REGION"] == "eu-west-1" and env["PREFECT_LOGGING_LEVEL"] == "DEBUG"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "HOME_AWS_REGION" not in env
    assert set(env) <= set(FORWARDED_ENV) | {k for k in env if k.startswith("PREFECT_LOGGING_")}


@pytest.mark.parametrize("max_inflight", [0, 1])
def test_a_window_of_at_most_one_runs_one_shard_at_a_time(max_inflight):
    events = []

    def submit(item):
        events.append(f"submit {item}")
        return [Shard(Completed(data=item))]

    for done in run_window(range(3), submit, max_inflight):
        events.append(f"done {done.item}")
    assert events == ["submit 0", "done 0", "submit 1", "done 1", "submit 2", "done 2"]


@pytest.mark.parametrize("debug", [False, True])
def test_a_run_on_ray_gets_a_ray_runner_as_chosen(monkeypatch, debug):
    """Built, not started: the address, per-task resources, the API its workers report to and the settings they
    get (Ray itself quiet unless --debug)."""
    from flows.runners import FastRayTaskRunner

    monkeypatch.setenv("AWS_REGION", "eu-west-1")
    choice = RunnerChoice(use_ray=True, ray_address="10.0.0.5:6379", task_cpus=1.5, task_memory_gb=0.5,
                          debug=debug)
    runner = make_runner(choice, api_url="http://10.0.0.1:4200/api")
    assert type(runner) is FastRayTaskRunner and runner.address == "10.0.0.5:6379"
    assert runner.remote_options == {"num_cpus": 1.5, "memory": 2**29}
    env = runner.init_kwargs["runtime_env"]["env_vars"]
    assert env["PREFECT_API_URL"] == "http://10.0.0.1:4200/api" and env["AWS_REGION"] == "eu-west-1"
    assert ("log_to_driver" in runner.init_kwargs) is not debug


def test_an_abandoned_thread_pool_is_left_without_waiting_for_its_running_tasks():
    """After abandon() (the grace period is over), leaving the runner does not wait for a task still running."""
    release = threading.Event()
    runner = make_runner(RunnerChoice(max_workers=1))
    with runner:
        running = runner._executor.submit(release.wait, 10)  # a shard task that would run on for 10 s
        runner.abandon()
    try:
        assert not running.done(), "left without waiting"
    finally:
        release.set()
    assert running.result(timeout=10) is True
