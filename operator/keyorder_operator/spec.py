"""The OrderedConsumer custom resource: pydantic models, the single source of its schema.

The CRD's openAPIV3Schema is generated from these models (so the API server and the operator
can never disagree), and the operator validates every resource with them: an invalid spec
becomes an ``InvalidSpec`` condition naming the field path, and nothing else is touched.
Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python.

Why one room of over 600 lines: these models are the single source of the CRD's schema (``crd``
generates it from ``OrderedConsumerSpec`` down), and the cross-field rules (``*_problems``, the model
validators) read fields of several sections at once: the catch-up's against the handler's, the
template's against what the operator sets. Split across modules, one resource's schema and its rules
would be read in several places; the per-section models (``KafkaSpec``, ``HandlerSpec``,
``ScalingSpec``, ``CatchupSpec``) are the seam if it grows further.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from keyorder.batch import BATCH_MAX_MESSAGES_LIMIT, BATCH_MAX_WAIT_MS_LIMIT
from keyorder.catchup.settings import (
    ENFORCED_SPARK_SETTINGS,
    cluster_secret_missing,
    fixed_setting_overrides,
    master_attempts_problem,
)

GROUP = "keyorder.dev"
VERSION = "v1alpha1"
KIND = "OrderedConsumer"
PLURAL = "orderedconsumers"
SHORT_NAME = "okc"
PAUSE_ANNOTATION = "keyorder.dev/paused"
"""``"true"`` on a resource freezes its size and catch-up where they are (like KEDA's paused annotation)."""

NAME_SUFFIX_RESERVE = len("-metrics")
"""The longest suffix the operator adds to a resource's name for a DNS-label object (its Service)."""
MAX_NAME_LENGTH = 63 - NAME_SUFFIX_RESERVE
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
NAME_RULE = (
    f"must be at most {MAX_NAME_LENGTH} characters of lowercase letters, digits and '-', start with a letter "
    "and end with a letter or digit (it names the consumers' Service, a DNS label, with '-metrics' appended)"
)

KUBERNETES_TYPE = "x-keyorder-kubernetes-type"
"""JSON-schema marker: this field holds a Kubernetes ``io.k8s.api.core.v1`` type; the CRD embeds its real schema."""


def kubernetes_type(name: str) -> dict[str, Any]:
    """``json_schema_extra`` of a field (or a list field's items) holding the Kubernetes type ``name``."""
    return {KUBERNETES_TYPE: name}


LIST_TYPE = "x-kubernetes-list-type"
LIST_MAP_KEYS = "x-kubernetes-list-map-keys"


def keyed_list(*keys: str, items: str | None = None) -> dict[str, Any]:
    """``json_schema_extra`` of a list whose items are unique by ``keys`` (``items``: their Kubernetes type).

    Such a list ends up in a list of the pods that Kubernetes keys by the same fields (a container's env by
    ``name``, its volumeMounts by ``mountPath``...), and server-side apply refuses an applied object with
    two items of one key (structured-merge-diff's "duplicate entries for key"), so every apply of the
    Deployment would fail. The CRD marks the list ``x-kubernetes-list-type: map`` with these keys (the API
    server then refuses the duplicate when the resource is written), and ``duplicate_problems`` refuses it
    in the operator, for a resource stored under an older CRD."""
    extra: dict[str, Any] = {LIST_TYPE: "map", LIST_MAP_KEYS: list(keys)}
    if items is not None:
        extra["items"] = kubernetes_type(items)
    return extra


# What the operator itself puts into the pods it generates: a template may not replace any of it
# (builders.py uses these names; a unit test checks the generated pods against them).
OPERATOR_VOLUMES = frozenset({"admin-token", "tmp", "kafka-properties", "spark-templates"})
OPERATOR_MOUNT_PATHS = frozenset(
    {"/", "/tmp", "/etc/keyorder", "/etc/keyorder/admin", "/etc/keyorder/kafka", "/etc/keyorder/spark"}
)
OPERATOR_LABELS = frozenset(
    {
        "app.kubernetes.io/name",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/component",
        "keyorder.dev/catchup-job",  # builders.CATCHUP_JOB_LABEL: the hand-over waits for pods carrying it
    }
)
OPERATOR_ANNOTATIONS = frozenset(
    {"prometheus.io/scrape", "prometheus.io/port", "keyorder.dev/fence", "keyorder.dev/executor-pod-template"}
)
OPERATOR_ENV = frozenset(
    {
        "KEYORDER_HANDLER",
        "KEYORDER_TOPICS",
        "KEYORDER_GROUP_ID",
        "KEYORDER_BOOTSTRAP_SERVERS",
        "KEYORDER_ORDERING",
        "KEYORDER_MAX_ATTEMPTS",
        "KEYORDER_RETRY_INITIAL_BACKOFF",
        "KEYORDER_RETRY_MAX_BACKOFF",
        "KEYORDER_ON_EXHAUSTED",
        "KEYORDER_DLQ_TOPIC",
        "KEYORDER_LOG_FORMAT",
        "KEYORDER_KAFKA_PROPERTIES_FILE",
        "KEYORDER_WORKERS",
        "KEYORDER_MAX_WORKERS",
        "KEYORDER_SHUTDOWN_GRACE",
        "KEYORDER_HTTP_PORT",
        "KEYORDER_ADMIN_TOKEN_FILE",
        "KEYORDER_EXECUTOR",
        "KEYORDER_BATCH_MAX_MESSAGES",  # spec.handler.batch.maxMessages (always set: 1 is a per-message handler)
        "KEYORDER_BATCH_MAX_WAIT_MS",  # spec.handler.batch.maxWaitMs
        "KEYORDER_RDKAFKA_PARTITION_ASSIGNMENT_STRATEGY",  # spec.kafka.assignmentStrategy
        "KEYORDER_RDKAFKA_GROUP_PROTOCOL",  # spec.kafka.groupProtocol
        "KEYORDER_RDKAFKA_GROUP_INSTANCE_ID",  # spec.kafka.staticMembership
        "POD_IP",
        "POD_NAME",
    }
)
HARDENING = "non-root, read-only root filesystem, no capabilities, seccomp RuntimeDefault"
SHUTDOWN_RESERVE_SECONDS = 5
"""Of a pod's termination grace period, what is kept for the end of its shutdown (commit, leave, close)."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class Ordering(StrEnum):
    KEY = "key"
    PARTITION = "partition"
    UNORDERED = "unordered"


class OnExhausted(StrEnum):
    DLQ = "dlq"
    BLOCK = "block"


class Executor(StrEnum):
    AUTO = "auto"
    THREAD = "thread"
    ASYNC = "async"
    PROCESS = "process"


class AssignmentStrategy(StrEnum):
    """librdkafka's ``partition.assignment.strategy`` for the pods; eager and cooperative cannot mix in one group."""

    COOPERATIVE_STICKY = "cooperative-sticky"
    RANGE = "range"
    ROUNDROBIN = "roundrobin"

    @property
    def cooperative(self) -> bool:
        return self is AssignmentStrategy.COOPERATIVE_STICKY


class GroupProtocol(StrEnum):
    """The consumer group protocol: classic (client-side assignment) or KIP-848's (the broker assigns)."""

    CLASSIC = "classic"
    CONSUMER = "consumer"


class SecretKeyRef(_Model):
    name: str = Field(min_length=1, description="Name of a Secret in the resource's namespace.")
    key: str = Field(
        "client.properties",
        min_length=1,
        description="Key of the Secret holding a Java-style properties file of librdkafka settings (SASL/TLS).",
    )


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class KafkaSpec(_Model):
    bootstrap_servers: str = Field(min_length=1, description="Kafka bootstrap servers, host:port[,host:port].")
    topics: list[str] = Field(min_length=1, description="Topics to consume.")
    group_id: str = Field(min_length=1, description="Consumer group id (the operator reads its lag).")
    properties_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret with client properties; mounted into the pods, read by the operator. Never logged."
    )
    assignment_strategy: AssignmentStrategy = Field(
        AssignmentStrategy.COOPERATIVE_STICKY,
        description="How the group hands out partitions when pods join or leave: cooperative-sticky (the default "
        "with groupProtocol classic) moves only the partitions that change owner (the others keep running); range "
        "and roundrobin (eager) stop every pod. A change between eager and cooperative is rolled out by stopping "
        "every pod before the new ones start (the two cannot share a group).",
        # no default in the CRD: the API server would store it, and groupProtocol consumer refuses the field
        json_schema_extra=_no_default,
    )
    group_protocol: GroupProtocol = Field(
        GroupProtocol.CLASSIC,
        description="classic, or consumer (KIP-848: the broker assigns partitions incrementally; Apache Kafka 4.0 "
        "and later). With consumer, assignmentStrategy does not apply. A change rolls out like a change between "
        "eager and cooperative: every pod stops before the new ones start.",
    )
    static_membership: bool = Field(
        False,
        description="Each pod joins with group.instance.id set to its pod name (KIP-345, static membership): a "
        "container restarted in place (a crash, an OOM kill) gets its partitions back without a rebalance if it "
        "rejoins within session.timeout.ms, while its partitions wait for it that long. A pod that stops (scale-in, "
        "rollout) still leaves the group at once. Pods of a Deployment get new names when they are replaced, so "
        "only in-place restarts gain. groupProtocol classic only (with consumer a static member cannot leave).",
    )

    @model_validator(mode="after")
    def _strategy_only_for_classic(self) -> KafkaSpec:
        if self.group_protocol is GroupProtocol.CONSUMER and "assignment_strategy" in self.model_fields_set:
            raise ValueError(
                "assignmentStrategy applies to groupProtocol classic only; with groupProtocol consumer the broker "
                "assigns the partitions"
            )
        return self

    @model_validator(mode="after")
    def _static_membership_only_for_classic(self) -> KafkaSpec:
        if self.group_protocol is GroupProtocol.CONSUMER and self.static_membership:
            raise ValueError(STATIC_MEMBERSHIP_RULE)
        return self


