"""Pure builders of the Kubernetes objects an OrderedConsumer owns: dicts in, dicts out, no I/O.

Each ``build_*`` returns the full desired object for a spec; the apply layer (``kube``)
server-side applies it. The pod template depends only on the spec, never on the current scale, so
a spec change rolls the pods while a scaling change (``replicas``, live worker count) does not.
The user's pod template (``spec.template``, and the handler's env, envFrom and volumeMounts) is
merged onto the generated pods of the Deployment and of the catch-up Job by ``_with_template``:
it adds to them, and never replaces what the operator sets (``spec.template_problems`` refuses a
template that would).

Why one room of over 600 lines: the Deployment, the catch-up Job, its image check and the executors'
pod template are built from the same pieces (names, labels and selectors, the handler's environment,
the merge of the user's template, ``_with_template``), and the catch-up's driver and executors must
run the handler with the pods' own environment: kept in one module, a change to a piece reaches every
object that uses it. ``build_catchup_job`` (about 140 lines) and its helpers are the seam for a later
split.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from keyorder.catchup.memory import (
    DRIVER_MEMORY_MIB,
    effective_batch_bytes,
    executor_memory_overhead_mib,
    local_pod_memory_mib,
    lookahead_from_env,
    spark_bytes,
)
from keyorder.catchup.settings import TASK_LOOKAHEAD_MB
from keyorder.catchup.sizing import is_local_master
from keyorder_operator.catchup import REFUSAL_EXIT_CODES, spark_cores
from keyorder_operator.image_check import (
    IMAGE_CHECK_JOB_GRACE_SECONDS,
    IMAGE_CHECK_SECONDS,
    IMAGE_CHECK_TTL_SECONDS,
    template_digest,
)
from keyorder_operator.kafka_config import MOUNT_DIR
from keyorder_operator.spec import (
    CATCHUP_IMAGE_RULE,
    GROUP,
    KIND,
    VERSION,
    AssignmentStrategy,
    Executor,
    GroupProtocol,
    OrderedConsumerSpec,
)

ADMIN_TOKEN_KEY = "token"
ADMIN_TOKEN_DIR = "/etc/keyorder/admin"
KAFKA_PROPERTIES_DIR = MOUNT_DIR  # where kafka_config expects the pods' copy of the properties Secret
CONTAINER_NAME = "consumer"
ASSIGNMENT_STRATEGY_VARIABLE = "KEYORDER_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY"
"""The pods' ``partition.assignment.strategy`` (a Kafka property variable of ``keyorder run``)."""
GROUP_PROTOCOL_VARIABLE = "KEYORDER_RDKAFKA_GROUP_PROTOCOL"
"""The pods' ``group.protocol``, set only for KIP-848's ``consumer`` (classic is librdkafka's default)."""
GROUP_INSTANCE_ID_VARIABLE = "KEYORDER_RDKAFKA_GROUP_INSTANCE_ID"
"""``group.instance.id`` of a pod with ``spec.kafka.staticMembership``: its own name (Downward API)."""
ROLLING_UPDATE = {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
CUT_OVER = {"type": "Recreate"}
"""Every old pod stops (finishes, commits, leaves the group) before a new one starts."""


def labels(name: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "keyorder-consumer",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "keyorder-operator",
    }


def selector_labels(name: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": "keyorder-consumer", "app.kubernetes.io/instance": name}


def admin_secret_name(name: str) -> str:
    return f"{name}-admin-token"


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """The ownerReference that makes Kubernetes delete an object with its OrderedConsumer."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner["metadata"]["namespace"],
        "labels": labels(owner["metadata"]["name"]),
        "ownerReferences": [owner_reference(owner)],
    }


def _handler_env(spec: OrderedConsumerSpec) -> dict[str, str]:
    """Kafka, handler and retry settings: the same for the pods and the catch-up Job that replaces them."""
    kafka, retry = spec.kafka, spec.retry
    env = {
        "KEYORDER_HANDLER": spec.handler.handler,
        "KEYORDER_TOPICS": ",".join(kafka.topics),
        "KEYORDER_GROUP_ID": kafka.group_id,
        "KEYORDER_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
        "KEYORDER_ORDERING": spec.ordering.value,
        "KEYORDER_MAX_ATTEMPTS": str(retry.max_attempts),
        "KEYORDER_RETRY_INITIAL_BACKOFF": str(retry.initial_backoff_seconds),
        "KEYORDER_RETRY_MAX_BACKOFF": str(retry.max_backoff_seconds),
        "KEYORDER_ON_EXHAUSTED": retry.on_exhausted.value,
        "KEYORDER_DLQ_TOPIC": retry.dlq_topic,
        "KEYORDER_LOG_FORMAT": "json",
    }
    if kafka.properties_secret_ref is not None:
        env["KEYORDER_KAFKA_PROPERTIES_FILE"] = f"{KAFKA_PROPERTIES_DIR}/{kafka.properties_secret_ref.key}"
    return env


def _catchup_env(spec: OrderedConsumerSpec) -> dict[str, str]:
    """The handler's settings for the catch-up Job, its pre-flight and its executors: a per-message handler
    (catch-up calls it once per message, and refuses ``KEYORDER_BATCH_MAX_MESSAGES`` above 1), set so that no
    variable of ``spec.handler.envFrom`` makes the Job refuse a spec whose pods run per message."""
    return {**_handler_env(spec), "KEYORDER_BATCH_MAX_MESSAGES": "1"}


def _env_list(env: dict[str, str], spec: OrderedConsumerSpec) -> list[dict[str, Any]]:
    user = [item.manifest() for item in spec.handler.env]
    return [{"name": key, "value": value} for key, value in env.items()] + user


def consumer_env(spec: OrderedConsumerSpec) -> list[dict[str, Any]]:
    """The pod's configuration, as the ``KEYORDER_*`` variables of ``keyorder run``."""
    env = {
        **_handler_env(spec),
        "KEYORDER_WORKERS": str(spec.workers.initial),
        "KEYORDER_MAX_WORKERS": str(spec.workers.max),
        "KEYORDER_SHUTDOWN_GRACE": str(spec.handler.shutdown_grace_seconds),
        "KEYORDER_HTTP_PORT": str(spec.http_port),
        "KEYORDER_ADMIN_TOKEN_FILE": f"{ADMIN_TOKEN_DIR}/{ADMIN_TOKEN_KEY}",
    }
    if spec.kafka.group_protocol is GroupProtocol.CONSUMER:  # the broker assigns: no client-side strategy
        env[GROUP_PROTOCOL_VARIABLE] = GroupProtocol.CONSUMER.value
    else:
        env[ASSIGNMENT_STRATEGY_VARIABLE] = spec.kafka.assignment_strategy.value
    if spec.handler.executor is not Executor.AUTO:  # pods only: a catch-up Job runs the handler on Spark
        env["KEYORDER_EXECUTOR"] = spec.handler.executor.value
    batch = spec.handler.batch
    # pods only: a catch-up Job calls the handler per message (the spec refuses both). Set even at 1, so that no
    # variable of spec.handler.envFrom turns a per-message handler into a batch one behind the spec's back.
    env["KEYORDER_BATCH_MAX_MESSAGES"] = str(batch.max_messages)
    if batch.max_wait_ms:
        env["KEYORDER_BATCH_MAX_WAIT_MS"] = str(batch.max_wait_ms)
    listed = _env_list(env, spec)
    if spec.kafka.static_membership:  # one id per pod: a shared id would fence all members but one
        listed.append({"name": GROUP_INSTANCE_ID_VARIABLE, "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    return listed


CONTAINER_SECURITY = {
    "runAsNonRoot": True,
    "readOnlyRootFilesystem": True,
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def _kafka_properties_volume(spec: OrderedConsumerSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    if spec.kafka.properties_secret_ref is None:
        return [], []
    return (
        [{"name": "kafka-properties", "secret": {"secretName": spec.kafka.properties_secret_ref.name}}],
        [{"name": "kafka-properties", "mountPath": KAFKA_PROPERTIES_DIR, "readOnly": True}],
    )


def _resources(resources: Any) -> dict[str, dict[str, str]]:
    return {
        key: value
        for key, value in (("requests", dict(resources.requests)), ("limits", dict(resources.limits)))
        if value
    }


def executor_cores_in_effect(executor_cores: int, spark_conf: dict[str, str]) -> int:
    """The task slots per executor Spark will run: ``spark.executor.cores`` from ``sparkConf`` when it is a
    whole number (it overrides the one the Job is given), else ``spec.catchup.executorCores``."""
    try:
        return max(int(spark_conf.get("spark.executor.cores", "").strip()), 1)
    except ValueError:
        return executor_cores


def catchup_pod_resources(catchup: Any, cores: int, lookahead_mb: int, batch_bytes: int) -> dict[str, dict[str, str]]:
    """The catch-up Job pod's resources: ``spec.catchup.resources``, plus, on a local master (every task runs in
    this pod, beside the driver) that gives no memory request or limit, both set to
    ``memory.local_pod_memory_mib`` for its ``cores`` (``catchup.spark_cores``), its look-ahead, its Arrow
    batch bound and its ``spark.driver.memory``. A memory the user gave is kept as is (docs/catchup.md, Memory)."""
    resources = _resources(catchup.resources)
    given = "memory" in catchup.resources.requests or "memory" in catchup.resources.limits
    if not is_local_master(catchup.master) or given:
        return resources
    driver = spark_bytes(catchup.spark_conf.get("spark.driver.memory", ""), default_unit="m")
    memory = local_pod_memory_mib(cores, lookahead_mb, batch_bytes, (driver >> 20) if driver else DRIVER_MEMORY_MIB)
    return {
        "requests": {**resources.get("requests", {}), "memory": f"{memory}Mi"},
        "limits": {**resources.get("limits", {}), "memory": f"{memory}Mi"},
    }


def _with_template(
    spec: OrderedConsumerSpec, metadata: dict[str, Any], pod: dict[str, Any], service_account: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod's metadata and spec with the user's template merged on: labels, annotations and
    volumes added, the pod-level settings set, the handler's envFrom and volumeMounts added to the
    first container (its env already has the handler's variables). ``service_account`` is one the
    operator must use (a Spark driver's), else the template's, else the pod's own."""
    template = spec.template
    merged_metadata = {
        **metadata,
        "labels": {**template.metadata.labels, **metadata.get("labels", {})},
    }
    annotations = {**template.metadata.annotations, **metadata.get("annotations", {})}
    if annotations:
        merged_metadata["annotations"] = annotations
    merged = dict(pod)
    options = template.spec
    if service_account or options.service_account_name:
        merged["serviceAccountName"] = service_account or options.service_account_name
    for field, value in (
        ("imagePullSecrets", options.image_pull_secrets),
        ("nodeSelector", dict(options.node_selector)),
        ("tolerations", options.tolerations),
        ("affinity", options.affinity),
        ("topologySpreadConstraints", options.topology_spread_constraints),
        ("priorityClassName", options.priority_class_name),
    ):
        if value:
            merged[field] = value
    merged["volumes"] = [*pod.get("volumes", []), *options.volumes]
    container = dict(pod["containers"][0])
    if spec.handler.env_from:
        container["envFrom"] = list(spec.handler.env_from)
    container["volumeMounts"] = [*container.get("volumeMounts", []), *spec.handler.volume_mounts]
    merged["containers"] = [container, *pod["containers"][1:]]
    return merged_metadata, merged


def rebalancing(env: Mapping[str, Any]) -> str:
    """How pods with this environment rebalance: ``eager``, ``cooperative`` or ``consumer`` (KIP-848).
    Members of two different kinds cannot share a group. Read from the variables ``consumer_env``
    renders, so the spec's pods and the live ones are judged alike; pods of an operator from before
    those variables (or with a value this one does not know) count as eager: librdkafka's default."""
    if env.get(GROUP_PROTOCOL_VARIABLE) == GroupProtocol.CONSUMER.value:
        return "consumer"
    try:
        strategy = AssignmentStrategy(str(env.get(ASSIGNMENT_STRATEGY_VARIABLE)))
    except ValueError:
        return "eager"
    return "cooperative" if strategy.cooperative else "eager"


def _variables(env: list[dict[str, Any]]) -> dict[str, Any]:
    """A container's ``env`` list as name -> literal value."""
    return {str(item.get("name")): item.get("value") for item in env}


def _consumer_env(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The consumer container's variables in a pod spec (a pod's, or a template's): the container named
    ``CONTAINER_NAME``, else the first (a Deployment of an older operator)."""
    containers = pod_spec.get("containers") or [{}]
    container = next((c for c in containers if c.get("name") == CONTAINER_NAME), containers[0])
    return _variables(container.get("env") or [])


def cutting_over(live: Mapping[str, Any] | None) -> bool:
    """The live Deployment is in a cut-over: its update strategy is ``Recreate`` (``update_strategy`` then
    needs its pods to tell whether the cut-over is done)."""
    return ((live or {}).get("spec", {}).get("strategy") or {}).get("type") == CUT_OVER["type"]


def controller_observed(deployment: Mapping[str, Any]) -> bool:
    """The Deployment controller has observed the current spec (``status.observedGeneration`` at least
    ``metadata.generation``): until then the status's counts describe an older one."""
    observed = (deployment.get("status") or {}).get("observedGeneration")
    return observed is not None and observed >= ((deployment.get("metadata") or {}).get("generation") or 0)


def wanted_replicas(deployment: Mapping[str, Any]) -> int:
    """``spec.replicas``, or 1 where it is absent, as the API server defaults it (apps/v1 defaults.go)."""
    replicas = (deployment.get("spec") or {}).get("replicas")
    return 1 if replicas is None else int(replicas)


def rolled_out(deployment: Mapping[str, Any] | None) -> bool:
    """The Deployment controller has observed the current spec and all its pods are updated and ready;
    False while pods start, roll or are missing, and for a missing Deployment. Zero counts are absent from a
    status (the API leaves them out). The autoscaler takes the Deployment's counts as the pods' state only
    then."""
    if deployment is None or not controller_observed(deployment):
        return False
    wanted, status = wanted_replicas(deployment), deployment.get("status") or {}
    ready, updated = status.get("readyReplicas") or 0, status.get("updatedReplicas") or 0
    return ready >= wanted and updated >= wanted and (status.get("replicas") or 0) <= wanted


def cut_over_done(deployment: Mapping[str, Any], pods: Sequence[Mapping[str, Any]] | None, kind: str) -> bool:
    """Whether a cut-over to pods that rebalance as ``kind`` is over, so a rolling update can start no new pod
    beside an old one. All of:

    * the Deployment controller has observed the current spec (``status.observedGeneration`` at least
      ``metadata.generation``): until then its counts describe an older template;
    * every wanted replica is of the current template (``updatedReplicas`` at least ``spec.replicas``, and
      ``replicas`` no more than ``updatedReplicas``: no active old pod);
    * no pod is terminating by the status's own count (``status.terminatingReplicas``, Kubernetes 1.33+,
      where the cluster reports it);
    * and no pod of the group, terminating ones included, rebalances another way. This is what the counts
      cannot say: a ReplicaSet's ``status.replicas`` leaves terminating pods out, so while the old pods
      finish and leave the group the Deployment shows 0 and 0. Pods that finished (phase Succeeded or
      Failed) are no members. ``pods`` None (not read) is not done either.
    """
    if not controller_observed(deployment):
        return False
    status, wanted = deployment.get("status") or {}, wanted_replicas(deployment)
    updated = status.get("updatedReplicas") or 0
    if updated < wanted or (status.get("replicas") or 0) > updated or (status.get("terminatingReplicas") or 0) > 0:
        return False
    if pods is None:
        return False
    return not any(
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        and rebalancing(_consumer_env(pod.get("spec") or {})) != kind
        for pod in pods
    )


def update_strategy(
    spec: OrderedConsumerSpec, live: dict[str, Any] | None, pods: Sequence[Mapping[str, Any]] | None = None
) -> dict[str, Any]:
    """How the Deployment replaces its pods: a rolling update, except when the pods move between eager,
    cooperative and KIP-848 rebalancing. One group cannot mix eager and cooperative members (the
    broker refuses the new pods' joins while old ones are in it; KIP-848's own upgrade path is not
    relied on), so that change is a cut-over (``Recreate``: every old pod finishes, commits and
    leaves before a new one starts), kept until ``cut_over_done`` says no old pod is left. ``pods``: the
    group's pods as listed (terminating ones included), needed only while ``cutting_over(live)``.
    """
    if live is None:
        return ROLLING_UPDATE
    kind = rebalancing(_variables(consumer_env(spec)))
    if rebalancing(_consumer_env(live.get("spec", {}).get("template", {}).get("spec") or {})) != kind:
        return CUT_OVER
    return CUT_OVER if cutting_over(live) and not cut_over_done(live, pods, kind) else ROLLING_UPDATE


def build_deployment(
    spec: OrderedConsumerSpec, owner: dict[str, Any], replicas: int | None, strategy: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The pods' Deployment; ``strategy`` is its update strategy (``update_strategy``; a rolling update if None).
    ``replicas`` only to create it: afterwards they belong to the scaler's field manager alone, so the
    object's apply leaves them out (``objects.apply_owned_objects``)."""
    name = owner["metadata"]["name"]
    kafka_volumes, kafka_mounts = _kafka_properties_volume(spec)
    volumes: list[dict[str, Any]] = [
        {"name": "admin-token", "secret": {"secretName": admin_secret_name(name)}},
        {"name": "tmp", "emptyDir": {}},
        *kafka_volumes,
    ]
    mounts = [
        {"name": "admin-token", "mountPath": ADMIN_TOKEN_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
        *kafka_mounts,
    ]
    container = {
        "name": CONTAINER_NAME,
        "image": spec.handler.image,
        "args": ["run"],
        "env": consumer_env(spec),
        "ports": [{"name": "http", "containerPort": spec.http_port}],
        "readinessProbe": {"httpGet": {"path": "/readyz", "port": "http"}, "periodSeconds": 5},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 10, "failureThreshold": 6},
        "resources": _resources(spec.handler.resources),
        "volumeMounts": mounts,
        "securityContext": CONTAINER_SECURITY,
    }
    pod_metadata, pod = _with_template(
        spec,
        {
            "labels": labels(name),
            "annotations": {"prometheus.io/scrape": "true", "prometheus.io/port": str(spec.http_port)},
        },
        {
            "serviceAccountName": name,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": spec.handler.termination_grace_period_seconds,
            "securityContext": POD_SECURITY,
            "containers": [container],
            "volumes": volumes,
        },
        service_account=None,
    )
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(name, owner),
        "spec": {
            **({"replicas": replicas} if replicas is not None else {}),
            "selector": {"matchLabels": selector_labels(name)},
            "strategy": strategy or ROLLING_UPDATE,
            "template": {"metadata": pod_metadata, "spec": pod},
        },
    }


def build_service(spec: OrderedConsumerSpec, owner: dict[str, Any]) -> dict[str, Any]:
    """Headless Service over the pods' HTTP port: scrape target for metrics, discovery for the operator."""
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(f"{name}-metrics", owner),
        "spec": {
            "clusterIP": "None",
            "selector": selector_labels(name),
            "ports": [{"name": "http-metrics", "port": spec.http_port, "targetPort": "http"}],
        },
    }


def build_pdb(owner: dict[str, Any]) -> dict[str, Any]:
    """At most one pod down by voluntary disruption: a drain stops at most one pod's partitions at a time.
    At one replica (the default minimum, and the idle size) that is the whole group: the eviction is
    allowed (a PDB that refused it would block node drains for as long as the group idles), and the
    group waits for the replacement pod. ``replicas.min: 2`` keeps a group running through drains
    (docs/install.md)."""
    name = owner["metadata"]["name"]
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(name, owner),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": selector_labels(name)}},
    }


NETWORK_POLICY_VARIABLE = "KEYORDER_NETWORK_POLICY"
"""The operator's environment variable that turns the pods' NetworkPolicy on (the chart sets it,
``networkPolicy.consumerPods``): JSON ``{"operatorNamespace": ..., "operatorPodLabels": {...}, "metricsFrom":
[NetworkPolicyPeer, ...]}``. Unset or empty, the operator creates none: it cannot know which pods it runs as
(run outside the chart, from a laptop say), and a policy that left it out would cut its pushes to the pods."""


@dataclass(frozen=True)
class NetworkPolicySettings:
    """Who may reach the consumer pods' HTTP port: the operator's own pods, and the metrics scrapers."""

    operator_namespace: str
    operator_pod_labels: dict[str, str]
    metrics_from: list[dict[str, Any]]
    """NetworkPolicyPeers of the scrapers (Prometheus): the chart's ``networkPolicy.metricsFrom``."""


def network_policy_settings(environ: Mapping[str, str]) -> NetworkPolicySettings | None:
    """The pods' NetworkPolicy settings from the operator's environment (``NETWORK_POLICY_VARIABLE``), or
    ``None`` for no policy. A value that is not what the chart renders is a ``ValueError`` naming the variable:
    guessing would either open the pods or cut the operator off them."""
    raw = environ.get(NETWORK_POLICY_VARIABLE, "").strip()
    if not raw:
        return None
    try:
        value = json.loads(raw)
        namespace, pod_labels = value["operatorNamespace"], value["operatorPodLabels"]
        metrics_from = value.get("metricsFrom") or []
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{NETWORK_POLICY_VARIABLE} must be JSON with operatorNamespace, operatorPodLabels and metricsFrom "
            f"(the chart renders it): {error}"
        ) from None
    if not isinstance(namespace, str) or not namespace:
        raise ValueError(f"{NETWORK_POLICY_VARIABLE}: operatorNamespace must be a namespace's name")
    if (
        not isinstance(pod_labels, dict)
        or not pod_labels
        or not all(isinstance(key, str) and isinstance(label, str) for key, label in pod_labels.items())
    ):
        raise ValueError(f"{NETWORK_POLICY_VARIABLE}: operatorPodLabels must be the operator pods' labels")
    if not isinstance(metrics_from, list) or not all(isinstance(peer, dict) for peer in metrics_from):
        raise ValueError(f"{NETWORK_POLICY_VARIABLE}: metricsFrom must be a list of NetworkPolicyPeers")
    return NetworkPolicySettings(namespace, dict(pod_labels), list(metrics_from))


NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label the API server puts on every namespace, its name (immutable; Kubernetes 1.22+)."""


def build_network_policy(
    spec: OrderedConsumerSpec, owner: dict[str, Any], settings: NetworkPolicySettings
) -> dict[str, Any]:
    """Ingress to the consumer pods: their HTTP port (metrics, probes, the token-guarded admin calls) from the
    operator's pods and from the metrics scrapers, and nothing else. One port serves all three, so a scraper
    can reach the admin path too: the admin token still guards it. The kubelet's probes come from the node,
    which network policies always allow. Egress is not restricted (``policyTypes`` is Ingress only): Kafka,
    the handler's databases and DNS can be anywhere. The catch-up Job's pods are not selected (their own
    labels): Spark's executors connect back to their driver on ports Spark picks."""
    name = owner["metadata"]["name"]
    port = [{"protocol": "TCP", "port": spec.http_port}]
    operator_peer = {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.operator_namespace}},
        "podSelector": {"matchLabels": dict(settings.operator_pod_labels)},
    }
    ingress = [{"from": [operator_peer], "ports": port}]
    if settings.metrics_from:
        ingress.append({"from": [dict(peer) for peer in settings.metrics_from], "ports": port})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(name, owner),
        "spec": {"podSelector": {"matchLabels": selector_labels(name)}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


def build_service_account(owner: dict[str, Any]) -> dict[str, Any]:
    """The pods' identity. They call no Kubernetes API (worker counts are pushed to them), so no Role
    is bound and no token is mounted: least privilege is none at all."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(owner["metadata"]["name"], owner),
        "automountServiceAccountToken": False,
    }


def build_admin_secret(owner: dict[str, Any], token: str) -> dict[str, Any]:
    """The bearer token of the pods' admin endpoint: only the operator and the pods can read it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": _metadata(admin_secret_name(owner["metadata"]["name"]), owner),
        "stringData": {ADMIN_TOKEN_KEY: token},
    }


CATCHUP_JOB_TTL_SECONDS = 7 * 24 * 3600
"""Finished catch-up Jobs (and their logs) are kept for a week, then garbage-collected."""


FENCE_ANNOTATION = "keyorder.dev/fence"
"""On a catch-up Job: its ``--until``, so an existing Job can be told apart from another hand-over's."""

EXECUTOR_TEMPLATE_ANNOTATION = "keyorder.dev/executor-pod-template"
"""On a k8s:// catch-up's driver pod: the executors' pod template (JSON). A downward-API volume
shows it to the driver as a file, ``spark.kubernetes.executor.podTemplateFile``: the Job stays one
object, with no ConfigMap to create, own or clean up."""
SPARK_TEMPLATE_DIR = "/etc/keyorder/spark"
EXECUTOR_TEMPLATE_FILE = "executor-pod-template.json"
EXECUTOR_CONTAINER = "executor"


def build_executor_pod_template(spec: OrderedConsumerSpec, owner: dict[str, Any], job_name: str) -> dict[str, Any]:
    """The executors' pod template for a k8s:// catch-up: the pods' handler environment, the Kafka
    Secret (files a properties file may name, such as a CA), a writable /tmp and the hardened
    security context of every keyorder pod (restricted namespaces reject executors without it).
    Spark adds the image, the resources and its own settings (and keeps the template's labels, among
    them ``CATCHUP_JOB_LABEL``: the hand-over waits for these pods by it); executors call no API (no token)."""
    kafka_volumes, kafka_mounts = _kafka_properties_volume(spec)
    labels = {
        **catchup_labels(owner["metadata"]["name"]),
        "app.kubernetes.io/component": "catchup-executor",
        **catchup_executor_selector(job_name),
    }
    metadata, pod = _with_template(  # the user's pod template too (pull secrets, tolerations, volumes, ...)
        spec,
        {"labels": labels},
        {
            "automountServiceAccountToken": False,
            "securityContext": POD_SECURITY,
            "containers": [
                {
                    "name": EXECUTOR_CONTAINER,
                    "env": _env_list(_catchup_env(spec), spec),
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *kafka_mounts],
                    "securityContext": CONTAINER_SECURITY,
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}, *kafka_volumes],
        },
        service_account=None,
    )
    pod.pop("serviceAccountName", None)  # Spark sets the executors' account (the consumers')
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod}


def catchup_labels(name: str) -> dict[str, str]:
    """A catch-up Job's own app name: the consumers' Deployment, Service, PDB and pod counts never select it."""
    return {
        "app.kubernetes.io/name": "keyorder-catchup",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/managed-by": "keyorder-operator",
        "app.kubernetes.io/component": "catchup",
    }


def catchup_job_name(name: str, started_at: float, kind: str = "catchup") -> str:
    """``<name>-<kind>-<epoch seconds>``, the name shortened (never the time) to fit 63 characters."""
    suffix = f"-{kind}-{int(started_at)}"
    return name[: 63 - len(suffix)].rstrip("-.") + suffix


def image_check_job_name(name: str, started_at: float) -> str:
    """``<name>-preflight-<epoch seconds>``: the Job checking ``spec.catchup.image`` (``build_image_check_job``)."""
    return catchup_job_name(name, started_at, "preflight")


def catchup_selector(job_name: str) -> dict[str, str]:
    """The pods of a catch-up Job (the Job controller labels them with their Job's name): its Spark driver."""
    return {"job-name": job_name}


CATCHUP_JOB_LABEL = "keyorder.dev/catchup-job"
"""On a k8s:// catch-up's executor pods: their Job's name. Spark creates the executors itself and labels
them with its own application id (``spark-app-selector``) and ``spark-role=executor``, never with the
Job's ``job-name``; the operator does not know the application id. So the operator puts this label on them
(the executors' pod template, and ``spark.kubernetes.executor.label.*`` should a ``sparkConf`` replace the
template), and the hand-over waits until no pod carries it before the consumer pods resume."""


def catchup_executor_selector(job_name: str) -> dict[str, str]:
    """The Spark executor pods of a catch-up Job (``CATCHUP_JOB_LABEL``)."""
    return {CATCHUP_JOB_LABEL: job_name}


def _driver_account(spec: OrderedConsumerSpec) -> str | None:
    """Only a k8s:// driver calls the API (to create executor pods): it runs as ``catchup.serviceAccountName``;
    any other catch-up Job keeps the consumers' account, with no token."""
    catchup = spec.catchup
    return catchup.service_account_name if catchup.master.startswith("k8s://") else None


IMAGE_CHECK_ANNOTATION = "keyorder.dev/image-check"
"""On a pre-flight Job: the digest of its pod template (``image_check.template_digest``): what it checks,
and how an existing Job is told apart from another check's."""
IMAGE_CHECK_CONTAINER = "preflight"
IMAGE_CHECK_RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}
"""Enough for ``java -version`` and importing PySpark, pandas, pyarrow and a handler (about 200 MiB)."""


def build_image_check_job(spec: OrderedConsumerSpec, owner: dict[str, Any], job_name: str) -> dict[str, Any]:
    """The Job running ``keyorder catchup --preflight`` in ``spec.catchup.image`` before a hand-over stops the
    pods (``image_check``): the catch-up Job's image, account, pull secrets and the user's pod template,
    its environment and Kafka Secret (a handler that reads them on import sees the same), small resources,
    no retry, a bounded deadline. Its container's termination message is the log's tail on failure, so the
    operator can say which check failed without reading logs. No token: the pre-flight calls no API."""
    name = owner["metadata"]["name"]
    if spec.catchup.image is None:
        raise ValueError(CATCHUP_IMAGE_RULE)
    kafka_volumes, kafka_mounts = _kafka_properties_volume(spec)
    container = {
        "name": IMAGE_CHECK_CONTAINER,
        "image": spec.catchup.image,
        "args": ["catchup", "--preflight"],
        "env": _env_list(_catchup_env(spec), spec),
        "resources": IMAGE_CHECK_RESOURCES,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, *kafka_mounts],
        "securityContext": CONTAINER_SECURITY,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    job_labels = {**catchup_labels(name), "app.kubernetes.io/component": "catchup-preflight"}
    pod_metadata, pod = _with_template(
        spec,
        {"labels": job_labels},
        {
            "restartPolicy": "Never",
            "serviceAccountName": name,
            "automountServiceAccountToken": False,
            "securityContext": POD_SECURITY,
            "containers": [container],
            "volumes": [{"name": "tmp", "emptyDir": {}}, *kafka_volumes],
        },
        service_account=_driver_account(spec),
    )
    template = {"metadata": pod_metadata, "spec": pod}
    metadata = _metadata(job_name, owner)
    metadata["labels"] = job_labels
    metadata["annotations"] = {IMAGE_CHECK_ANNOTATION: template_digest(template)}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": IMAGE_CHECK_SECONDS + IMAGE_CHECK_JOB_GRACE_SECONDS,
            "ttlSecondsAfterFinished": IMAGE_CHECK_TTL_SECONDS,
            "template": template,
        },
    }


