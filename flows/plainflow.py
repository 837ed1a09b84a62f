"""`plain_flow`: Prefect's `@flow`, for flows whose parameters are plain JSON values (str, int, float, bool, None).

Prefect records a flow run's parameters through FastAPI's `jsonable_encoder` (`Flow.serialize_parameters`), and
importing `fastapi.encoders` imports all of FastAPI and Starlette: ~0.1 s of a one-shard run, which with a kept
Prefect server lies on the critical path. For those plain values `jsonable_encoder` returns each value as it is,
so this flow does the same without the import; any other value goes through Prefect's own method. The flow run,
its parameters in the UI and a deployment's entry point are the same as with `@flow`.
"""
from __future__ import annotations

from typing import Any

from prefect.flows import Flow

PLAIN = (str, int, float, bool, type(None))


class PlainParameterFlow(Flow):
    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        if all(type(value) in PLAIN for value in parameters.values()):
            return dict(parameters)
        return super().serialize_parameters(parameters)


def plain_flow(**options):
    """`@flow(**options)` as a PlainParameterFlow."""
    def decorate(fn):
        return PlainParameterFlow(fn=fn, **options)
    return decorate
