"""The operator command's wiring decisions that need no cluster: peering priorities, flag checks,
one-line start-up errors (exit 2) and its log formats."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from keyorder_operator.main import (
    OperatorConfigError,
    OperatorJsonFormatter,
    OperatorTextFormatter,
    add_operator_flags,
    check_operator_args,
    check_operator_environment,
    peering_priority,
)

ROOT = Path(__file__).resolve().parents[2]


def test_peering_replicas_never_tie_unless_told() -> None:
    priorities = {peering_priority(None, "keyorder") for _ in range(20)}
    assert len(priorities) > 1 and all(priority > 0 for priority in priorities)  # ties pause every replica
    assert peering_priority(7, "keyorder") == 7
    assert peering_priority(None, None) == 0  # standalone: peering is off


def parse(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_operator_flags(parser)
    return parser.parse_args(list(flags))


def test_the_defaults_and_the_charts_flags_pass_the_checks() -> None:
    check_operator_args(parse())
    check_operator_args(
        parse("--namespace=team-a", "--namespace=b2", "--tick=0.5", "--peering=keyorder-operator", "--log-format=json")
    )


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--tick=-1"], "--tick"),
        (["--tick=0"], "--tick"),
        (["--tick=nan"], "--tick"),
        (["--tick=inf"], "--tick"),
        (["--tick=86400"], "--tick"),
        (["--namespace=Team_A"], "--namespace 'Team_A'"),
        (["--namespace=-a"], "--namespace '-a'"),
        (["--namespace=" + "a" * 64], "--namespace"),
        (["--namespace=a", "--namespace=a"], "twice"),
        (["--metrics-port=0"], "--metrics-port"),
        (["--metrics-port=70000"], "--metrics-port"),
        (["--handler-threads=0"], "--handler-threads"),
        (["--liveness=localhost:8082"], "--liveness"),
        (["--liveness=https://0.0.0.0:8082/healthz"], "--liveness"),
        (["--liveness=http://0.0.0.0:notaport/healthz"], "--liveness"),
        (["--liveness=http://0.0.0.0:8081/healthz"], "both use port 8081"),
        (["--peering=Not A Name"], "--peering"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(flags: list[str], named: str) -> None:
    with pytest.raises(OperatorConfigError, match=named.replace("'", ".")) as refused:
        check_operator_args(parse(*flags))
    assert "\n" not in str(refused.value)


def run_operator(*flags: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The real command in its own process, as a user starts it."""
    return subprocess.run(
        [sys.executable, "-m", "keyorder.cli", "operator", *flags],
        env={**os.environ, "KUBERNETES_SERVICE_HOST": "", **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def test_without_credentials_the_operator_exits_2_with_one_line(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    result = run_operator(env={"HOME": str(home), "KUBECONFIG": ""})
    assert result.returncode == 2
    assert result.stdout == ""
    (line,) = result.stderr.splitlines()
    assert line.startswith("keyorder operator: no Kubernetes credentials: not in a pod")
    assert "~/.kube/config" in line and "Traceback" not in result.stderr


def test_a_file_that_is_no_kubeconfig_is_named(tmp_path: Path) -> None:
    not_a_kubeconfig = tmp_path / "kubeconfig"
    not_a_kubeconfig.write_text("just some text\n")
    result = run_operator(env={"KUBECONFIG": str(not_a_kubeconfig)})
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert f"{not_a_kubeconfig} is not a readable kubeconfig" in line


def test_a_bad_flag_exits_2_before_looking_for_credentials(tmp_path: Path) -> None:
    result = run_operator("--tick", "-1", env={"KUBECONFIG": str(tmp_path / "missing")})
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "keyorder operator: --tick must be a number of seconds above 0 and at most 3600, got -1"
    ]


def record(message: str, reference: dict[str, str] | None) -> logging.LogRecord:
    """A log record as kopf's per-object logger makes it (its ``k8s_ref`` extra), or a plain one."""
    extra = {"k8s_ref": reference} if reference else {}
    return logging.getLogger("kopf.objects").makeRecord(
        "kopf.objects", logging.INFO, __file__, 1, message, (), None, extra=extra
    )


REFERENCE = {
    "apiVersion": "keyorder.dev/v1alpha1",
    "kind": "OrderedConsumer",
    "namespace": "payments",
    "name": "ledger",
    "uid": "u",
}


def test_json_logs_are_the_pods_shape_plus_the_resource() -> None:
    entry = json.loads(OperatorJsonFormatter().format(record("scaled to %d", REFERENCE)))
    assert entry["message"] == "scaled to %d"
    assert entry["level"] == "INFO" and entry["logger"] == "kopf.objects" and entry["time"]
    assert entry["object"] == {"kind": "OrderedConsumer", "namespace": "payments", "name": "ledger"}
    assert "object" not in json.loads(OperatorJsonFormatter().format(record("started", None)))


def test_text_logs_prefix_the_resource_without_changing_the_record() -> None:
    formatter = OperatorTextFormatter("%(levelname)s %(message)s")
    with_reference = record("scaled", REFERENCE)
    assert formatter.format(with_reference) == "INFO [payments/ledger] scaled"
    assert with_reference.msg == "scaled"
    assert formatter.format(record("started", None)) == "INFO started"


@pytest.mark.parametrize(
    "raw", ["{", '{"operatorNamespace": ""}', '{"operatorNamespace": "ops", "operatorPodLabels": {}}']
)
def test_a_bad_network_policy_setting_stops_the_operator_at_start(raw: str) -> None:
    """Not at every apply of every resource (where it would fail each poll): once, naming the variable."""
    with pytest.raises(OperatorConfigError, match="KEYORDER_NETWORK_POLICY"):
        check_operator_environment({"KEYORDER_NETWORK_POLICY": raw})


def test_the_charts_network_policy_setting_and_none_are_accepted_at_start() -> None:
    check_operator_environment({})
    check_operator_environment(
        {"KEYORDER_NETWORK_POLICY": json.dumps({"operatorNamespace": "ops", "operatorPodLabels": {"app": "op"}})}
    )