STATIC_MEMBERSHIP_RULE = (
    "staticMembership applies to groupProtocol classic only: with groupProtocol consumer (KIP-848) librdkafka's "
    "leave for a static member is temporary (member epoch -2), so a stopped pod's partitions stay with it until "
    "session.timeout.ms expires; set staticMembership false or groupProtocol classic"
)
"""Why static membership on KIP-848's protocol is refused (the model and the CRD's CEL rule say the same;
``keyorder.adapters.kafka_source.static_member_cannot_leave`` cites librdkafka)."""


class EnvVar(_Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", description="Variable name.")
    value: str | None = Field(None, description="Variable value (or valueFrom).")
    value_from: dict[str, Any] | None = Field(
        None,
        description="The value from a Secret, ConfigMap or the pod (a Kubernetes EnvVarSource): keeps secrets "
        "out of the resource.",
        json_schema_extra=kubernetes_type("EnvVarSource"),
    )

    @model_validator(mode="after")
    def _one_source(self) -> EnvVar:
        if self.value is not None and self.value_from is not None:
            raise ValueError(f"env {self.name}: set value or valueFrom, not both")
        return self

    def manifest(self) -> dict[str, Any]:
        """The container's EnvVar."""
        if self.value_from is not None:
            return {"name": self.name, "valueFrom": dict(self.value_from)}
        return {"name": self.name, "value": self.value or ""}


class Resources(_Model):
    requests: dict[str, str] = Field(default_factory=dict, description="Resource requests, e.g. cpu: 500m.")
    limits: dict[str, str] = Field(default_factory=dict, description="Resource limits, e.g. memory: 512Mi.")


BATCH_WAIT_RULE = "maxWaitMs needs maxMessages above 1: a per-message handler has no batch to fill"
BATCH_CATCHUP_RULE = (
    "handler.batch.maxMessages above 1 with catchup.enabled: the catch-up Job calls the handler once per message, "
    "and a batch handler expects a list; use one or the other"
)


class BatchSpec(_Model):
    """A batch handler: one call for the heads of several ready keys (``keyorder.batch``)."""

    max_messages: int = Field(
        1,
        ge=1,
        le=BATCH_MAX_MESSAGES_LIMIT,
        description="Above 1: the handler is a batch handler, called with a list of up to this many messages, "
        "at most one per key (the pods' --batch-max-messages). 1: one call per message.",
    )
    max_wait_ms: int = Field(
        0,
        ge=0,
        le=BATCH_MAX_WAIT_MS_LIMIT,
        description="Milliseconds a worker with fewer ready messages than maxMessages waits for more keys to "
        "become ready before it calls the handler (the pods' --batch-max-wait-ms); 0: it calls with what is ready.",
    )

    @property
    def enabled(self) -> bool:
        """True: the handler is a batch handler (as the pods' ``BatchLimits.enabled``)."""
        return self.max_messages > 1

    @model_validator(mode="after")
    def _wait_needs_batches(self) -> BatchSpec:
        if self.max_wait_ms and self.max_messages == 1:
            raise ValueError(BATCH_WAIT_RULE)
        return self


class HandlerSpec(_Model):
    image: str = Field(
        min_length=1, description="Image with keyorder and the handler package (FROM the keyorder image)."
    )
    handler: str = Field(pattern=r"^[\w.]+:[\w.]+$", description="Handler as 'package.module:function'.")
    executor: Executor = Field(
        Executor.AUTO,
        description="How the pods run the handler: thread, async, or process (one worker process per key worker, "
        "for CPU-bound handlers); auto: thread or async, by the handler.",
    )
    batch: BatchSpec = Field(
        default_factory=BatchSpec,
        description="A batch handler (docs/handler-tutorial.md, Batch handlers): the most messages per call and "
        "the longest wait to fill a call.",
    )
    env: list[EnvVar] = Field(
        default_factory=list,
        description="Extra environment variables for the handler, literal or from a Secret/ConfigMap (valueFrom); "
        "each name at most once.",
        json_schema_extra=keyed_list("name"),
    )
    env_from: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Variables from whole Secrets or ConfigMaps (Kubernetes EnvFromSource).",
        json_schema_extra={"items": kubernetes_type("EnvFromSource")},
    )
    volume_mounts: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Mounts of spec.template.spec.volumes into the handler's container (Kubernetes VolumeMount); "
        "each mountPath at most once.",
        json_schema_extra=keyed_list("mountPath", items="VolumeMount"),
    )
    resources: Resources = Field(default_factory=Resources, description="Container resources.")
    termination_grace_period_seconds: int = Field(
        30,
        ge=5,
        le=3600,
        description="Pod termination grace period; in-flight messages get this minus 5 s to finish. That shutdown "
        "grace, plus the pods' pause-after (0.5 s), plus 5 s, plus what the executor's stop may take after it "
        "(async or auto 10 s, process 11 s), must fit in their max.poll.interval.ms (librdkafka's default "
        "300000: at most 299 here for the thread executor, 289 for async or auto, 288 for process, unless the "
        "properties Secret raises it); else the pods refuse to start and the operator says why (LagUnknown).",
    )

    @property
    def shutdown_grace_seconds(self) -> int:
        """The pods' ``--shutdown-grace``: the termination grace period less 5 s for the rest of the shutdown."""
        return max(self.termination_grace_period_seconds - SHUTDOWN_RESERVE_SECONDS, 1)


