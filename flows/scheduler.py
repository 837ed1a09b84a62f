"""The one shard scheduler of merge and verify: a bounded window of shard work over a Prefect task runner.

`run_window` submits shards while fewer than `max_inflight` are in flight and yields each as it finishes,
with the final state of its last task, so the driver never holds more than a window of futures (a 10^5-shard
run would otherwise hang or bloat on unbounded submission). `make_runner` picks the task runner from the
run's RunnerChoice: Prefect's thread pool, or Ray.
"""
from __future__ import annotations

import os
import queue
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

from prefect.context import FlowRunContext
from prefect.task_runners import ThreadPoolTaskRunner

from flows import compat
from flows.interrupt import Stop
from flows.runconfig import RunnerChoice
from tasks import storage
from tasks.errors import one_line

# Non-secret settings every Ray worker needs to behave like the driver: the storage backends' own (endpoint,
# region, retries, upload tuning) and telemetry off. Credentials never travel: each node uses its own chain.
FORWARDED_ENV = (*storage.worker_env_names(), "DO_NOT_TRACK")
FORWARDED_ENV_PREFIXES = ("PREFECT_LOGGING_",)
FORGET_EVERY = 256  # finished task runs between two sweeps of the flow run context's result links


@dataclass
class Finished:
    """One shard's work, done: the item it was submitted for, its futures (in order) and the last one's state."""

    item: Any
    futures: list
    state: Any

    @property
    def ok(self) -> bool:
        return self.state.is_completed()

    def result(self):
        return self.state.result()

    def error(self) -> str:
        """The first failure along the chain, in one line (later steps only say that their upstream failed)."""
        for future in self.futures:
            state = final_state(future)
            if state.is_failed() or state.is_crashed():
                return one_line(state.result(raise_on_failure=False))
        return one_line(self.state.result(raise_on_failure=False))


def final_state(future):
    """The state a task ended in. `wait()` first: `.state` alone may ask the API, which can lag behind."""
    future.wait()
    return future.state


class Window:
    """What one pass of `run_window` did: how many items it submitted, and which were still in flight when a
    stop's grace period ran out (abandoned: never yielded)."""

    def __init__(self):
        self.submitted = 0
        self.abandoned: list = []


def run_window(items: Iterable, submit: Callable[[Any], list], max_inflight: int, stop: Stop | None = None,
               window: Window | None = None) -> Iterator[Finished]:
    """Submit `submit(item)` (a list of futures, the shard's last task last) for each item, at most
    `max_inflight` at once; yield every submitted item once it is finished. Once `stop` is requested no new
    item is submitted; those in flight still finish and are yielded, until the stop's deadline, if it has one:
    what is still in flight then is abandoned (listed in `window.abandoned`, cancelled, not waited for)."""
    stop = stop or Stop()
    window = window or Window()
    finished: queue.Queue = queue.Queue()
    inflight: dict[int, tuple[Any, list]] = {}
    done_ids: set = set()
    wake = object()
    waker = lambda: finished.put(wake)  # noqa: E731
    stop.wakers.append(waker)

    def collect() -> Finished | None:
        """The next finished item; None when woken by a stop or when its deadline passed first."""
        try:
            ticket = finished.get(timeout=stop.remaining())
        except queue.Empty:
            return None
        if ticket is wake:
            return None
        item, futures = inflight.pop(ticket)
        done = Finished(item, futures, final_state(futures[-1]))
        done_ids.update(future.task_run_id for future in futures)
        if len(done_ids) >= FORGET_EVERY or not inflight:
            forget_results(done_ids)
            done_ids.clear()
        return done

    def drain(limit: int) -> Iterator[Finished]:
        while len(inflight) > limit and not (stop.deadline is not None and stop.remaining() == 0):
            if (done := collect()) is not None:
                yield done
            elif stop.requested and limit:
                return  # woken by a stop: submit nothing more, drain below

    try:
        for ticket, item in enumerate(items):
            yield from drain(max(1, max_inflight) - 1)
            if stop.requested:
                break
            futures = submit(item)
            window.submitted += 1
            inflight[ticket] = (item, futures)
            futures[-1].add_done_callback(lambda _f, t=ticket: finished.put(t))
        yield from drain(0)
    finally:
        stop.wakers.remove(waker)
        for item, futures in inflight.values():
            window.abandoned.append(item)
            for future in futures:  # a thread pool's queued tasks; Ray's end with this driver
                if callable(cancel := getattr(future.wrapped_future, "cancel", None)):
                    cancel()


def forget_results(task_run_ids: set) -> None:
    """Drop the flow run context's links from these task runs' results to their states. Prefect keeps one per
    result for the whole flow run (to find the upstream of a result passed on as a plain value); a finished
    shard's results go nowhere, and at 10^5 shards these links were most of the driver's memory."""
    context = FlowRunContext.get()
    if context is not None:
        compat.forget_result_links(context, task_run_ids)


class ShardThreadRunner(ThreadPoolTaskRunner):
    """Prefect's thread pool, without the cancel event it keeps per task run for the runner's whole life
    (~1 KB each, so a 10^5-shard chain held 400,000): a finished task's event is dropped. After `abandon()`
    leaving does not wait for tasks still running (an interrupted run's grace period is over)."""

    abandoning = False

    def abandon(self) -> None:
        self.abandoning = True

    def __exit__(self, *exc_info):
        if self.abandoning:
            compat.abandon_thread_pool(self)
        super().__exit__(*exc_info)

    def submit(self, task, parameters, wait_for=None, dependencies=None):
        future = super().submit(task, parameters, wait_for, dependencies)
        events = compat.cancel_events_of(self)
        future.wrapped_future.add_done_callback(lambda _f, key=future.task_run_id: events.pop(key, None))
        return future


def forwarded_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in FORWARDED_ENV or k.startswith(FORWARDED_ENV_PREFIXES)}


def make_runner(choice: RunnerChoice, api_url: str | None = None):
    """Prefect's thread pool, or a Ray task runner whose workers report to `api_url`."""
    if not choice.use_ray:
        return ShardThreadRunner(max_workers=choice.max_workers)
    from flows.runners import make_task_runner  # imports Ray: only for runs that use it

    return make_task_runner(ray_address=choice.ray_address, task_cpus=choice.task_cpus,
                            task_memory_gb=choice.task_memory_gb, debug=choice.debug, api_url=api_url,
                            init_kwargs={"runtime_env": {"env_vars": forwarded_env()}})
