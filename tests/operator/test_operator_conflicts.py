"""One owner for the replicas: the operator does not fight another autoscaler over them.

The real kopf operator on the API emulator; no broker (``NoKafka``). With ``scaling.enabled: false``
the operator holds the Deployment at ``replicas.min`` on every poll, so a replica count it leaves
alone for several polls shows it stood back.
"""

from __future__ import annotations

import pytest

from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.test_operator_deployable import condition, events, operator, resource

pytestmark = pytest.mark.timeout(120)


def hpa(name: str, target: str) -> dict:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
            "minReplicas": 1,
            "maxReplicas": 10,
        },
    }


def deployment_replicas(kube, name: str) -> int:
    return kube.get("apps/v1/deployments", name)["spec"]["replicas"]


def test_an_hpa_on_the_same_deployment_gets_scaling_conflict_and_the_replicas_are_left_alone(kube):
    with operator(kube.url):
        kube.create(CR, resource("fought", scaling={"enabled": False, "pollIntervalSeconds": 1}))
        wait_for(lambda: kube.get("apps/v1/deployments", "fought") is not None, 20, "the Deployment")
        wait_for_polls(kube, "fought", 2)
        kube.create("autoscaling/v2/horizontalpodautoscalers", hpa("cpu", "fought"))
        kube.create("autoscaling/v2/horizontalpodautoscalers", hpa("elsewhere", "another-deployment"))
        kube.patch("apps/v1/deployments", "fought", {"spec": {"replicas": 3}})  # what the HPA does
        wait_for(lambda: condition(kube, "fought", "ScalingConflict").get("status") == "True", 20, "ScalingConflict")
        conflict = condition(kube, "fought", "ScalingConflict")
        assert conflict["reason"] == "OtherAutoscaler"
        assert "HorizontalPodAutoscaler default/cpu also scales Deployment fought" in conflict["message"]
        assert "elsewhere" not in conflict["message"]
        assert any("default/cpu" in message for message in events(kube, "ScalingConflict"))
        wait_for_polls(kube, "fought", 3)
        assert deployment_replicas(kube, "fought") == 3, "the operator fought the HPA over the replicas"
        kube.delete("autoscaling/v2/horizontalpodautoscalers", "cpu")
        wait_for(lambda: condition(kube, "fought", "ScalingConflict").get("status") == "False", 20, "the conflict over")
        wait_for(lambda: deployment_replicas(kube, "fought") == 1, 20, "scaling disabled holds replicas.min again")
    assert kube.get(CR, "fought") is not None