class PodMetadata(_Model):
    labels: dict[str, str] = Field(
        default_factory=dict, description="Extra pod labels (the operator's app.kubernetes.io/* labels stay)."
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, description="Extra pod annotations, e.g. for Istio, Vault or Datadog."
    )


class PodOptions(_Model):
    """The pod-level settings a template may add; the containers and the security context stay the operator's."""

    image_pull_secrets: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Secrets to pull the handler image from a private registry; each name at most once.",
        json_schema_extra=keyed_list("name", items="LocalObjectReference"),
    )
    service_account_name: str | None = Field(
        None,
        min_length=1,
        description="The pods' ServiceAccount (for IRSA or workload identity); default: one the operator creates, "
        "with no token mounted.",
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels the pods must run on.")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Taints the pods tolerate.",
        json_schema_extra={"items": kubernetes_type("Toleration")},
    )
    affinity: dict[str, Any] | None = Field(
        None, description="Node and pod (anti-)affinity.", json_schema_extra=kubernetes_type("Affinity")
    )
    topology_spread_constraints: list[dict[str, Any]] = Field(
        default_factory=list,
        description="How the pods spread over zones or nodes (select them by app.kubernetes.io/instance); each "
        "topologyKey and whenUnsatisfiable pair at most once.",
        json_schema_extra=keyed_list("topologyKey", "whenUnsatisfiable", items="TopologySpreadConstraint"),
    )
    priority_class_name: str | None = Field(None, min_length=1, description="The pods' PriorityClass.")
    volumes: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra volumes, mounted by handler.volumeMounts; each name at most once. Only the types "
        "the restricted Pod Security Standard allows (configMap, csi, downwardAPI, emptyDir, ephemeral, "
        "persistentVolumeClaim, projected without serviceAccountToken, secret).",
        json_schema_extra=keyed_list("name", items="Volume"),
    )