def build_catchup_job(spec: OrderedConsumerSpec, owner: dict[str, Any], job_name: str, until: str) -> dict[str, Any]:
    """The Job running ``keyorder catchup`` from the group's committed offsets up to the fence ``until``.

    It commits wave by wave, each only after its audit (``--commit auto``), and the fence last, so
    the pods, resumed afterwards, start exactly there; a failed run commits no more than its
    finished waves. With a ``k8s://`` master the Job's pod is the Spark driver in client mode: its
    executors get the pods' handler environment, the Kafka Secret and the hardened security context
    through a pod template, run as the consumers' ServiceAccount (no API access, no token), and are
    owned by the driver pod (``spark.kubernetes.driver.pod.name``), so they go when it goes.
    """
    name, namespace = owner["metadata"]["name"], owner["metadata"]["namespace"]
    catchup = spec.catchup
    if catchup.image is None:  # never the handler's image: it has no Java or PySpark (the spec refuses this)
        raise ValueError(CATCHUP_IMAGE_RULE)
    image = catchup.image
    on_kubernetes = catchup.master.startswith("k8s://")
    args = ["catchup", "--start", "committed", "--until", until, "--commit", "auto"]
    cores, master = spark_cores(
        catchup.master, catchup.executors, catchup.executor_cores, catchup.resources.limits.get("cpu")
    )
    args += ["--master", master]  # local[*] without a CPU limit: the cores the verdict counts, not the node's
    if catchup.key_partitions:
        args += ["--key-partitions", str(catchup.key_partitions)]
    args += ["--task-workers", str(catchup.task_workers)]
    settings: dict[str, str] = {}
    # the look-ahead the job will run with comes from the handler's env (the Job's env is the pods')
    lookahead = lookahead_from_env(((item.name, item.value) for item in spec.handler.env), TASK_LOOKAHEAD_MB)
    batch_bytes = effective_batch_bytes(catchup.spark_conf)
    driver_account = _driver_account(spec)
    if not catchup.master.startswith("local"):
        settings["spark.executor.instances"] = str(catchup.executors)
        # the cores the catch-up verdict counts (executors x executorCores) are the cores Spark asks for
        settings["spark.executor.cores"] = str(catchup.executor_cores)
        # a task's Python workers (reader and handlers) live beside the executor's JVM, in its memory
        # overhead: Spark's default (384 MiB) does not hold them with their look-ahead (docs/catchup.md, Memory);
        # sized by the settings the job will run with (a sparkConf's executor cores or Arrow batch bound wins)
        overhead = executor_memory_overhead_mib(
            executor_cores_in_effect(catchup.executor_cores, catchup.spark_conf), lookahead, batch_bytes
        )
        settings["spark.executor.memoryOverhead"] = f"{overhead}m"
        if on_kubernetes:  # and the executor pods request them, so the scheduler places them where they fit
            settings["spark.kubernetes.executor.request.cores"] = str(catchup.executor_cores)
        if not on_kubernetes:  # standalone or YARN executors: the handler's own variables (k8s: the template)
            # literal values only: a valueFrom (a Secret) has no value here to pass on, and Spark's
            # settings are not the place for secrets anyway (use the Kafka properties file)
            settings.update(
                {f"spark.executorEnv.{item.name}": item.value for item in spec.handler.env if item.value is not None}
            )
    if on_kubernetes:  # client mode: the driver is this pod, executors call back to it
        settings.update(
            {
                "spark.kubernetes.container.image": image,
                "spark.kubernetes.namespace": namespace,
                "spark.driver.host": "$(POD_IP)",
                "spark.driver.bindAddress": "$(POD_IP)",  # the pod IP only, not every interface
                "spark.kubernetes.driver.pod.name": "$(POD_NAME)",
                "spark.kubernetes.executor.podTemplateFile": f"{SPARK_TEMPLATE_DIR}/{EXECUTOR_TEMPLATE_FILE}",
                "spark.kubernetes.executor.podTemplateContainerName": EXECUTOR_CONTAINER,
                "spark.kubernetes.authenticate.executor.serviceAccountName": name,
                f"spark.kubernetes.executor.label.{CATCHUP_JOB_LABEL}": job_name,
            }
        )
        if driver_account:
            settings["spark.kubernetes.authenticate.driver.serviceAccountName"] = driver_account
    settings.update(catchup.spark_conf)
    for setting, value in sorted(settings.items()):
        args += ["--spark-conf", f"{setting}={value}"]
    kafka_volumes, kafka_mounts = _kafka_properties_volume(spec)
    env: list[dict[str, Any]] = [*_env_list(_catchup_env(spec), spec)]  # plus valueFrom entries below
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}, *kafka_volumes]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": "/tmp"}, *kafka_mounts]  # Spark's scratch space
    pod_metadata: dict[str, Any] = {"labels": catchup_labels(name)}
    if on_kubernetes:  # $(POD_IP) and $(POD_NAME) in the args above; the executors' template as a file
        env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
        template = build_executor_pod_template(spec, owner, job_name)
        pod_metadata["annotations"] = {EXECUTOR_TEMPLATE_ANNOTATION: json.dumps(template, sort_keys=True)}
        field = f"metadata.annotations['{EXECUTOR_TEMPLATE_ANNOTATION}']"
        volumes.append(
            {
                "name": "spark-templates",
                "downwardAPI": {"items": [{"path": EXECUTOR_TEMPLATE_FILE, "fieldRef": {"fieldPath": field}}]},
            }
        )
        mounts.append({"name": "spark-templates", "mountPath": SPARK_TEMPLATE_DIR, "readOnly": True})
    container = {
        "name": "catchup",
        "image": image,
        "args": args,
        "env": env,
        "resources": catchup_pod_resources(catchup, cores, lookahead, batch_bytes),
        "volumeMounts": mounts,
        "securityContext": CONTAINER_SECURITY,
    }
    pod_metadata, pod = _with_template(
        spec,
        pod_metadata,
        {
            "restartPolicy": "Never",
            "serviceAccountName": name,
            "automountServiceAccountToken": driver_account is not None,
            "securityContext": POD_SECURITY,
            "containers": [container],
            "volumes": volumes,
        },
        service_account=driver_account,
    )
    metadata = _metadata(job_name, owner)
    metadata["labels"] = catchup_labels(name)
    metadata["annotations"] = {FENCE_ANNOTATION: until}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": catchup.backoff_limit,
            "activeDeadlineSeconds": catchup.max_seconds,
            "podReplacementPolicy": "Failed",  # a retry starts only after the failed driver is gone
            # exit 2 or 3: refused before touching the group (settings or an image without Java/PySpark; or a
            # state of the group that passes): fail the Job at once, whatever backoffLimit says, so the pods
            # resume now (catchup.job_refusal says why, from the driver's termination message)
            "podFailurePolicy": {
                "rules": [
                    {
                        "action": "FailJob",
                        "onExitCodes": {
                            "containerName": "catchup",
                            "operator": "In",
                            "values": list(REFUSAL_EXIT_CODES),
                        },
                    }
                ]
            },
            "ttlSecondsAfterFinished": CATCHUP_JOB_TTL_SECONDS,
            "template": {"metadata": pod_metadata, "spec": pod},
        },
    }
