"""Issue 38, defects 3 and 7: a catch-up refused for a passing reason is retried after a back-off, not blamed
on the image; fixed Spark settings are refused at admission; executors the operator cannot see are given
time to stop before the consumer pods resume.

Each trigger of defect 3 is followed from where ``keyorder catchup`` meets it (its refusal and exit status)
to what the operator reads of it (the driver's termination message) and decides (retry, back-off, verdict).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from confluent_kafka import KafkaError, KafkaException

from keyorder.catchup.command import refusal_of, refuse
from keyorder.catchup.exits import EXIT_CONFIG, EXIT_PASSING, RUNTIME, Refusal, RefusalKind
from keyorder.catchup.offsets import members_unknown
from keyorder.catchup.plan import PartitionSnapshot, PassingPlanError, PlanError, refuse_live_group, resolve_ranges
from keyorder.catchup.positions import parse_position
from keyorder.catchup.settings import CatchupConfig, cluster_secret_missing, master_attempts_problem
from keyorder_operator.catchup import (
    RETRY_FIRST_SECONDS,
    RETRY_LIMIT,
    RETRY_MAX_SECONDS,
    CatchupGate,
    CatchupRetry,
    CatchupRun,
    Phase,
    catchup_verdict,
    executor_drain_seconds,
    job_refusal,
    refusal_detail,
    retry_delay,
    spark_seconds,
    unobserved_drain_seconds,
    unobserved_executors_left,
)
from keyorder_operator.policy import Observation, ScalingLimits
from keyorder_operator.spec import InvalidSpec, parse_spec

LIMITS = ScalingLimits(max_replicas=None, max_workers=64, initial_workers=16)
GATE = CatchupGate(
    enabled=True, trigger_seconds=99, executors=64, executor_cores=2, per_core_rate=2000, confirm_polls=1
)
"""Spark wins: 64 x 2 x 16 = 2,048 msg/s against the pods' 512 (as in test_operator_catchup)."""
SLOW = Observation(lag=51_200, partitions=8, arrival_rate=0.0)


def describe_groups_failed() -> None:
    moving = members_unknown(KafkaException(KafkaError(KafkaError.NOT_COORDINATOR)))  # a coordinator move
    refuse_live_group(moving, commit=True, group="g")


def describe_groups_timed_out() -> None:
    refuse_live_group(members_unknown(TimeoutError()), commit=True, group="g")


def killed_pod_still_a_member() -> None:
    refuse_live_group(1, commit=True, group="g")  # a pod killed after its grace, a member until its session ends


def partition_added_after_the_fence() -> None:
    snapshots = {("t", p): PartitionSnapshot(earliest=0, end=100, committed=10) for p in range(3)}
    fence = parse_position("t:0=50,t:1=60", "--until")  # recorded while the topic had 2 partitions
    resolve_ranges(snapshots, parse_position("committed", "--start"), fence)


TRIGGERS = {
    "describe-groups failed": describe_groups_failed,
    "describe-groups timed out": describe_groups_timed_out,
    "a killed pod still a member": killed_pod_still_a_member,
    "a partition added after the fence": partition_added_after_the_fence,
}


def failed_on_policy() -> dict:
    return {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}]}}


def driver_pod(code: int, message: str) -> dict:
    terminated = {"exitCode": code, "message": message}
    return {
        "metadata": {"creationTimestamp": "2026-11-28T03:00:00Z"},
        "status": {"containerStatuses": [{"name": "catchup", "state": {"terminated": terminated}}]},
    }


@pytest.mark.parametrize("trigger", sorted(TRIGGERS))
def test_each_passing_trigger_exits_3_and_the_operator_reads_it_as_passing(trigger, tmp_path, monkeypatch) -> None:
    """Before: each raised a plain PlanError, keyorder catchup exited 2, and the operator blamed the image and
    switched catch-up off for the spec generation."""
    with pytest.raises(PassingPlanError) as raised:
        TRIGGERS[trigger]()
    termination_log = tmp_path / "termination-log"
    termination_log.touch()  # the kubelet creates it in a container
    monkeypatch.setattr("keyorder.catchup.exits.TERMINATION_LOG", termination_log)
    assert refuse(refusal_of(raised.value)) == EXIT_PASSING
    written = termination_log.read_text()
    assert json.loads(written)["refused"] == "passing"

    refusal = job_refusal(failed_on_policy(), [driver_pod(EXIT_PASSING, written)])
    assert refusal is not None and refusal.kind is RefusalKind.PASSING
    assert refusal.reason == str(raised.value)
    detail = refusal_detail(refusal, "reg/spark:1", "o-catchup-1")
    assert "reg/spark:1" not in detail and "image" not in detail  # the image just passed its pre-flight