class PodTemplate(_Model):
    """A partial PodTemplateSpec merged onto the pods the operator generates (and the catch-up Job's pod)."""

    metadata: PodMetadata = Field(default_factory=PodMetadata, description="Extra labels and annotations.")
    spec: PodOptions = Field(default_factory=PodOptions, description="Pod-level settings.")


class WorkersSpec(_Model):
    min: int = Field(1, ge=1, le=4096, description="Fewest key workers per pod.")
    max: int = Field(256, ge=1, le=4096, description="Most key workers per pod.")
    initial: int = Field(16, ge=1, le=4096, description="Key workers per pod before the autoscaler decides.")

    @model_validator(mode="after")
    def _ordered(self) -> WorkersSpec:
        if not self.min <= self.initial <= self.max:
            raise ValueError(f"need min <= initial <= max, got {self.min}, {self.initial}, {self.max}")
        return self


class ReplicasSpec(_Model):
    min: int = Field(1, ge=0, description="Fewest pods (0 only with scaling.scaleToZero).")
    max: int | None = Field(None, ge=1, description="Most pods; defaults to, and is capped at, the partition count.")

    @model_validator(mode="after")
    def _ordered(self) -> ReplicasSpec:
        if self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self


class RatePolicyType(StrEnum):
    PODS = "Pods"
    PERCENT = "Percent"


class RatePolicySpec(_Model):
    type: RatePolicyType = Field(description="Pods: a number of pods; Percent: a percentage of the current pods.")
    value: int = Field(ge=1, le=10000, description="Pods or percent per period.")
    period_seconds: int = Field(ge=1, le=3600, description="The period the change is counted over.")


class FallbackSpec(_Model):
    failure_threshold: int = Field(
        ge=1, le=1000, description="Polls in a row whose lag could not be measured before the fallback size."
    )
    replicas: int = Field(ge=0, description="Pods to run while the lag cannot be measured.")


class ScalingMode(StrEnum):
    APPLY = "apply"
    RECOMMEND = "recommend"


