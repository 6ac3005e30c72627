"""The Helm chart rendered by the real Helm engine (helm-python-sdk), offline.

For every values set in ``conftest.VALUES_SETS``: strict lint, and every manifest validated by
kubernetes-validate in strict mode on two Kubernetes versions (the monitoring.coreos.com kinds
against ``MINIMAL_MONITORING_SCHEMAS``, kopf's peering objects against the chart's own CRDs).
Then what an SRE checks by hand: security contexts, probes, args, labels, monitors that select
what the operator actually creates, the test hook, and bad values refused with a clear message.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from typing import Any

import helm_python
import jsonschema
import kubernetes_validate
import pytest
import yaml
from openapi_schema_validator import OAS30Validator

from keyorder_operator import builders
from keyorder_operator.main import add_operator_flags
from tests.packaging.conftest import CHART, KUBERNETES_VERSIONS, NAMESPACE, RELEASE, VALUES_SETS, documents, find
from tests.packaging.monitoring_schemas import MINIMAL_MONITORING_SCHEMAS

PEERING_CRDS = {
    doc["spec"]["names"]["kind"]: doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for doc in yaml.safe_load_all((CHART / "crds" / "kopf-peerings.yaml").read_text())
}


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = find(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


# ---------------------------------------------------------------- lint and validation


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_set", sorted(VALUES_SETS))
def test_strict_lint_has_no_errors_or_warnings(values_set, version):
    report = helm_python.lint(
        CHART, VALUES_SETS[values_set], strict=True, namespace=NAMESPACE, kube_version=f"v{version}.0"
    )
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["total_charts_linted"] == 1


def test_chart_declares_the_supported_kubernetes_versions():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={KUBERNETES_VERSIONS[0]}.0-0"


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("values_set", sorted(VALUES_SETS))
def test_every_manifest_validates_strictly(manifests, values_set, version):
    for doc in manifests[values_set]:
        kind = doc["kind"]
        if kind in MINIMAL_MONITORING_SCHEMAS:
            # Skipped by kubernetes-validate (it has no monitoring.coreos.com schemas): our own minimal schema.
            jsonschema.validate(doc, MINIMAL_MONITORING_SCHEMAS[kind])
        elif kind in PEERING_CRDS:
            assert doc["apiVersion"] == "kopf.dev/v1"
            OAS30Validator(PEERING_CRDS[kind]).validate(doc)
        else:
            kubernetes_validate.validate(doc, version, strict=True)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_chart_crds_validate(chart, version):
    files = {crd["filename"] for crd in chart.crds}
    assert files == {
        "keyorder-operator/crds/orderedconsumers.keyorder.dev.yaml",
        "keyorder-operator/crds/kopf-peerings.yaml",
    }
    for crd in chart.crds:
        for doc in yaml.safe_load_all(crd["data"]):
            kubernetes_validate.validate(doc, version, strict=True)


def test_values_sets_render_what_they_enable(manifests):
    kinds = {name: sorted({doc["kind"] for doc in docs}) for name, docs in manifests.items()}
    base = ["ConfigMap", "Deployment", "NetworkPolicy", "Pod", "Service", "ServiceAccount"]
    assert kinds["defaults"] == sorted([*base, "ClusterRole", "ClusterRoleBinding"])
    assert kinds["namespaced"] == sorted([*base, "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"])
    # the operator's rights are Roles only; the one ClusterRole kind left is the users' (aggregated, unbound)
    assert kinds["namespaced-strict"] == sorted([*base, "ClusterRole", "Role", "RoleBinding"])
    assert set(kinds["monitoring"]) >= {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    assert kinds["peering"] == sorted([*base, "ClusterKopfPeering", "ClusterRole", "ClusterRoleBinding"])
    assert [doc["metadata"]["namespace"] for doc in find(manifests["peering-namespaced"], "KopfPeering")] == [
        "team-a",
        "team-b",
    ]
    assert kinds["minimal"] == ["ConfigMap", "Deployment", "NetworkPolicy", "Service"]


# ---------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": "two"}, "at '/replicaCount': got string, want integer"),
        ({"operator": {"watchNamespaces": ["Team_A"]}}, "at '/operator/watchNamespaces/0'"),
        ({"operator": {"metricsPort": 80}}, "at '/operator/metricsPort': minimum"),
        ({"securityContext": {"readOnlyRootFilesystem": False}}, "at '/securityContext/readOnlyRootFilesystem'"),
        ({"securityContext": {"capabilities": {"drop": ["NET_RAW"]}}}, "at '/securityContext/capabilities/drop'"),
        ({"podSecurityContext": {"runAsNonRoot": False}}, "at '/podSecurityContext/runAsNonRoot'"),
        ({"monitoring": {"prometheusRule": {"stuckKey": {"severity": "urgent"}}}}, "'critical', 'warning', 'info'"),
        (
            {"monitoring": {"serviceMonitor": {"interval": "thirty seconds"}}},
            "at '/monitoring/serviceMonitor/interval'",
        ),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy'"),
        ({"image": {"digest": "sha256:short"}}, "at '/image/digest'"),
        ({"replicaCoutn": 2}, "additional properties 'replicaCoutn' not allowed"),
        ({"peering": {"enabled": True, "nmae": "x"}}, "additional properties 'nmae' not allowed"),
    ],
)
def test_bad_values_are_refused_by_the_schema(chart, values, message):
    with pytest.raises(helm_python.HelmValuesError) as error:
        chart.render(values, name=RELEASE, namespace=NAMESPACE)
    assert message in str(error.value)
    assert "keyorder-operator" in str(error.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"replicaCount": 2}, "replicaCount > 1 needs peering.enabled: true"),
        ({"image": {"tag": "latest"}}, "image.tag: 'latest' is refused"),
    ],
)
def test_inconsistent_values_fail_the_render_with_a_reason(chart, values, message):
    with pytest.raises(helm_python.HelmRenderError, match=message.replace(".", r"\.").replace("'", ".")):
        chart.render(values, name=RELEASE, namespace=NAMESPACE)


def test_default_values_pass_the_schema(chart):
    chart.validate_schema(chart.values)


# ---------------------------------------------------------------- the operator Deployment


STRICT_CONTAINER = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


@pytest.mark.parametrize("values_set", sorted(VALUES_SETS))
def test_every_pod_runs_strict(manifests, values_set):
    docs = manifests[values_set]
    pods = [doc["spec"]["template"]["spec"] for doc in find(docs, "Deployment")] + [
        doc["spec"] for doc in find(docs, "Pod")
    ]
    assert pods
    for pod in pods:
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            assert container["securityContext"] == STRICT_CONTAINER
            assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
            assert not container["image"].endswith(":latest")


@pytest.mark.parametrize("values_set", sorted(VALUES_SETS))
def test_args_are_accepted_by_the_operator_cli(manifests, values_set):
    values = VALUES_SETS[values_set]
    container = operator_container(manifests[values_set])
    command, *flags = container["args"]
    assert command == "operator"
    parser = argparse.ArgumentParser()
    add_operator_flags(parser)
    args = parser.parse_args(flags)
    operator = values.get("operator", {})
    assert args.namespace == operator.get("watchNamespaces", [])
    assert args.peering == ("keyorder-operator" if values.get("peering", {}).get("enabled") else None)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert args.metrics_port == ports["metrics"] == operator.get("metricsPort", 8081)
    assert args.liveness == f"http://0.0.0.0:{ports['health']}/healthz"
    for probe in (container["livenessProbe"], container["readinessProbe"]):
        assert probe["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "POD_ID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in container["env"]


def test_checksum_annotation_follows_the_config(chart, renders):
    def annotation(rendered: dict[str, str]) -> str:
        (deployment,) = find(documents(rendered), "Deployment")
        return deployment["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    for rendered in renders.values():
        config = rendered["keyorder-operator/templates/configmap.yaml"]
        assert annotation(rendered) == hashlib.sha256(config.encode()).hexdigest()
    assert annotation(renders["defaults"]) != annotation(renders["custom-image"])  # operator.env differs


def test_standalone_operator_never_runs_twice(manifests):
    for name, docs in manifests.items():
        (deployment,) = find(docs, "Deployment")
        peering = VALUES_SETS[name].get("peering", {}).get("enabled", False)
        assert (deployment["spec"].get("strategy") == {"type": "Recreate"}) is not peering
        assert deployment["spec"]["replicas"] == VALUES_SETS[name].get("replicaCount", 1)


def test_custom_image_values(manifests):
    docs = manifests["custom-image"]
    container = operator_container(docs)
    assert container["image"] == "registry.example/keyorder@sha256:" + "ab" * 32
    assert container["imagePullPolicy"] == "Always" and container["args"][-1] == "--tick=2"
    (deployment,) = find(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "ops-operator" and pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["nodeSelector"] == {"kubernetes.io/os": "linux"} and pod["tolerations"][0]["key"] == "dedicated"
    assert deployment["metadata"]["name"] == "ko"
    assert find(docs, "ConfigMap", "ko-env")[0]["data"] == {"TZ": "UTC"}
    (service,) = find(docs, "Service")
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9100, "targetPort": "metrics", "protocol": "TCP"}]
    assert operator_container(manifests["defaults"])["image"] == "keyorder:0.1.0"  # appVersion


def test_labels_and_names_follow_helm_conventions(manifests):
    for docs in manifests.values():
        for doc in docs:
            metadata = doc["metadata"]
            assert len(metadata["name"]) <= 63
            labels = metadata["labels"]
            assert labels["app.kubernetes.io/managed-by"] == "Helm"
            assert labels["helm.sh/chart"] == "keyorder-operator-0.1.0"
            if doc["kind"] == "Deployment":
                selector = doc["spec"]["selector"]["matchLabels"]
                assert selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
                assert selector == {
                    "app.kubernetes.io/name": "keyorder-operator",
                    "app.kubernetes.io/instance": RELEASE,
                }


# ---------------------------------------------------------------- monitoring


def test_service_and_service_monitor_reach_the_metrics_port(manifests):
    docs = manifests["monitoring"]
    (service,) = find(docs, "Service")
    (deployment,) = find(docs, "Deployment")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    (monitor,) = find(docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["metadata"]["labels"]["release"] == "prom"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["honorLabels"] is True  # keeps the OrderedConsumer's namespace/name labels


def test_pod_monitor_selects_the_pods_the_operator_builds(manifests):
    """The selector and port must match what builders.build_deployment really produces."""
    from keyorder_operator.spec import parse_spec

    spec = parse_spec(
        {
            "kafka": {"bootstrapServers": "k:9092", "topics": ["t"], "groupId": "g"},
            "handler": {"image": "i:1", "handler": "m:f"},
        }
    )
    owner = {"metadata": {"name": "ledger", "namespace": "team-a", "uid": "u"}}
    pod = builders.build_deployment(spec, owner, 1)["spec"]["template"]
    port_names = {port["name"] for port in pod["spec"]["containers"][0]["ports"]}
    for values_set, namespaces in (("monitoring", None), ("monitoring-namespaced", ["team-a"])):
        (monitor,) = find(manifests[values_set], "PodMonitor")
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        assert endpoint["port"] in port_names and endpoint["path"] == "/metrics"
        assert endpoint["relabelings"] == [
            {"sourceLabels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"], "targetLabel": "name"}
        ]
        assert "app.kubernetes.io/instance" in pod["metadata"]["labels"]
        assert monitor["spec"]["namespaceSelector"] == (
            {"any": True} if namespaces is None else {"matchNames": namespaces}
        )


def test_prometheus_rule_has_the_issues_alerts_and_more(manifests):
    (rule,) = find(manifests["monitoring"], "PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert set(alerts) == {
        "KeyorderLagGrowing",
        "KeyorderKeyStuck",
        "KeyorderDeadLettering",
        "KeyorderLagUnknown",
        "KeyorderReconcileErrors",
        "KeyorderCatchupFailed",
        "KeyorderOperatorDown",
        "KeyorderPodsNotReady",
        "KeyorderScalingLimited",
    }
    assert "deriv(keyorder_operator_observed_lag_messages" in alerts["KeyorderLagGrowing"]["expr"]
    assert alerts["KeyorderLagGrowing"]["for"] == "15m"
    assert "(keyorder_partition_oldest_inflight_age_seconds)" in alerts["KeyorderKeyStuck"]["expr"]
    assert "rate(keyorder_messages_dead_lettered_total[5m])) > 0" in alerts["KeyorderDeadLettering"]["expr"]
    assert "keyorder_operator_lag_unavailable_total" in alerts["KeyorderLagUnknown"]["expr"]
    catchup_failed = 'keyorder_operator_catchups_total{outcome=~"failed|missing|image_failed"}'
    assert catchup_failed in alerts["KeyorderCatchupFailed"]["expr"]
    for alert in alerts.values():
        assert alert["labels"]["team"] == "payments" and alert["labels"]["severity"] in ("warning", "critical")
        assert "{{ $labels." in alert["annotations"]["summary"]  # Prometheus templating survived Helm's
        assert alert["expr"].count("(") == alert["expr"].count(")")


def test_alerts_can_be_tuned_and_disabled(chart):
    values = {
        "monitoring": {
            "prometheusRule": {
                "enabled": True,
                "stuckKey": {"minSeconds": 60, "for": "2m"},
                "deadLetters": {"enabled": False},
            }
        }
    }
    (rule,) = find(documents(chart.render(values, name=RELEASE, namespace=NAMESPACE)), "PrometheusRule")
    alerts = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert "KeyorderDeadLettering" not in alerts
    assert "> 60" in alerts["KeyorderKeyStuck"]["expr"] and alerts["KeyorderKeyStuck"]["for"] == "2m"


def test_with_peering_an_alert_fires_when_the_peering_object_is_gone(chart):
    """Without its peering object kopf's standbys never take over (``keyorder_operator.peering``): the operator
    exports ``keyorder_operator_peering_object_present`` and the chart alerts on it, only when peering is on."""

    def alerts(values):
        values = {**values, "monitoring": {"prometheusRule": {"enabled": True}}}
        (rule,) = find(documents(chart.render(values, name=RELEASE, namespace=NAMESPACE)), "PrometheusRule")
        return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}

    missing = alerts({"replicaCount": 2, "peering": {"enabled": True}})["KeyorderPeeringObjectMissing"]
    assert missing["expr"] == "keyorder_operator_peering_object_present == 0"
    assert missing["for"] == "5m" and missing["labels"]["severity"] == "warning"
    assert "{{ $labels.kind }} {{ $labels.name }}" in missing["annotations"]["summary"]
    assert missing["annotations"]["runbook_url"].endswith("#keyorderpeeringobjectmissing")
    assert "KeyorderPeeringObjectMissing" not in alerts({})


def test_dashboard_configmap(manifests):
    (config_map,) = find(manifests["monitoring"], "ConfigMap", f"{RELEASE}-keyorder-operator-dashboard")
    assert config_map["metadata"]["namespace"] == "grafana"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config_map["data"]["keyorder.json"]) == json.loads(
        (CHART / "dashboards" / "keyorder.json").read_text()
    )


# ---------------------------------------------------------------- helm test and NOTES


def test_helm_test_hook_reads_the_operator_metrics(manifests):
    docs = manifests["defaults"]
    (pod,) = find(docs, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never" and pod["spec"]["automountServiceAccountToken"] is False
    (container,) = pod["spec"]["containers"]
    (service,) = find(docs, "Service")
    script = container["args"][0]
    url = f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}/metrics"
    assert url in script and "keyorder_operator_replicas" in script
    compile(script.replace(url, "http://x"), "helm-test", "exec")  # the embedded Python is valid
    assert container["image"] == operator_container(docs)["image"]


def test_notes_explain_next_steps(renders):
    notes = renders["defaults"]["keyorder-operator/templates/NOTES.txt"]
    assert "kubectl get okc" in notes and "helm test keyorder" in notes
    assert "kubectl apply --server-side -f crds/orderedconsumers.keyorder.dev.yaml" in notes
    assert "team-a, team-b" in renders["namespaced"]["keyorder-operator/templates/NOTES.txt"]
