"""One OrderedConsumer as one poll sees it: the resource (body, metadata, parsed spec, status), the
patch the poll writes, the poll's own conditions, and the ways a poll speaks (Events, conditions), plus
the one question both the sizing and the catch-up hand-over ask before they write replicas: does
another autoscaler scale these pods?

It sits below ``poll`` (which adds the steps of a poll: observe, decide, act, explain) and ``handover``
(the catch-up's steps), which both write through it; before, the hand-over took the whole ``Poll`` and
the poll took the hand-over, a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import kopf

from keyorder_operator.context import OperatorContext
from keyorder_operator.kube import AUTOSCALERS_SECONDS
from keyorder_operator.restart import memory_lasts
from keyorder_operator.spec import OrderedConsumerSpec
from keyorder_operator.status import condition_is, set_condition
from keyorder_operator.status_view import still_awaited, with_written


@dataclass
class PolledResource:
    """The resource, its patch and the poll's conditions (see the module docstring); ``poll.Poll`` adds the steps."""

    context: OperatorContext
    body: Any
    meta: Any
    spec: OrderedConsumerSpec
    status: dict[str, Any]
    patch: kopf.Patch
    now: float
    conditions: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.monotonic = self.context.monotonic()
        """The poll's moment on the monotonic clock (``now`` is the wall clock's): for the ages of what the
        process remembers, which a wall clock set forward or back must not change."""
        lasts = memory_lasts(self.spec.scaling.poll_interval_seconds, self.context.tick_seconds)
        self.memory = self.context.poll_memory(self.namespace, self.name, self.monotonic, lasts)
        self.active_since = self.context.looked(self.now, self.monotonic)
        # compared with the status as this process last wrote it, not the watched body that may lag behind it
        self.memory.written = still_awaited(self.status, self.memory.written, self.monotonic)
        self.status = with_written(self.status, self.memory.written)
        self.conditions = list(self.status.get("conditions") or [])

    @property
    def namespace(self) -> str:
        return str(self.meta["namespace"])

    @property
    def name(self) -> str:
        return str(self.meta["name"])

    @property
    def labels(self) -> tuple[str, str]:
        return self.namespace, self.name

    def condition(self, kind: str, active: bool, reason: str, message: str) -> None:
        self.conditions = set_condition(self.conditions, kind, active, reason, message, self.now)

    def info(self, reason: str, message: str) -> None:
        kopf.info(self.body, reason=reason, message=message)

    def warn(self, reason: str, message: str) -> None:
        kopf.warn(self.body, reason=reason, message=message)

    def other_autoscaler(self, replicas: int) -> bool:
        """Whether another autoscaler (an HPA, or KEDA's) scales this Deployment: then the operator leaves
        its replicas and the pods' workers alone and says so (``ScalingConflict``), rather than fight it.
        Asked on the first poll, whenever the replicas moved without the operator (a list at most a second
        old), and on every poll while the conflict lasts (the namespace's list, shared by its resources, at
        most ``kube.AUTOSCALERS_SECONDS`` old); a steady poll asks nothing."""
        decided = self.status.get("replicas")
        in_conflict = condition_is(self.conditions, "ScalingConflict")
        moved = not isinstance(decided, int) or decided != replicas
        if not (in_conflict or moved):
            return False
        kube = self.context.kube
        names = kube.autoscalers_of(self.namespace, self.name, max_age=0.0 if moved else AUTOSCALERS_SECONDS)
        if not names:
            if in_conflict:
                self.condition("ScalingConflict", False, "NoOtherAutoscaler", "no other autoscaler scales the pods")
            return False
        listed = ", ".join(f"HorizontalPodAutoscaler {self.namespace}/{name}" for name in names)
        message = (
            f"{listed} also scales Deployment {self.name}: two autoscalers would fight over its replicas, so "
            "keyorder leaves them (and the workers per pod) alone; delete it, or the KEDA ScaledObject that "
            "made it: keyorder scales by lag itself, pods first, then key workers per pod"
        )
        if not in_conflict:
            self.warn("ScalingConflict", message)
        self.condition("ScalingConflict", True, "OtherAutoscaler", message)
        self.condition("Scaling", False, "OtherAutoscaler", message)
        self.patch.status["replicas"] = replicas
        return True