class ScalingSpec(_Model):
    enabled: bool = Field(True, description="false: manual size (replicas.min pods, workers.initial workers).")
    mode: ScalingMode = Field(
        ScalingMode.APPLY,
        description="apply: scale the pods; recommend: compute and publish each decision (status.recommendation, "
        "Events, metrics) and change nothing, to watch the autoscaler beside another one before trusting it.",
    )
    target_drain_seconds: int = Field(300, ge=1, description="Drain the backlog within this many seconds.")
    activation_lag: int = Field(100, ge=0, description="Below this lag, no more than the minimum size.")
    poll_interval_seconds: int = Field(15, ge=1, description="Seconds between lag observations.")
    scale_up_stabilization_seconds: int = Field(
        0, ge=0, description="Scale up to the smallest recommendation of this window."
    )
    scale_down_stabilization_seconds: int = Field(
        300, ge=0, description="Scale down to the largest recommendation of this window."
    )
    tolerance: float = Field(
        0.1,
        ge=0,
        le=0.9,
        description="A change of fewer workers than this share of the current ones is not made (HPA's tolerance): "
        "noise at a capacity boundary does not resize the group.",
    )
    target_utilization_percent: int = Field(
        80,
        ge=10,
        le=100,
        description="The share of the workers' measured capacity that steady arrivals may use; the rest is "
        "headroom for noise (like an HPA utilisation target).",
    )
    scale_to_zero: bool = Field(False, description="Allow zero pods while the lag is zero.")
    limit_to_partitions_with_lag: bool = Field(
        False, description="No more pods than partitions with lag (like KEDA's limitToPartitionsWithLag)."
    )
    scale_up_policies: list[RatePolicySpec] = Field(
        default_factory=list,
        description="HPA-style limits on adding pods (the most permissive applies; workers make up the "
        "capacity meanwhile). Empty: HPA's default, the larger of 4 pods or 100% per 15 s.",
    )
    scale_down_policies: list[RatePolicySpec] = Field(
        default_factory=list,
        description="HPA-style limits on removing pods (the most restrictive applies). Empty: no limit.",
    )
    fallback: FallbackSpec | None = Field(
        None, description="Size to take after this many failed lag observations in a row (like KEDA's fallback)."
    )


class RetrySpec(_Model):
    max_attempts: int = Field(5, ge=1, description="Handler attempts per message.")
    initial_backoff_seconds: float = Field(
        0.2, ge=0, le=86400, description="Wait before the second attempt (doubles); at most a day."
    )
    max_backoff_seconds: float = Field(
        30.0, gt=0, le=86400, description="Longest wait between attempts; at most a day (the pods refuse more)."
    )
    on_exhausted: OnExhausted = Field(OnExhausted.DLQ, description="dlq or block after maxAttempts.")
    dlq_topic: str = Field("{topic}.dlq", min_length=1, description="Dead-letter topic ({topic} = source).")


class CatchupSpec(_Model):
    enabled: bool = Field(
        False,
        description="Hand an enormous backlog to a Spark catch-up Job "
        "(`keyorder catchup`) instead of waiting for the pods.",
    )
    trigger_drain_seconds: int = Field(
        3600,
        ge=60,
        description="Start catch-up when the projected drain time at maximum scale exceeds this many seconds.",
    )
    image: str | None = Field(
        None,
        min_length=1,
        description="Image of the catch-up Job and its Spark executors: keyorder, PySpark, Java and the handler "
        "(the Dockerfile's `catchup` target plus your handler, examples/handler/Dockerfile). Required when enabled: "
        "the handler image has no Java or PySpark. The operator checks it once per image, before it stops the pods.",
    )
    master: str = Field(
        "local[*]", min_length=1, description="Spark master URL, e.g. local[*] or k8s://https://kubernetes.default.svc."
    )
    executors: int = Field(
        2, ge=1, le=1000, description="Spark executors (spark.executor.instances) on a cluster master."
    )
    key_partitions: int = Field(
        0, ge=0, le=100000, description="Spark partitions keys are hashed into; 0 means one per available core."
    )
    task_workers: int = Field(
        16, ge=1, le=1024, description="Handler threads per Spark task: different keys in parallel, each key in order."
    )
    spark_conf: dict[str, str] = Field(
        default_factory=dict,
        description="Extra Spark settings (name: value), e.g. spark.kubernetes.container.image for a k8s:// master.",
    )
    resources: Resources = Field(default_factory=Resources, description="Resources of the Job's driver pod.")
    backoff_limit: int = Field(
        2,
        ge=0,
        le=10,
        description="Job retries after its driver pod failed (a lost node, an OOM kill): a failed run keeps only "
        "the waves it committed, so a retry resumes after them. A wave's transient faults are retried inside the "
        "run (--wave-retries); a run refused at start fails the Job at once whatever this says: for its settings "
        "(exit 2: catch-up off until the spec changes) or for a state of the group that passes (exit 3: the operator "
        "tries again after a back-off, status.catchupRetry).",
    )
    max_seconds: int = Field(
        6 * 3600,
        ge=60,
        le=7 * 24 * 3600,
        description="The Job's activeDeadlineSeconds: "
        "a catch-up still running (or never scheduled) after this fails, and the pods resume.",
    )
    executor_cores: int = Field(1, ge=1, le=256, description="Cores per Spark executor (spark.executor.cores).")
    per_core_rate: float = Field(
        2000.0,
        gt=0,
        le=10_000_000,
        description="Messages/s one Spark core handles at most for this handler; measure it with "
        "`keyorder catchup-bench`. With executors and executorCores it decides whether catch-up beats the pods.",
    )
    confirm_polls: int = Field(
        3, ge=1, le=100, description="Polls in a row on which catch-up must win before it starts."
    )
    cooldown_seconds: int = Field(
        1800,
        ge=0,
        le=7 * 24 * 3600,
        description="Seconds after a hand-over ends before another may start (after a Job refused for a state "
        "that passes, its back-off instead: 1 min doubling to 30 min).",
    )
    service_account_name: str | None = Field(
        None,
        min_length=1,
        description="ServiceAccount of the Spark driver "
        "with a k8s:// master (it creates executor pods); ignored otherwise. "
        "Default: the consumers' account, with no API access and no token.",
    )

    @model_validator(mode="after")
    def _image_when_enabled(self) -> CatchupSpec:
        if self.enabled and self.image is None:
            raise ValueError(CATCHUP_IMAGE_RULE)
        return self

    @model_validator(mode="after")
    def _no_fixed_spark_settings(self) -> CatchupSpec:
        """What ``keyorder catchup`` would refuse at start, after the pods were stopped: refused here, before."""
        if fixed_setting_overrides(self.spark_conf):
            raise ValueError(FIXED_SPARK_SETTINGS_RULE)
        if self.enabled and master_attempts_problem(self.master):
            raise ValueError(MASTER_ATTEMPTS_RULE)
        if self.enabled and cluster_secret_missing(self.master, self.spark_conf):
            raise ValueError(CLUSTER_SECRET_RULE)
        return self


