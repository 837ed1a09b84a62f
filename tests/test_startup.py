"""What makes a `sidecar-ops` process start and end quickly (docs/architecture.md, "Fixed cost of a one-shard
run"): the flows' parameters recorded without FastAPI, and the garbage collector paused while it imports."""
from __future__ import annotations

import gc

import pytest

from flows import collector
from flows.plainflow import PlainParameterFlow, plain_flow


def test_both_flows_record_their_parameters_without_fastapi():
    from flows.merge import merge_flow
    from flows.verify import verify_flow

    assert isinstance(merge_flow, PlainParameterFlow) and isinstance(verify_flow, PlainParameterFlow)
    assert (merge_flow.name, verify_flow.name) == ("sidecar-merge", "sidecar-verify")


PLAIN_VALUES = {"pipeline": "pipelines/x.yaml", "output_prefix": "s3://b/out/", "overwrite": True, "retries": 3,
                "grace_seconds": 10.5, "ray_address": None, "window_mib": float("inf"), "max_inflight": -1}


def test_plain_parameters_are_recorded_as_prefects_own_encoder_records_them():
    from fastapi.encoders import jsonable_encoder

    @plain_flow(name="plain")
    def plain(**kwargs):
        return kwargs

    assert plain.serialize_parameters(PLAIN_VALUES) == {k: jsonable_encoder(v) for k, v in PLAIN_VALUES.items()}


@pytest.mark.parametrize("other", [["a", 1], {"k": "v"}, ("t",), b"bytes"])
def test_any_other_value_goes_through_prefects_method(other):
    from prefect.flows import Flow

    @plain_flow(name="plain")
    def plain(**kwargs):
        return kwargs

    values = {**PLAIN_VALUES, "other": other}
    assert plain.serialize_parameters(values) == Flow.serialize_parameters(plain, values)


@pytest.fixture
def fresh_collector(monkeypatch):
    monkeypatch.setattr(collector, "_state", "")
    was_enabled = gc.isenabled()
    yield
    gc.unfreeze()
    (gc.enable if was_enabled else gc.disable)()


def test_the_collector_is_paused_while_importing_then_runs_without_walking_the_imports(fresh_collector):
    collector.pause()
    assert not gc.isenabled()
    imported = [object() for _ in range(3)]  # tracked objects made while "importing"
    collector.resume()
    assert gc.isenabled() and gc.get_freeze_count() > 0
    collector.resume()  # idempotent
    frozen = gc.get_freeze_count()
    collector.exiting()
    assert gc.isenabled() and gc.get_freeze_count() >= frozen and imported


def test_a_process_that_never_paused_it_is_left_alone(fresh_collector):
    gc.unfreeze()
    collector.resume()
    collector.exiting()
    assert gc.isenabled() and gc.get_freeze_count() == 0