@pytest.mark.parametrize(
    "code", [KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.UNSUPPORTED_VERSION, KafkaError._UNSUPPORTED_FEATURE]
)
def test_a_describe_groups_error_that_does_not_pass_is_a_settings_refusal_naming_spec_kafka(code) -> None:
    """Review of issue 38, finding 1. Before: every describe-groups error was a passing refusal (exit 3), so a
    missing DESCRIBE ACL or an old broker stopped and restarted the pods on the back-off forever."""
    unknown = members_unknown(KafkaException(KafkaError(code)))
    assert not unknown.passes and KafkaError(code).name() in unknown.reason
    with pytest.raises(PlanError) as raised:
        refuse_live_group(unknown, commit=True, group="g")
    assert not isinstance(raised.value, PassingPlanError)
    refusal = refusal_of(raised.value)
    assert refusal.exit_status == EXIT_CONFIG
    told = job_refusal(failed_on_policy(), [driver_pod(EXIT_CONFIG, refusal.message())])
    assert told is not None and told.kind is RefusalKind.SETTINGS
    assert "change spec.kafka" in refusal_detail(told, "reg/spark:1", "o-catchup-1")
    assert refuse_live_group(unknown, commit=True, group="g", allow_unknown=True) is None  # told to go on


def test_an_explicit_start_that_misses_a_partition_is_a_settings_refusal_only_the_until_fence_passes() -> None:
    """Review of issue 38, finding 9. Before: `--start t:0=5` on a topic with partitions 0 and 1 exited 3
    (passing) and would be retried, though only a person can add the missing offset."""
    snapshots = {("t", p): PartitionSnapshot(earliest=0, end=100, committed=10) for p in range(2)}
    with pytest.raises(PlanError, match="--start: no offset given for t:1") as raised:
        resolve_ranges(snapshots, parse_position("t:0=5", "--start"), parse_position("end", "--until"))
    assert not isinstance(raised.value, PassingPlanError)
    assert refusal_of(raised.value) == Refusal(RefusalKind.SETTINGS, str(raised.value), "--start")
    with pytest.raises(PassingPlanError, match="--until: no offset given for t:1"):  # the operator's stale fence
        resolve_ranges(snapshots, parse_position("committed", "--start"), parse_position("t:0=50", "--until"))


def test_a_passing_exit_without_a_message_is_still_passing_and_settings_name_their_field() -> None:
    assert job_refusal(failed_on_policy(), [driver_pod(EXIT_PASSING, "")]).kind is RefusalKind.PASSING
    settings = job_refusal(failed_on_policy(), [driver_pod(EXIT_CONFIG, "a log line, not JSON")])
    assert settings is not None and settings.kind is RefusalKind.SETTINGS


def test_refusals_other_than_passing_keep_their_exit_status_and_setting() -> None:
    from keyorder.catchup.job import SparkSettingsError, SparkStartError
    from keyorder.catchup.plan import PlanError

    assert refusal_of(SparkStartError("no Java")) == Refusal(RefusalKind.SETTINGS, "no Java", RUNTIME)
    assert refusal_of(SparkSettingsError("secret")).setting == "--spark-conf"
    assert refusal_of(PlanError("--until committed makes an empty range")).exit_status == EXIT_CONFIG


def test_a_long_reason_still_fits_the_kubelets_termination_message() -> None:
    for reason in ("x" * 10_000, '"quoted" ' * 1_000, "é" * 5_000):  # escapes and UTF-8 take more bytes
        message = Refusal(RefusalKind.PASSING, reason).message()
        assert len(message.encode()) <= 4096 and Refusal.parse(message).kind is RefusalKind.PASSING
        assert Refusal.parse(message).reason.endswith(" ...")