CATCHUP_IMAGE_RULE = (
    "spec.catchup.image is required when spec.catchup.enabled: the handler image has no Java/PySpark; "
    "build the image's `catchup` target (with your handler: examples/handler/Dockerfile)"
)
"""Why a catch-up without its own image is refused (the model and the CRD's CEL rule say the same)."""

FIXED_SPARK_SETTINGS_RULE = (
    "spec.catchup.sparkConf cannot set "
    + ", ".join(f"{name} to other than {required}" for name, required in ENFORCED_SPARK_SETTINGS.items())
    + ": keyorder catchup fixes them (a speculative or retried task would handle keys twice or concurrently) "
    "and would refuse to start, after the pods were stopped"
)
"""Why ``spec.catchup.sparkConf`` may not give an enforced setting another value (``keyorder.catchup.settings``,
``fixed_setting_overrides``: what ``keyorder catchup --spark-conf`` refuses): at admission, before a hand-over
stops any pod (the model and the CRD's CEL rule say the same)."""

MASTER_ATTEMPTS_RULE = (
    "spec.catchup.master local[n,f] with f above 1 runs a failed handler task again inside its wave, whatever "
    "spark.task.maxFailures says: keyorder catchup would refuse it after the pods were stopped; use local[n]"
)
"""Why a ``local[n,f]`` master is refused (``settings.master_attempts_problem``; the model and the CEL rule)."""

CLUSTER_SECRET_RULE = (
    "spec.catchup.master spark:// (or local-cluster) needs the secret its master and workers share: give "
    'spec.catchup.sparkConf spark.authenticate.secret, or spark.authenticate: "false" to run without '
    "authentication and encryption (docs/security.md); keyorder catchup would refuse to start without, after "
    "the pods were stopped"
)
"""Why a catch-up on a master with a cluster-wide secret needs it in ``sparkConf`` (``settings.cluster_secret_missing``:
the operator passes the job only ``sparkConf``; the model and the CEL rule)."""


class ObservabilitySpec(_Model):
    show_keys: bool = Field(
        False,
        description="Name message keys in status and Events as they are; by default they are named by a keyed "
        "digest (key:...), because keys are often customer or account ids and status is readable by the view role.",
    )


class OrderedConsumerSpec(_Model):
    """spec of an OrderedConsumer."""

    kafka: KafkaSpec
    handler: HandlerSpec
    ordering: Ordering = Field(Ordering.KEY, description="key, partition or unordered.")
    workers: WorkersSpec = Field(default_factory=WorkersSpec)
    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    scaling: ScalingSpec = Field(default_factory=ScalingSpec)
    retry: RetrySpec = Field(default_factory=RetrySpec)
    catchup: CatchupSpec = Field(default_factory=CatchupSpec)
    template: PodTemplate = Field(default_factory=PodTemplate)
    observability: ObservabilitySpec = Field(default_factory=ObservabilitySpec)
    http_port: int = Field(8080, ge=1024, le=65535, description="Pods' metrics/health/admin port.")

    @model_validator(mode="after")
    def _zero_needs_scale_to_zero(self) -> OrderedConsumerSpec:
        if self.replicas.min == 0 and not self.scaling.scale_to_zero:
            raise ValueError("replicas.min 0 needs scaling.scaleToZero: true")
        fallback = self.scaling.fallback
        if fallback is not None and fallback.replicas == 0 and not self.scaling.scale_to_zero:
            raise ValueError("scaling.fallback.replicas 0 needs scaling.scaleToZero: true (it stops every pod)")
        if self.handler.batch.enabled and self.catchup.enabled:
            raise ValueError(BATCH_CATCHUP_RULE)
        return self


