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

from keyorder.catchup.command import refusal_of, refuse
from keyorder.catchup.exits import EXIT_CONFIG, EXIT_PASSING, RUNTIME, Refusal, RefusalKind
from keyorder.catchup.plan import PartitionSnapshot, PassingPlanError, refuse_live_group, resolve_ranges
from keyorder.catchup.positions import parse_position
from keyorder_operator.catchup import (
    RETRY_FIRST_SECONDS,
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
    refuse_live_group(None, commit=True, group="g")  # the broker could not say (a coordinator move)


def killed_pod_still_a_member() -> None:
    refuse_live_group(1, commit=True, group="g")  # a pod killed after its grace, a member until its session ends


def partition_added_after_the_fence() -> None:
    snapshots = {("t", p): PartitionSnapshot(earliest=0, end=100, committed=10) for p in range(3)}
    fence = parse_position("t:0=50,t:1=60", "--until")  # recorded while the topic had 2 partitions
    resolve_ranges(snapshots, parse_position("committed", "--start"), fence)


TRIGGERS = {
    "describe-groups failed": describe_groups_failed,
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
