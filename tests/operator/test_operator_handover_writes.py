"""The catch-up hand-over writes the replicas as every other step does: never over a size it has not seen, and
never while another autoscaler scales the Deployment.

The real kopf operator on the API emulator; no broker (``NoKafka``), so no hand-over is triggered by lag: the
test puts one in progress as the operator records it (``status.catchup`` in phase ``Running``, its Job active)
and plays the Job's part. ``writes_to_replicas`` records every write of the operator's scaler, with the size it
replaced; ``watch_lag`` holds the Deployment's events back, as a busy cluster delivers them to an informer.
"""

from __future__ import annotations

import time
from typing import Any

import kmock
import pytest

from keyorder_operator.kube import SCALE_FIELD_MANAGER
from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.test_operator_conflicts import DEPLOYMENTS, hpa, kubectl_scale, writes_to_replicas
from tests.operator.test_operator_deployable import condition, operator, resource

pytestmark = pytest.mark.timeout(120)

JOBS = "batch/v1/jobs"


def replicas(kube, name: str) -> int:
    return kube.get(DEPLOYMENTS, name)["spec"]["replicas"]


def catchup(kube, name: str) -> dict[str, Any]:
    return (kube.get(CR, name).get("status") or {}).get("catchup") or {}


def hand_over_running(kube, name: str, resume_replicas: int) -> str:
    """A hand-over whose Job runs, as the operator records one (the pods stopped, ``status.replicas`` 0): the
    operator follows it from the next poll. Returns the Job's name."""
    job = f"{name}-catchup-1"
    kube.create(
        JOBS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": job},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x:1"}]}}},
        },
    )
    run = {"phase": "Running", "jobName": job, "fence": {}, "startedAt": time.time(), "resumeReplicas": resume_replicas}
    kube.patch(CR, name, {"status": {"catchup": run, "replicas": 0}}, subresource="status")
    return job


def complete(kube, job: str) -> None:
    """The Job controller's part: the Job succeeded."""
    done = {"type": "Complete", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}
    kube.patch(JOBS, job, {"status": {"conditions": [done], "succeeded": 1}}, subresource="status")


def started(kube, name: str) -> None:
    """The resource's Deployment at 1 (scaling disabled: replicas.min) and two polls of it done."""
    kube.create(CR, resource(name, scaling={"enabled": False, "pollIntervalSeconds": 1}))
    wait_for(lambda: (kube.get(DEPLOYMENTS, name) or {}).get("spec", {}).get("replicas") == 1, 20, "the Deployment")
    wait_for_polls(kube, name, 2)


def test_an_hpa_that_takes_the_replicas_during_a_hand_over_keeps_them_while_it_runs_and_after_it_ends(
    kube, monkeypatch
):
    """The hand-over stops the pods (0, from the 1 it read), then an HPA scales them to 3: that is the HPA's
    size (ScalingConflict), neither taken back to 0 while the Job runs nor set to the size to resume when the
    Job ends."""
    with writes_to_replicas(monkeypatch, "caught") as writes, operator(kube.url):
        started(kube, "caught")
        job = hand_over_running(kube, "caught", resume_replicas=2)
        wait_for(lambda: replicas(kube, "caught") == 0, 20, "the hand-over to stop the pods")
        assert writes[-1] == (SCALE_FIELD_MANAGER, 1, 0)

        kube.create("autoscaling/v2/horizontalpodautoscalers", hpa("cpu", "caught"))
        wait_for_polls(kube, "caught", 2)  # the namespace's HPA list kept from before it was created expires
        kubectl_scale(kube, "caught", 3)  # what the HPA does
        before = len(writes)
        wait_for(lambda: condition(kube, "caught", "ScalingConflict").get("status") == "True", 20, "ScalingConflict")
        wait_for_polls(kube, "caught", 3)
        assert writes[before:] == [], "the hand-over took the HPA's replicas back"
        assert catchup(kube, "caught")["phase"] == "Running"

        complete(kube, job)
        wait_for(lambda: not catchup(kube, "caught"), 20, "the hand-over to end")
        wait_for_polls(kube, "caught", 2)
        assert writes[before:] == [], "the end of the hand-over wrote the replicas over the HPA's"
        assert replicas(kube, "caught") == 3
        ended = condition(kube, "caught", "CatchingUp")
        assert ended["status"] == "False" and ended["reason"] == "Succeeded"
        assert "the pods' replicas are left to the other autoscaler" in ended["message"], ended["message"]


def test_the_end_of_a_hand_over_does_not_write_over_a_size_its_watch_has_not_shown_yet(kube, monkeypatch):
    """``kubectl scale`` to 2 lands while the hand-over's Job ends, and the operator's watch still shows the 0
    it wrote: the hand-over's write of the size to resume (3) is conditional on the 0 it read, so it is not
    made; the next poll starts from the 2 (scaling disabled: back to replicas.min, from 2)."""
    with writes_to_replicas(monkeypatch, "late") as writes, operator(kube.url):
        started(kube, "late")
        job = hand_over_running(kube, "late", resume_replicas=3)
        wait_for(lambda: replicas(kube, "late") == 0, 20, "the hand-over to stop the pods")
        wait_for_polls(kube, "late", 2)
        kube.call_in_loop(lambda: kube.emulator.watch_lag.update({kmock.resource(DEPLOYMENTS): 4.0}))
        before = len(writes)
        kubectl_scale(kube, "late", 2)
        complete(kube, job)
        wait_for(lambda: not catchup(kube, "late"), 20, "the hand-over to end")
        ended = condition(kube, "late", "CatchingUp")
        assert ended["reason"] == "Succeeded", ended
        assert "the pods' replicas moved during the hand-over and are left as they are" in ended["message"]
        wait_for(lambda: replicas(kube, "late") == 1, 30, "the next polls to decide from the 2 kubectl set")
        assert writes[before:] == [(SCALE_FIELD_MANAGER, 2, 1)], "a write over a size the hand-over never saw"
