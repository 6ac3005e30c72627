"""``keyorder operator`` as users run it: a separate process, its own login (a kubeconfig here, as
kopf's ``login_via_client`` reads it), reconciling a resource on the emulator and serving metrics."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from keyorder.devtools.embedded import free_port
from tests.operator.harness import CR, stop_process, wait_for, write_kubeconfig
from tests.operator.test_operator_e2e import consumer_resource

pytestmark = pytest.mark.timeout(120)


def test_the_operator_command_logs_in_reconciles_and_serves_metrics(kube, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(kube.url, tmp_path / "kubeconfig")
    metrics_port, liveness_port = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""}
    operator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keyorder.cli",
            "operator",
            "--metrics-port",
            str(metrics_port),
            "--liveness",
            f"http://127.0.0.1:{liveness_port}/healthz",
            "--tick",
            "0.5",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    failure: AssertionError | None = None
    try:
        kube.create(CR, consumer_resource("ledger", "127.0.0.1:1", "payments"))

        def created() -> dict | None:
            if operator.poll() is not None:  # e.g. a port taken between free_port() and its bind
                raise AssertionError(f"the operator exited with {operator.returncode}")
            return kube.get("apps/v1/deployments", "ledger")

        deployment = wait_for(created, 60, "the operator's Deployment")
        assert deployment["metadata"]["ownerReferences"][0]["name"] == "ledger"

        def metrics() -> str:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
                return response.read().decode()

        text = wait_for(
            lambda: "keyorder_operator_lag_unavailable_total{" in metrics() and metrics(), 30, "the operator's metrics"
        )
        assert 'keyorder_operator_catchups_total{name="ledger",namespace="default",outcome="failed"} 0.0' in text
        with urllib.request.urlopen(f"http://127.0.0.1:{liveness_port}/healthz", timeout=5) as response:
            assert response.status == 200
    except AssertionError as error:
        failure = error
    finally:
        output, _ = stop_process(operator)
    if failure is not None:  # with what the operator said: a failure here is otherwise a bare timeout
        raise AssertionError(f"{failure}\n--- the operator's output, last 4000 characters ---\n{output[-4000:]}")
    assert "LoginError" not in output, output[-3000:]
