"""The OrderedConsumer custom resource: pydantic models, the single source of its schema.

The CRD's openAPIV3Schema is generated from these models (so the API server and the operator
can never disagree), and the operator validates every resource with them: an invalid spec
becomes an ``InvalidSpec`` condition naming the field path, and nothing else is touched.
Field names are camelCase on the wire (Kubernetes convention) and snake_case in Python.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

GROUP = "keyorder.dev"
VERSION = "v1alpha1"
KIND = "OrderedConsumer"
PLURAL = "orderedconsumers"
SHORT_NAME = "okc"
PAUSE_ANNOTATION = "keyorder.dev/paused"
"""``"true"`` on a resource freezes its size and catch-up where they are (like KEDA's paused annotation)."""


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


class SecretKeyRef(_Model):
    name: str = Field(min_length=1, description="Name of a Secret in the resource's namespace.")
    key: str = Field(
        "client.properties",
        min_length=1,
        description="Key of the Secret holding a Java-style properties file of librdkafka settings (SASL/TLS).",
    )


class KafkaSpec(_Model):
    bootstrap_servers: str = Field(min_length=1, description="Kafka bootstrap servers, host:port[,host:port].")
    topics: list[str] = Field(min_length=1, description="Topics to consume.")
    group_id: str = Field(min_length=1, description="Consumer group id (the operator reads its lag).")
    properties_secret_ref: SecretKeyRef | None = Field(
        None, description="Secret with client properties; mounted into the pods, read by the operator. Never logged."
    )


class EnvVar(_Model):
    name: str = Field(min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_.-]*$", description="Variable name.")
    value: str = Field("", description="Variable value.")


class Resources(_Model):
    requests: dict[str, str] = Field(default_factory=dict, description="Resource requests, e.g. cpu: 500m.")
    limits: dict[str, str] = Field(default_factory=dict, description="Resource limits, e.g. memory: 512Mi.")


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
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment variables for the handler.")
    resources: Resources = Field(default_factory=Resources, description="Container resources.")
    termination_grace_period_seconds: int = Field(
        30, ge=5, le=3600, description="Pod termination grace period; in-flight messages get this minus 5 s to finish."
    )


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


class ScalingSpec(_Model):
    enabled: bool = Field(True, description="false: manual size (replicas.min pods, workers.initial workers).")
    target_drain_seconds: int = Field(300, ge=1, description="Drain the backlog within this many seconds.")
    activation_lag: int = Field(100, ge=0, description="Below this lag, no more than the minimum size.")
    poll_interval_seconds: int = Field(15, ge=1, description="Seconds between lag observations.")
    scale_up_stabilization_seconds: int = Field(
        0, ge=0, description="Scale up to the smallest recommendation of this window."
    )
    scale_down_stabilization_seconds: int = Field(
        300, ge=0, description="Scale down to the largest recommendation of this window."
    )
    scale_to_zero: bool = Field(False, description="Allow zero pods while the lag is zero.")
    limit_to_partitions_with_lag: bool = Field(
        False, description="No more pods than partitions with lag (like KEDA's limitToPartitionsWithLag)."
    )
    scale_up_policies: list[RatePolicySpec] = Field(
        default_factory=list,
        description="HPA-style limits on adding pods (the most permissive applies; workers make up the "
        "capacity meanwhile). Empty: no limit.",
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
        description="Image of the catch-up Job (keyorder, PySpark, Java and the handler); defaults to handler.image.",
    )
    master: str = Field(
        "local[*]", min_length=1, description="Spark master URL, e.g. local[*] or k8s://https://kubernetes.default.svc."
    )
    executors: int = Field(
        2, ge=1, le=1000, description="Spark executors (spark.executor.instances) on a cluster master."
    )
    key_partitions: int = Field(
        0, ge=0, le=100000, description="Spark partitions keys are hashed into; 0 means 4 per available core."
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
        0, ge=0, le=10, description="Job retries; a failed run commits nothing, so a retry is safe."
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
        1800, ge=0, le=7 * 24 * 3600, description="Seconds after a hand-over ends before another may start."
    )
    service_account_name: str | None = Field(
        None,
        min_length=1,
        description="ServiceAccount of the Spark driver "
        "with a k8s:// master (it creates executor pods); ignored otherwise. "
        "Default: the consumers' account, with no API access and no token.",
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
    http_port: int = Field(8080, ge=1024, le=65535, description="Pods' metrics/health/admin port.")

    @model_validator(mode="after")
    def _zero_needs_scale_to_zero(self) -> OrderedConsumerSpec:
        if self.replicas.min == 0 and not self.scaling.scale_to_zero:
            raise ValueError("replicas.min 0 needs scaling.scaleToZero: true")
        return self


class InvalidSpec(ValueError):
    """The resource's spec is invalid; ``problems`` are ``(field path, message)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{path}: {message}" for path, message in problems))


def parse_spec(spec: dict) -> OrderedConsumerSpec:
    """Validate a resource's ``spec``; raises ``InvalidSpec`` naming each bad field as ``spec.a.b``."""
    try:
        return OrderedConsumerSpec.model_validate(spec)
    except ValidationError as error:
        problems = []
        for item in error.errors():
            path = ".".join(["spec", *(str(part) for part in item["loc"])])
            problems.append((path, item["msg"]))
        raise InvalidSpec(problems) from None