def test_the_back_off_doubles_from_a_minute_up_to_half_an_hour() -> None:
    assert [retry_delay(n) for n in (1, 2, 3)] == [
        RETRY_FIRST_SECONDS,
        2 * RETRY_FIRST_SECONDS,
        4 * RETRY_FIRST_SECONDS,
    ]
    assert retry_delay(30) == RETRY_MAX_SECONDS
    first = CatchupRetry.after(None, "group 'g' has 1 active members", now=1000.0)
    second = CatchupRetry.after(first, "again", now=2000.0)
    assert (first.failures, first.not_before) == (1, 1000.0 + RETRY_FIRST_SECONDS)
    assert (second.failures, second.not_before) == (2, 2000.0 + 2 * RETRY_FIRST_SECONDS)
    assert CatchupRetry.from_status({"catchupRetry": second.to_status()}) == second  # survives a restart
    assert CatchupRetry.from_status({}) is None


def test_the_fifth_passing_refusal_in_a_row_is_taken_as_lasting() -> None:
    """Review of issue 38, finding 1: before, passing refusals were retried forever."""
    retry = None
    for failures in range(1, RETRY_LIMIT + 1):
        retry = CatchupRetry.after(retry, "group 'g' has 1 active members", now=1000.0 * failures)
        assert retry.exhausted == (failures == RETRY_LIMIT == 5)


def verdict(now: float, retry: CatchupRetry | None, ended: float | None = 1000.0):
    gate = replace(GATE, cooldown_seconds=1800.0)
    return catchup_verdict(gate, SLOW, 1.0, LIMITS, None, 0, ended, now, retry)


def test_a_passing_refusal_is_tried_again_when_its_back_off_ends_not_after_the_cooldown() -> None:
    retry = CatchupRetry.after(None, "group 'g' has 1 active members", now=1000.0)
    waiting = verdict(now=1000.0 + RETRY_FIRST_SECONDS - 1, retry=retry)
    assert waiting.start is None and "catch-up tried again in" in (waiting.waiting or "")
    assert "1 active members" in (waiting.waiting or "")
    due = verdict(now=1000.0 + RETRY_FIRST_SECONDS, retry=retry)  # well inside the 1800 s cooldown
    assert due.start is not None
    assert verdict(now=1000.0 + RETRY_FIRST_SECONDS, retry=None).start is None  # a success cools down


def test_a_fixed_spark_setting_is_refused_by_the_spec_check_naming_the_field() -> None:
    """Before: spec.catchup.sparkConf passed admission and keyorder catchup refused it after the pods were
    stopped (exit 2: blamed on the image)."""
    base = {
        "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
        "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle"},
    }
    for name in ("spark.speculation", "spark.task.maxFailures", "spark.stage.maxConsecutiveAttempts"):
        catchup = {"enabled": True, "image": "reg/spark:1", "sparkConf": {name: "4"}}
        with pytest.raises(InvalidSpec) as refused:
            parse_spec({**base, "catchup": catchup})
        (path, message), *_ = refused.value.problems
        assert path == "spec.catchup" and "spec.catchup.sparkConf cannot set" in message and name in message
    allowed = {"enabled": True, "image": "reg/spark:1", "sparkConf": {"spark.executor.memory": "4g"}}
    assert parse_spec({**base, "catchup": allowed}).catchup.spark_conf == {"spark.executor.memory": "4g"}


def test_a_fixed_spark_setting_with_its_required_value_passes_the_spec_check_and_the_job() -> None:
    """Review of issue 38, finding 4. Before: sparkConf spark.task.maxFailures "1" (the value the job runs with)
    was refused by the spec check (stopping the reconcile of a CR that passed before) and by --spark-conf."""
    base = {
        "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
        "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle"},
    }
    required = {
        " spark.task.maxFailures ": " 1 ",
        "spark.speculation": "False",
        "spark.stage.maxConsecutiveAttempts": "1",
    }
    spec = parse_spec({**base, "catchup": {"enabled": True, "image": "reg/spark:1", "sparkConf": required}})
    config = CatchupConfig(
        bootstrap_servers="k:9092",
        topics=["t"],
        group_id="g",
        handler="m:f",
        spark_conf=[f"{name}={value}" for name, value in spec.catchup.spark_conf.items()],
    )
    assert config.spark_settings()["spark.task.maxFailures"] == "1"
    with pytest.raises(ValueError, match=r"spark.speculation=true: fixed by keyorder catchup"):
        CatchupConfig(
            bootstrap_servers="k:9092",
            topics=["t"],
            group_id="g",
            handler="m:f",
            spark_conf=["spark.speculation= true"],
        )


