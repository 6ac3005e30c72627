"""A catch-up hand-over under way when the spec changes to a batch handler: no Job is started for it.

The spec refuses a batch handler with catch-up on (a Job calls the handler once per message), but a hand-over
that began before the change still follows its steps, and ``start_job`` builds the Job from the spec as it is
now (a review found a Job started with the batch handler). It gives the group back to the pods instead and says
why. The Kubernetes client, the metrics and the poll are FAKES standing in for what ``CatchupHandover`` reads
and writes (``operator/keyorder_operator/handover.py``); the hand-over's own code runs unchanged.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from keyorder_operator.catchup import CatchupRun, Phase
from keyorder_operator.handover import CatchupHandover
from keyorder_operator.spec import parse_spec

SPEC = {
    "kafka": {"bootstrapServers": "kafka:9092", "topics": ["payments"], "groupId": "ledger"},
    "handler": {
        "image": "registry.example/ledger:2.0",
        "handler": "ledger.handler:handle_batch",
        "batch": {"maxMessages": 100},
    },
    "catchup": {"enabled": False, "image": "registry.example/ledger-spark:2.0"},
}


class FakeKube:
    """FAKE: the calls the hand-over makes while it starts a Job and gives the group back."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, Any]] = []
        self.scaled: list[int] = []

    def pod_count(self, namespace: str, selector: str) -> int:
        return 0

    def deployment_pods_reported(self, namespace: str, name: str) -> int:
        return 0

    def create_job(self, job: dict[str, Any], annotation: str) -> None:
        self.jobs.append(job)

    def scale(self, namespace: str, name: str, replicas: int, expected: int | None = None) -> int:
        self.scaled.append(replicas)
        return replicas


class _Counted:
    def labels(self, *labels: str) -> _Counted:
        return self

    def inc(self) -> None: ...

    def set(self, value: float) -> None: ...


class FakePoll:
    """FAKE: one poll of the resource, as the hand-over reads and writes it."""

    def __init__(self) -> None:
        self.spec = parse_spec(SPEC)  # valid: a batch handler, catch-up off
        self.context = SimpleNamespace(
            kube=FakeKube(), metrics=SimpleNamespace(catchups=_Counted(), catching_up=_Counted())
        )
        self.namespace, self.name = "pay", "ledger"
        self.meta = {"uid": "u", "name": "ledger", "namespace": "pay", "generation": 3}
        self.patch = SimpleNamespace(status={})
        self.status: dict[str, Any] = {}
        self.memory = SimpleNamespace(last_sample=None)
        self.now = 1000.0
        self.conditions: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []

    def other_autoscaler(self, replicas: int | None) -> bool:
        return False

    def condition(self, kind: str, status: bool, reason: str, message: str) -> None:
        self.conditions.append({"type": kind, "status": status, "reason": reason, "message": message})

    def info(self, reason: str, message: str) -> None:
        self.events.append((reason, message))

    warn = info


def test_a_hand_over_does_not_start_a_job_once_the_spec_names_a_batch_handler() -> None:
    poll = FakePoll()
    run = CatchupRun(Phase.STOPPING_PODS, "ledger-catchup-1", {"payments:0": 10}, 990.0, resume_replicas=2)
    CatchupHandover(poll).follow(run, replicas=0)  # type: ignore[arg-type]
    assert poll.context.kube.jobs == [], "a catch-up Job would call the batch handler once per message"
    assert poll.context.kube.scaled == [2], "the pods get the group back"
    reasons = [reason for reason, _message in poll.events]
    assert "CatchupFailed" in reasons
    assert any("spec.handler.batch.maxMessages 100" in message for _reason, message in poll.events)
