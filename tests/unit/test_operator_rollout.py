"""``builders.rolled_out``: when the autoscaler may take the Deployment's counts as the pods' current state."""

from __future__ import annotations

import pytest

from keyorder_operator.builders import rolled_out


def deployment(replicas: int, status: dict | None, generation: int = 2) -> dict:
    built: dict = {"metadata": {"name": "ledger", "generation": generation}, "spec": {"replicas": replicas}}
    if status is not None:
        built["status"] = status
    return built


@pytest.mark.parametrize(
    ("live", "expected"),
    [
        (None, False),  # no Deployment
        (deployment(3, {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3}), True),
        # the controller has not seen the current spec: every count is of the previous template
        (deployment(3, {"observedGeneration": 1, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 3}), False),
        (deployment(3, {"replicas": 3, "updatedReplicas": 3, "readyReplicas": 3}), False),
        (deployment(3, None), False),
        # an old pod still active, or new ones not ready yet
        (deployment(3, {"observedGeneration": 2, "replicas": 4, "updatedReplicas": 3, "readyReplicas": 3}), False),
        (deployment(3, {"observedGeneration": 2, "replicas": 3, "updatedReplicas": 3, "readyReplicas": 2}), False),
        # at zero the API leaves every count out
        (deployment(0, {"observedGeneration": 2}), True),
    ],
)
def test_a_deployment_is_rolled_out_once_its_controller_observed_the_spec_and_every_pod_is_updated_and_ready(
    live, expected
):
    assert rolled_out(live) is expected