class InvalidSpec(ValueError):
    """The resource's spec is invalid; ``problems`` are ``(field path, message)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {message}" for path, message in problems))


HARDENING_FIELDS = frozenset(
    {
        "securityContext",
        "containers",
        "initContainers",
        "hostNetwork",
        "hostPID",
        "hostIPC",
        "hostUsers",
        "automountServiceAccountToken",
        "privileged",
        "runAsUser",
        "runAsNonRoot",
        "capabilities",
        "readOnlyRootFilesystem",
        "allowPrivilegeEscalation",
        "seccompProfile",
    }
)
"""Pod and container fields that decide the pods' hardening: no template field sets them; naming one is
reported as an attempt to weaken it, not as a mere unknown field."""


def _path(location: tuple[int | str, ...]) -> str:
    path = "spec"
    for part in location:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name an OrderedConsumer (the CRD states the same rule), or ``None``."""
    if len(name) > MAX_NAME_LENGTH or not re.match(NAME_PATTERN, name):
        return f"{name!r} {NAME_RULE}"
    return None


ALLOWED_VOLUME_TYPES = (
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
)
"""The volume types a template may add: the Pod Security Standards' ``restricted`` level allows these and no
other (kubernetes/kubernetes ``staging/src/k8s.io/pod-security-admission/policy/check_restrictedVolumes.go``,
``restrictedVolumes_1_0``). Every other type reaches outside the namespace's own objects: the node's files
(hostPath), a server on the network (nfs, iscsi, rbd, cephfs, glusterfs...), an in-tree cloud disk, or
another image's content: the operator would mount it for anyone who may write an OrderedConsumer."""

APPARMOR_ANNOTATION_PREFIX = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_POD_ANNOTATION = "seccomp.security.alpha.kubernetes.io/pod"
SECCOMP_CONTAINER_ANNOTATION_PREFIX = "container.seccomp.security.alpha.kubernetes.io/"


def _allowed_apparmor(value: str) -> bool:
    """An AppArmor annotation's value the ``baseline`` level allows: empty, ``runtime/default`` or
    ``localhost/<profile>`` (pod-security-admission ``policy/check_appArmorProfile.go``, ``allowedProfile``);
    ``unconfined`` turns AppArmor off for the container."""
    return value in ("", "runtime/default") or value.startswith("localhost/")


def _allowed_seccomp(value: str) -> bool:
    """A seccomp annotation's value the ``baseline`` level allows (pod-security-admission
    ``policy/check_seccompProfile_baseline.go``, ``validSeccompAnnotationValue``); ``unconfined`` turns the
    pods' ``RuntimeDefault`` profile off on a kubelet that still reads the annotation."""
    return value in ("runtime/default", "docker/default") or value.startswith("localhost/")


def annotation_problems(annotations: dict[str, str]) -> list[tuple[str, str]]:
    """Pod annotations that would switch a confinement off: an AppArmor or seccomp profile the Pod Security
    Standards' ``baseline`` level refuses (``unconfined``, anything not the runtime's default or a node's
    ``localhost/`` profile). The security-context fields that say the same (``appArmorProfile``,
    ``seccompProfile``) are no template fields at all (``HARDENING_FIELDS``)."""
    problems: list[tuple[str, str]] = []
    for key, value in sorted(annotations.items()):
        path = f"spec.template.metadata.annotations.{key}"
        if key.startswith(APPARMOR_ANNOTATION_PREFIX) and not _allowed_apparmor(value):
            problems.append(
                (
                    path,
                    f"AppArmor profile {value!r} would lift the pods' confinement ({HARDENING}); "
                    "only runtime/default or localhost/<profile>",
                )
            )
        elif (key == SECCOMP_POD_ANNOTATION or key.startswith(SECCOMP_CONTAINER_ANNOTATION_PREFIX)) and (
            not _allowed_seccomp(value)
        ):
            problems.append(
                (
                    path,
                    f"seccomp profile {value!r} would lift the pods' seccomp RuntimeDefault ({HARDENING}); "
                    "only runtime/default or localhost/<profile>",
                )
            )
    return problems


def volume_problems(path: str, volume: dict[str, Any]) -> list[tuple[str, str]]:
    """What in one template volume (at ``path``) reaches beyond the namespace or the pods' identity: a type
    outside ``ALLOWED_VOLUME_TYPES``, or a projected ``serviceAccountToken`` (the pods run with
    ``automountServiceAccountToken: false``, and the template may name any ServiceAccount of the namespace:
    such a source would hand the handler an API token the operator says the pods do not have)."""
    problems: list[tuple[str, str]] = []
    allowed = ", ".join(ALLOWED_VOLUME_TYPES)
    for field in sorted(set(volume) - {"name", *ALLOWED_VOLUME_TYPES}):
        problems.append(
            (
                f"{path}.{field}",
                f"{field} volumes reach outside the namespace's objects and would bypass the "
                f"pods' hardening ({HARDENING}); allowed: {allowed} (the restricted Pod Security Standard's)",
            )
        )
    projected = volume.get("projected")
    sources = projected.get("sources") if isinstance(projected, dict) else None
    for index, source in enumerate(sources if isinstance(sources, list) else ()):
        if isinstance(source, dict) and "serviceAccountToken" in source:
            problems.append(
                (
                    f"{path}.projected.sources[{index}].serviceAccountToken",
                    "the pods carry no Kubernetes API token (automountServiceAccountToken: false); a projected "
                    "token would give the handler one, for whichever ServiceAccount the template names",
                )
            )
    return problems