@pytest.mark.parametrize(
    ("catchup", "rule"),
    [
        ({"master": "local[4,3]"}, "local[n,f] with f above 1"),
        ({"master": "spark://m:7077"}, "needs the secret its master and workers share"),
        ({"master": "spark://m:7077", "sparkConf": {"spark.authenticate": " true"}}, "needs the secret"),
    ],
)
def test_what_the_job_refuses_at_start_is_refused_by_the_spec_check(catchup, rule) -> None:
    """Review of issue 38, finding 3. Before: these passed admission, and keyorder catchup refused them with
    exit 2 after the pods were stopped (session_problems; security_settings)."""
    base = {
        "kafka": {"bootstrapServers": "kafka:9092", "topics": ["orders"], "groupId": "g"},
        "handler": {"image": "reg/orders:1", "handler": "orders.handler:handle"},
    }
    with pytest.raises(InvalidSpec) as refused:
        parse_spec({**base, "catchup": {"enabled": True, "image": "reg/spark:1", **catchup}})
    (path, message), *_ = refused.value.problems
    assert path == "spec.catchup" and rule in message, message
    # what the job itself says of the same settings (the spec check must not refuse more than it does)
    master, conf = catchup["master"], catchup.get("sparkConf", {})
    assert master_attempts_problem(master) or cluster_secret_missing(master, conf)


@pytest.mark.parametrize(
    ("value", "seconds"), [("10s", 10.0), ("500ms", 0.5), ("2m", 120.0), ("3min", 180.0), ("1500", 1.5), ("x", None)]
)
def test_spark_time_settings_read_as_spark_reads_them(value, seconds) -> None:
    assert spark_seconds(value) == seconds


def test_executors_that_are_not_pods_get_a_drain_window_from_their_heartbeat_settings() -> None:
    """Before: on a standalone or YARN master the pods resumed as soon as the driver pod was gone, while an
    executor cut off from the driver could still handle its task."""
    assert executor_drain_seconds({}) == 2 * 60 * 10.0  # Spark's defaults: 60 beats, 10 s apart, twice over
    short = {"spark.executor.heartbeatInterval": "2s", "spark.executor.heartbeat.maxFailures": "5"}
    assert executor_drain_seconds(short) == 20.0
    for master in ("local[4]", "local[*]", "k8s://https://kubernetes.default.svc"):
        assert unobserved_drain_seconds(master, short) == 0.0  # their executors are pods the operator counts
    for master in ("spark://spark-master:7077", "yarn"):
        assert unobserved_drain_seconds(master, short) == 20.0


def test_the_pods_wait_for_the_drain_window_after_the_job_ended() -> None:
    run = CatchupRun(Phase.RUNNING, "o-catchup-1", {"t:0": 5}, 100.0, 2).running(drain_seconds=20.0)
    assert unobserved_executors_left(run, now=500.0) is None  # not seen ended yet: the Job's state decides
    ended = run.job_ended(now=1000.0)
    assert ended.job_ended_at == 1000.0 and ended.job_ended(now=1010.0).job_ended_at == 1000.0
    waiting = unobserved_executors_left(ended, now=1019.0)
    assert waiting is not None and "not pods the operator can see" in waiting and "o-catchup-1" in waiting
    assert unobserved_executors_left(ended, now=1020.0) is None
    restored = CatchupRun.from_status({"catchup": ended.to_status()})  # survives an operator restart
    assert restored == ended
    on_kubernetes = CatchupRun(Phase.RUNNING, "j", {}, 100.0, 2).running(drain_seconds=0.0).job_ended(1000.0)
    assert unobserved_executors_left(on_kubernetes, now=1000.0) is None
