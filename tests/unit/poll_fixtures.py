"""A ``poll.Poll`` on a context whose two clocks the test sets, for the steps of a poll that read status and the
process's memory (which memory, which status to compare with, whether the first poll is due, the record the
autoscaler resumes from). No API server and no Kafka: a test that reaches them gets an error."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import kopf

from keyorder_operator.context import OperatorContext
from keyorder_operator.poll import Poll
from keyorder_operator.spec import parse_spec

INTERVAL = 15
"""The resources' ``scaling.pollIntervalSeconds``."""
TICK = 5.0
"""The operator's ``--tick``."""

SPEC = parse_spec(
    {
        "kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["orders"], "groupId": "orders"},
        "handler": {"image": "registry.example/orders:1.0", "handler": "orders.handler:handle"},
        "scaling": {"pollIntervalSeconds": INTERVAL},
    }
)


@dataclass
class Clocks:
    """The wall clock (``now``, seconds since the epoch) and the monotonic one, moved by the test."""

    wall: float
    monotonic: float

    def advance(self, seconds: float) -> None:
        """Time passes: both clocks move on."""
        self.wall += seconds
        self.monotonic += seconds


def poll_context(clocks: Clocks, **settings: Any) -> OperatorContext:
    """An operator context on ``clocks`` (built, so started, at their current time) with no Kubernetes client."""
    return OperatorContext(
        kube=None,  # type: ignore[arg-type]
        clock=lambda: clocks.wall,
        monotonic=lambda: clocks.monotonic,
        tick_seconds=TICK,
        **settings,
    )


def poll_of(
    context: OperatorContext,
    status: dict[str, Any] | None = None,
    *,
    name: str = "orders",
    uid: str = "0b9a7e0e-1f4c-4d0a-9c57-5d8e3f6a2b10",
    created: str = "2025-01-01T00:00:00Z",
) -> Poll:
    """The poll kopf's timer builds on a tick at the context's current time (``reconcile.autoscale``), of an
    OrderedConsumer ``name`` created at ``created`` whose watched body has ``status``."""
    meta = {"namespace": "default", "name": name, "uid": uid, "creationTimestamp": created}
    body = {"metadata": meta, "spec": {}, "status": status or {}}
    return Poll(context, body, meta, SPEC, dict(status or {}), kopf.Patch(), context.clock())