def template_problems(spec: OrderedConsumerSpec) -> list[tuple[str, str]]:
    """What in the pod template would replace or weaken what the operator generates (field path, message)."""
    problems: list[tuple[str, str]] = []
    metadata, pod = spec.template.metadata, spec.template.spec
    for key in sorted(set(metadata.labels) & OPERATOR_LABELS):
        problems.append((f"spec.template.metadata.labels.{key}", "set by the operator (it selects the pods by it)"))
    for key in sorted(set(metadata.annotations) & OPERATOR_ANNOTATIONS):
        problems.append((f"spec.template.metadata.annotations.{key}", "set by the operator"))
    problems += annotation_problems(metadata.annotations)
    volume_names: set[str] = set()
    for index, volume in enumerate(pod.volumes):
        path = f"spec.template.spec.volumes[{index}]"
        name = volume.get("name")
        if not isinstance(name, str) or not name:
            problems.append((f"{path}.name", "a volume needs a name"))
        elif name in OPERATOR_VOLUMES:
            problems.append((f"{path}.name", f"{name!r} is the operator's own volume; choose another name"))
        else:  # a name given twice is a duplicate_problems finding
            volume_names.add(name)
        problems += volume_problems(path, volume)
    for index, mount in enumerate(spec.handler.volume_mounts):
        path = f"spec.handler.volumeMounts[{index}]"
        mount_path = str(mount.get("mountPath") or "").rstrip("/") or "/"
        if mount_path in OPERATOR_MOUNT_PATHS or mount_path.startswith("/etc/keyorder/"):
            problems.append((f"{path}.mountPath", f"{mount_path!r} is used by the operator; choose another path"))
        if mount.get("name") not in volume_names:
            problems.append((f"{path}.name", f"{mount.get('name')!r} names no volume in spec.template.spec.volumes"))
    for index, variable in enumerate(spec.handler.env):
        if variable.name in OPERATOR_ENV:
            problems.append(
                (f"spec.handler.env[{index}].name", f"{variable.name} is set by the operator from the spec")
            )
    return problems


def _keyed_lists(model: BaseModel, path: str) -> Iterator[tuple[str, list[Any], tuple[str, ...]]]:
    """Every list marked by ``keyed_list`` in ``model`` and the models it holds: (field path, items, keys)."""
    for name, field in type(model).model_fields.items():
        value, field_path = getattr(model, name), f"{path}.{field.alias or name}"
        extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
        if extra.get(LIST_TYPE) == "map" and isinstance(value, list):
            keys = extra[LIST_MAP_KEYS]
            yield field_path, value, tuple(str(key) for key in keys) if isinstance(keys, list) else ()
        if isinstance(value, BaseModel):
            yield from _keyed_lists(value, field_path)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                if isinstance(item, BaseModel):
                    yield from _keyed_lists(item, f"{field_path}[{index}]")


def duplicate_problems(spec: OrderedConsumerSpec) -> list[tuple[str, str]]:
    """Items of a keyed list (``keyed_list``) that repeat an earlier item's keys, or lack a key (field path,
    message). The CRD refuses both; a resource stored under an older CRD still reaches the operator, and
    server-side apply would refuse every Deployment built from it."""
    problems: list[tuple[str, str]] = []
    for path, items, keys in _keyed_lists(spec, "spec"):
        named = " and ".join(keys)
        first: dict[tuple[Any, ...], int] = {}
        for index, item in enumerate(items):
            fields = item.model_dump(by_alias=True) if isinstance(item, BaseModel) else dict(item)
            missing = [key for key in keys if fields.get(key) is None]
            if missing:
                problems += [(f"{path}[{index}].{key}", f"required: the list is keyed by {named}") for key in missing]
                continue
            key = tuple(fields[key] for key in keys)
            if key not in first:
                first[key] = index
                continue
            where = f"{path}[{index}]" + (f".{keys[0]}" if len(keys) == 1 else "")
            shown = ", ".join(f"{name} {value!r}" for name, value in zip(keys, key, strict=True))
            problems.append(
                (
                    where,
                    f"duplicate entry: {shown} is already {path}[{first[key]}]; Kubernetes keys this list by "
                    f"{named}, and server-side apply refuses the pods' Deployment with two",
                )
            )
    return problems


def parse_spec(spec: dict) -> OrderedConsumerSpec:
    """Validate a resource's ``spec``; raises ``InvalidSpec`` naming each bad field as ``spec.a.b``.

    Beyond the models, a keyed list may not repeat a key (``duplicate_problems``), and the pod template may
    not replace what the operator generates nor weaken the pods' hardening (``template_problems``)."""
    try:
        parsed = OrderedConsumerSpec.model_validate(spec)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            location = item["loc"]
            message = item["msg"]
            if item["type"] == "extra_forbidden" and location and location[-1] in HARDENING_FIELDS:
                message = f"the operator owns the pods' hardening ({HARDENING}); a template cannot set it"
            problems.append((_path(location), message))
        raise InvalidSpec(problems) from None
    problems = duplicate_problems(parsed) + template_problems(parsed)
    if problems:
        raise InvalidSpec(problems)
    return parsed
