"""``keyorder operator --log-format json`` as a user runs it: every line of its stderr is one JSON
object, and kopf's messages about a resource name it (``object``), so a log pipeline can filter by
OrderedConsumer. Real kopf, on the API emulator, in its own process. The stderr is shared with the lag
reader child (``lag_reader``), so the resource's lag is read (its broker refuses: ``LagUnknown``) before the
operator stops; that child once printed a bare traceback there when the operator left during an answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keyorder.devtools.embedded import free_port
from tests.operator.harness import CR, stop_process, wait_for, write_kubeconfig
from tests.operator.test_operator_deployable import condition
from tests.operator.test_operator_e2e import consumer_resource

pytestmark = pytest.mark.timeout(120)


def test_json_logs_are_one_object_per_line_and_name_the_resource(kube, tmp_path: Path) -> None:
    kubeconfig = write_kubeconfig(kube.url, tmp_path / "kubeconfig")
    metrics_port, liveness_port = free_port(), free_port()
    operator = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "keyorder.cli",
            "operator",
            f"--metrics-port={metrics_port}",
            f"--liveness=http://127.0.0.1:{liveness_port}/healthz",
            "--tick=0.5",
            "--log-format=json",
        ],
        env={**os.environ, "KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        kube.create(CR, consumer_resource("ledger", "127.0.0.1:1", "payments"))
        wait_for(lambda: kube.get("apps/v1/deployments", "ledger"), 60, "the operator's Deployment")
        wait_for(lambda: condition(kube, "ledger", "LagUnknown").get("status") == "True", 60, "a lag read")
    finally:
        _, errors = stop_process(operator)
    not_json = [line for line in errors.splitlines() if not _is_json_object(line)]
    assert not not_json, errors  # the whole stderr, so a traceback can be read
    entries = [json.loads(line) for line in errors.splitlines()]
    assert entries and all({"time", "level", "logger", "message"} <= entry.keys() for entry in entries)
    about_ledger = [entry for entry in entries if entry.get("object", {}).get("name") == "ledger"]
    assert about_ledger, [entry["message"] for entry in entries][:20]
    assert all(entry["object"]["kind"] == "OrderedConsumer" for entry in about_ledger)


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
