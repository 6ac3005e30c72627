"""Opt-in end-to-end suite on a real cluster (kind, k3d or any other), skipped unless configured.

    KEYORDER_E2E_KUBECONFIG=~/.kube/config \\
    KEYORDER_E2E_BOOTSTRAP=kafka.kafka.svc:9092,127.0.0.1:19092 \\
    KEYORDER_E2E_IMAGE=registry.example/keyorder:dev \\
    .venv/bin/python -m pytest tests/e2e -v

``KEYORDER_E2E_BOOTSTRAP`` is ``<address the pods use>,<address this machine uses>`` (one address
if both are the same). The image must contain keyorder (the repository's Dockerfile) with the
example handler package. The suite installs the CRD, runs the operator in this process against
the cluster (namespace ``KEYORDER_E2E_NAMESPACE``, default ``keyorder-e2e``), creates a backlog,
and checks that the group scales out to the partition count, drains the backlog, and scales back.
It cannot run on the development machines (no cluster there), so it is not part of ``make test``.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
import uuid

import pytest

CONFIGURED = all(
    os.environ.get(name) for name in ("KEYORDER_E2E_KUBECONFIG", "KEYORDER_E2E_BOOTSTRAP", "KEYORDER_E2E_IMAGE")
)
pytestmark = [
    pytest.mark.skipif(
        not CONFIGURED,
        reason="set KEYORDER_E2E_KUBECONFIG, KEYORDER_E2E_BOOTSTRAP "
        "and KEYORDER_E2E_IMAGE to run against a real cluster",
    ),
    pytest.mark.timeout(900),
]


def wait(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@pytest.fixture(scope="module")
def cluster():
    import kubernetes

    os.environ["KUBECONFIG"] = os.path.expanduser(os.environ["KEYORDER_E2E_KUBECONFIG"])
    kubernetes.config.load_kube_config(config_file=os.environ["KUBECONFIG"])
    client = kubernetes.client.ApiClient()
    namespace = os.environ.get("KEYORDER_E2E_NAMESPACE", "keyorder-e2e")
    core = kubernetes.client.CoreV1Api(client)
    try:
        core.create_namespace({"metadata": {"name": namespace}})
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
    from keyorder_operator.crd import crd_manifest

    extensions = kubernetes.client.ApiextensionsV1Api(client)
    manifest = crd_manifest()
    try:
        extensions.create_custom_resource_definition(manifest)
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
        extensions.patch_custom_resource_definition(manifest["metadata"]["name"], manifest)
    yield client, namespace
    client.close()


@pytest.fixture(scope="module")
def running_operator(cluster):
    import kopf

    from keyorder_operator.kube import Kube
    from keyorder_operator.main import operator_registry
    from keyorder_operator.reconcile import OperatorContext

    client, namespace = cluster
    registry = operator_registry(OperatorContext(kube=Kube(client), tick_seconds=2))
    stop, ready = threading.Event(), threading.Event()

    def run():
        asyncio.run(
            kopf.operator(registry=registry, namespaces=[namespace], standalone=True, stop_flag=stop, ready_flag=ready)
        )

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(60), "the operator did not start"
    yield
    stop.set()
    thread.join(30)


def test_backlog_scales_out_drains_and_scales_back(cluster, running_operator):
    import kubernetes
    from confluent_kafka import Consumer, TopicPartition

    from keyorder.devtools.loadgen import create_topics, produce_keyed

    client, namespace = cluster
    pod_bootstrap, _, local_bootstrap = os.environ["KEYORDER_E2E_BOOTSTRAP"].partition(",")
    local_bootstrap = local_bootstrap or pod_bootstrap
    topic, name = f"e2e-{uuid.uuid4().hex[:8]}", "e2e-ledger"
    create_topics(local_bootstrap, [topic], 4)
    produced = produce_keyed(local_bootstrap, topic, 50_000, 5_000)
    group = f"{name}-{topic}"
    committer = Consumer({"bootstrap.servers": local_bootstrap, "group.id": group})
    committer.commit(offsets=[TopicPartition(topic, p, 0) for p in range(4)], asynchronous=False)
    committer.close()
    custom = kubernetes.client.CustomObjectsApi(client)
    apps = kubernetes.client.AppsV1Api(client)
    custom.create_namespaced_custom_object(
        "keyorder.dev",
        "v1alpha1",
        namespace,
        "orderedconsumers",
        {
            "apiVersion": "keyorder.dev/v1alpha1",
            "kind": "OrderedConsumer",
            "metadata": {"name": name},
            "spec": {
                "kafka": {"bootstrapServers": pod_bootstrap, "topics": [topic], "groupId": group},
                "handler": {
                    "image": os.environ["KEYORDER_E2E_IMAGE"],
                    "handler": "keyorder_example.ledger:handle",
                    "env": [{"name": "KEYORDER_EXAMPLE_LATENCY_MS", "value": "20"}],
                },
                "workers": {"initial": 4, "max": 64},
                "scaling": {"pollIntervalSeconds": 5, "targetDrainSeconds": 60, "scaleDownStabilizationSeconds": 30},
            },
        },
    )
    try:

        def status():
            return (
                custom.get_namespaced_custom_object(
                    "keyorder.dev", "v1alpha1", namespace, "orderedconsumers", name
                ).get("status")
                or {}
            )

        wait(
            lambda: (apps.read_namespaced_deployment(name, namespace).status.ready_replicas or 0) >= 1,
            300,
            "the first consumer pod to be ready",
        )
        wait(lambda: status().get("replicas") == 4, 300, "scale-out to the 4 partitions")
        wait(lambda: status().get("lag") == 0, 600, f"the {produced.total} message backlog to drain")
        wait(lambda: status().get("replicas") == 1, 300, "scale-in after the stabilization window")
    finally:
        custom.delete_namespaced_custom_object("keyorder.dev", "v1alpha1", namespace, "orderedconsumers", name)
