"""``keyorder catchup`` on real Spark (local[2], one session for the module) against the real broker.

The session runs with the security settings the job starts its own with (``SPARK_SECURITY_DEFAULTS``:
authentication, network and I/O encryption on, no UI), so every test here runs with them.

Order is checked with per-key sequence numbers carried in the messages and recorded by the
handler in Spark's Python workers; committed offsets are read back from the broker.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from keyorder.catchup.job import CatchupJob, SparkSettingsError, stop_spark
from keyorder.catchup.plan import PlanError
from keyorder.catchup.settings import SPARK_SECURITY_DEFAULTS, CatchupConfig
from keyorder.cli import main
from keyorder.core.retry import ExhaustedPolicy
from keyorder.devtools.embedded import EmbeddedBroker
from keyorder.devtools.loadgen import create_topics, produce_keyed
from tests.conftest import group_committed
from tests.guarantees import assert_at_least_once, assert_first_processing_in_order, assert_key_order
from tests.spark.handlers import read_records
from tests.support import EXACT_END_OFFSETS

pytestmark = [pytest.mark.broker, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def record_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("catchup-records")


@pytest.fixture(scope="module")
def spark(record_dir: Path) -> Iterator[object]:
    pyspark_sql = pytest.importorskip("pyspark.sql")
    # The Python workers inherit this environment when the session starts (not later).
    os.environ["KEYORDER_TEST_RECORD_DIR"] = str(record_dir)
    os.environ["PYSPARK_PYTHON"] = sys.executable  # workers import keyorder from this venv
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    builder = pyspark_sql.SparkSession.builder.master("local[2]").appName("keyorder-catchup-tests")
    for name, value in SPARK_SECURITY_DEFAULTS.items():
        builder = builder.config(name, value)
    session = (
        builder.config("spark.ui.showConsoleProgress", "false")
        .config("spark.stage.maxConsecutiveAttempts", "1")  # the job refuses a session without it
        .getOrCreate()
    )
    conf = session.sparkContext.getConf()
    assert conf.get("spark.authenticate") == "true" and conf.get("spark.network.crypto.enabled") == "true"
    session.sparkContext.setLogLevel("ERROR")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    yield session
    stop_spark(session)


def topic(broker: EmbeddedBroker, partitions: int = 4) -> str:
    name = f"c-{uuid.uuid4().hex[:10]}"
    create_topics(broker.bootstrap, [name, f"{name}.dlq"], partitions)
    return name


def config(broker: EmbeddedBroker, name: str, group: str, **settings: object) -> CatchupConfig:
    return CatchupConfig(
        bootstrap_servers=broker.bootstrap,
        topics=[name],
        group_id=group,
        handler="tests.spark.handlers:record",
        **settings,
    )


def run(spark: object, settings: CatchupConfig):
    job = CatchupJob(settings, spark=spark)
    try:
        return job, job.run(job.plan())
    finally:
        job.close()


def produce_events(broker: EmbeddedBroker, name: str, events: list[dict]) -> None:
    producer = Producer({"bootstrap.servers": broker.bootstrap, **EXACT_END_OFFSETS})
    for event in events:
        producer.produce(name, key=event["key"].encode(), value=json.dumps(event).encode())
    assert producer.flush(30) == 0


def test_drains_40k_messages_in_key_order_and_commits_the_fence(broker, spark, record_dir) -> None:
    name = topic(broker)
    produced = produce_keyed(broker.bootstrap, name, 40_000, 10_000, extra_config=EXACT_END_OFFSETS)
    group = f"g-{name}"
    _, outcome = run(spark, config(broker, name, group, split_offsets=4_000, key_partitions=8))

    assert outcome.ok, (outcome.error, outcome.audit and outcome.audit.problems)
    assert [r.offsets for r in outcome.plan.ranges] == [produced.end_offsets[p] for p in range(4)]
    assert len(outcome.plan.splits) == 12  # ~10k offsets per partition in 4k splits: read in parallel
    records = read_records(str(record_dir), name)
    assert_key_order((key, seq) for key, seq, *_ in records)  # exactly once, in order, per key
    assert len(records) == 40_000
    report = outcome.report()
    assert (report["processed"], report["violations"], report["dead_lettered"]) == (40_000, 0, 0)
    assert outcome.committed
    threads = report["waves"][0]["task_threads"]  # each task says how many threads it ran at once
    assert 1 <= threads["min"] <= threads["max"] <= 16
    assert group_committed(broker.bootstrap, group, name, 4) == produced.end_offsets

    # An incremental run starts from the committed fence and handles only what arrived since.
    more = produce_keyed(
        broker.bootstrap,
        name,
        3_000,
        10_000,
        seed=8,
        start_sequences=produced.sequences,
        extra_config=EXACT_END_OFFSETS,
    )
    _, second = run(spark, config(broker, name, group))
    assert second.ok and second.committed
    assert second.report()["processed"] == 3_000
    records = read_records(str(record_dir), name)
    assert len(records) == 43_000
    assert_key_order((key, seq) for key, seq, *_ in records)
    assert group_committed(broker.bootstrap, group, name, 4) == more.end_offsets


@pytest.mark.parametrize(("layout", "expected"), [("auto", "by-partition"), ("shuffle", "shuffle")])
def test_both_layouts_handle_every_key_once_in_order(broker, spark, record_dir, capsys, layout, expected) -> None:
    """4 even partitions on local[2]'s 2 key partitions: auto lets each task read 2 whole partitions and
    handle them as it reads (several splits each, one after another); shuffle reads first, then moves keys."""
    name = topic(broker)
    produced = produce_keyed(broker.bootstrap, name, 12_000, 2_000, extra_config=EXACT_END_OFFSETS)
    group = f"g-{name}"
    job = CatchupJob(config(broker, name, group, split_offsets=1_000, layout=layout), spark=spark)
    try:
        outcome = job.run(job.plan())
        live = job.live.total() if job.live is not None else None
    finally:
        job.close()

    assert outcome.ok, (outcome.error, outcome.audit and outcome.audit.problems)
    assert live == 12_000  # the tasks' final reports reached the driver's live count (UDP from Spark's workers)
    wave = outcome.report()["waves"][0]
    assert wave["layout"]["layout"] == expected and wave["layout"]["tasks"] == 2
    records = read_records(str(record_dir), name)
    assert_key_order((key, seq) for key, seq, *_ in records)  # exactly once, in order, per key
    assert len(records) == 12_000
    assert (wave["read"], wave["processed"]) == (12_000, 12_000)
    assert group_committed(broker.bootstrap, group, name, 4) == produced.end_offsets
    assert f"{expected} in 2 tasks" in capsys.readouterr().err  # the wave's line says how it ran


def test_failures_follow_the_pods_retry_and_dead_letter_policy(broker, spark, record_dir) -> None:
    name = topic(broker, partitions=2)
    events = []
    for index in range(300):
        key = f"k{index % 30}"
        event = {"key": key, "seq": index // 30}
        if index == 40:
            event["fail_first"] = 2
        if index == 95:
            event["poison"] = True
        events.append(event)
    produce_events(broker, name, events)
    group = f"g-{name}"
    _, outcome = run(
        spark, config(broker, name, group, max_attempts=3, retry_initial_backoff=0.01, retry_max_backoff=0.02)
    )

    assert outcome.ok, outcome.error
    assert outcome.report()["dead_lettered"] == 1 and outcome.report()["processed"] == 299
    records = read_records(str(record_dir), name)
    poisoned = ("k5", 3)
    assert poisoned not in {(key, seq) for key, seq, *_ in records}
    assert_key_order((key, seq) for key, seq, *_ in records if (key, seq) != poisoned and key != "k5")
    k5 = [seq for key, seq, *_ in records if key == "k5"]
    assert k5 == [0, 1, 2, *range(4, 10)]  # the key went on, in order, after its dead letter
    assert {(key, seq): attempt for key, seq, _, _, attempt in records}[("k10", 1)] == 3  # retried twice

    reader = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"dlq-{name}"})
    reader.assign([TopicPartition(f"{name}.dlq", partition, 0) for partition in range(2)])
    letter = None
    for _ in range(30):
        letter = reader.poll(1.0)
        if letter is not None and letter.error() is None:
            break
    reader.close()
    assert letter is not None and json.loads(letter.value()) == {"key": "k5", "seq": 3, "poison": True}
    headers = dict(letter.headers())
    assert headers["keyorder.attempts"] == b"3"
    assert b"test failure of k5#3 on attempt 3" in headers["keyorder.error"]
    assert outcome.committed


def test_kafka_credentials_reach_the_tasks_outside_their_closures(broker, spark, record_dir, monkeypatch) -> None:
    """The reader's and the dead-letter producer's Kafka properties (here a SASL password) are shipped to the
    executors as a Spark file: no pickled task function and no data source option carries them, and the tasks
    still read and dead-letter with them (issue 37, finding 5). Before, the password was in the pickled
    ``mapInArrow`` function (the producer's properties) and in the reader's options (its properties)."""
    from pyspark.serializers import CloudPickleSerializer
    from pyspark.sql.readwriter import DataFrameReader

    password = f"pw-{uuid.uuid4().hex}"
    pickled: list[bytes] = []
    options: list[tuple[str, str]] = []
    dumps, option = CloudPickleSerializer.dumps, DataFrameReader.option

    def recording_dumps(self, value):
        pickled.append(dumps(self, value))
        return pickled[-1]

    def recording_option(self, key, value):
        options.append((key, str(value)))
        return option(self, key, value)

    monkeypatch.setattr(CloudPickleSerializer, "dumps", recording_dumps)
    monkeypatch.setattr(DataFrameReader, "option", recording_option)
    name = topic(broker, partitions=2)
    produce_events(
        broker, name, [{"key": f"k{i % 5}", "seq": i // 5, **({"poison": True} if i == 7 else {})} for i in range(50)]
    )
    settings = config(
        broker, name, f"g-{name}", max_attempts=1, kafka_property=["sasl.username=catchup", f"sasl.password={password}"]
    )
    _, outcome = run(spark, settings)

    assert outcome.ok, outcome.error
    assert outcome.report()["processed"] == 49 and outcome.report()["dead_lettered"] == 1  # read and dead-lettered
    assert any(b"ApplyHandler" in data for data in pickled)  # the task function was seen being pickled
    assert not [data for data in pickled if password.encode() in data]
    assert options and not [key for key, value in options if password in value]


def test_a_failed_job_commits_nothing_and_a_rerun_is_safe(broker, spark, record_dir) -> None:
    name = topic(broker, partitions=2)
    events = [{"key": f"k{index % 10}", "seq": index // 10} for index in range(200)]
    events[150]["poison"] = True
    produce_events(broker, name, events)
    group = f"g-{name}"
    blocking = config(
        broker, name, group, max_attempts=2, retry_initial_backoff=0.0, retry_max_backoff=0.01, on_exhausted="block"
    )
    _, failed = run(spark, blocking)

    assert not failed.ok and not failed.committed
    assert "on-exhausted is block" in failed.error
    assert group_committed(broker.bootstrap, group, name, 2) == {}
    assert failed.report()["ok"] is False

    _, rerun = run(spark, blocking.model_copy(update={"on_exhausted": ExhaustedPolicy.DLQ}))
    assert rerun.ok and rerun.committed
    records = [(key, seq) for key, seq, *_ in read_records(str(record_dir), name)]
    expected = {f"k{key}": 20 for key in range(10)}
    poisoned = ("k0", 15)
    duplicates = assert_at_least_once([*records, poisoned], expected)  # the poison went to the DLQ instead
    assert duplicates > 0  # the failed run handled part of the range; the rerun handled it again
    assert_first_processing_in_order(record for record in records if record[0] != "k0")
    assert list(dict.fromkeys(seq for key, seq in records if key == "k0")) == [*range(15), *range(16, 20)]


def test_a_replay_leaves_the_live_group_alone_unless_asked(broker, spark, record_dir) -> None:
    name = topic(broker, partitions=2)
    produced = produce_keyed(broker.bootstrap, name, 1_000, 50, extra_config=EXACT_END_OFFSETS)
    group = f"g-{name}"
    live = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    live.commit(offsets=[TopicPartition(name, 0, 10), TopicPartition(name, 1, 20)], asynchronous=False)
    live.close()

    _, replay = run(spark, config(broker, name, group, start="earliest"))
    assert replay.ok and not replay.committed
    assert replay.report()["processed"] == sum(produced.end_offsets.values()) == 1_000, "all of it, from the start"
    assert group_committed(broker.bootstrap, group, name, 2) == {0: 10, 1: 20}

    job = CatchupJob(config(broker, name, group), spark=spark)
    try:
        plan = job.plan()
        mover = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
        mover.commit(offsets=[TopicPartition(name, 0, 15)], asynchronous=False)  # a live pod is still running
        mover.close()
        moved = job.run(plan)
    finally:
        job.close()
    assert not moved.committed
    assert "moved while the job ran" in moved.error
    assert group_committed(broker.bootstrap, group, name, 2) == {0: 15, 1: 20}


def test_the_command_plans_and_rejects_bad_input(broker, spark, capsys) -> None:
    name = topic(broker, partitions=2)
    produce_keyed(broker.bootstrap, name, 500, 20, extra_config=EXACT_END_OFFSETS)
    common = [
        "catchup",
        "--bootstrap-servers",
        broker.bootstrap,
        "--topics",
        name,
        "--group-id",
        f"g-{name}",
        "--handler",
        "tests.spark.handlers:record",
    ]
    assert main([*common, "--plan"]) == 0
    shown = capsys.readouterr().err
    assert "messages 500 over 20 keys" in shown and "hottest keys" in shown
    assert re.search(r"layout: (2 partitions read by 2 tasks|shuffle into 2 key partitions)", shown), shown
    assert spark.sparkContext._jsc is not None  # the command did not stop a session it did not start

    assert main([*common, "--until", "tomorrow"]) == 2
    assert "--until 'tomorrow'" in capsys.readouterr().err
    assert main([*common, "--until", f"{name}:0=5"]) == 3  # passing: the topic may have grown since the offsets
    assert f"no offset given for {name}:1" in capsys.readouterr().err


def test_a_missing_java_runtime_is_named(broker, tmp_path) -> None:
    """Without a JVM Spark cannot start: the command says so instead of printing a py4j traceback."""
    import subprocess

    name = topic(broker, partitions=1)
    env = {**os.environ, "JAVA_HOME": str(tmp_path / "no-java"), "PYSPARK_PYTHON": sys.executable}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "keyorder.catchup",
            "--bootstrap-servers",
            broker.bootstrap,
            "--topics",
            name,
            "--group-id",
            f"g-{name}",
            "--handler",
            "tests.spark.handlers:record",
            "--plan",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env=env,
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "could not start Spark" in result.stderr and "Java 17+" in result.stderr


def test_waves_commit_one_after_another_and_a_failed_wave_keeps_the_earlier_ones(broker, spark, record_dir) -> None:
    name = topic(broker, partitions=2)
    events = [{"key": f"k{index % 10}", "seq": index // 10} for index in range(400)]
    events[330]["poison"] = True  # k0#33, on partition 0 or 1 near the end: in the last wave
    produce_events(broker, name, events)
    group = f"g-{name}"
    blocking = config(
        broker,
        name,
        group,
        wave_offsets=50,
        split_offsets=20,
        max_attempts=1,
        on_exhausted="block",
    )
    _, failed = run(spark, blocking)
    report = failed.report()
    assert not failed.ok and not failed.committed and "on-exhausted is block" in failed.error
    assert report["waves_planned"] == -(-max(group_end(broker, name).values()) // 50)  # windows of at most 50
    assert report["waves_committed"] >= 1
    committed_waves = [wave for wave in report["waves"] if wave["committed"]]
    assert [wave["wave"] for wave in committed_waves] == list(range(len(committed_waves)))
    last_committed = committed_waves[-1]["ranges"]
    by_partition = group_committed(broker.bootstrap, group, name, 2)
    assert by_partition == {int(tp.split(":")[1]): end for tp, (_, end) in last_committed.items()}
    assert report["waves"][-1]["committed"] is False and report["waves"][-1]["error"]
    # the task's typed verdict (apply.TaskFailed) crossed Spark's traceback wrapping: a blocked key is not retried
    assert report["waves"][-1]["attempts"] == 1 and report["waves"][-1]["error"].startswith("KeyBlocked: ")
    assert all(wave["still_running"] == [] for wave in report["waves"])  # every attempt's tasks had ended

    # The rerun starts at the first uncommitted wave: earlier waves are not handled again.
    before = len(read_records(str(record_dir), name))
    _, rerun = run(spark, blocking.model_copy(update={"on_exhausted": ExhaustedPolicy.DLQ}))
    assert rerun.ok and rerun.committed
    records = read_records(str(record_dir), name)
    rehandled = {(key, seq) for key, seq, *_ in records[before:]} & {(key, seq) for key, seq, *_ in records[:before]}
    offsets_after_commit = sum(by_partition.values())
    assert len(rehandled) <= 400 - offsets_after_commit  # only the failed wave's messages, at most
    assert rerun.report()["dead_lettered"] == 1
    dead = [letter for wave in rerun.report()["waves"] for letter in wave["dead_letters"]]
    assert len(dead) == 1 and dead[0]["topic"] == name
    assert_first_processing_in_order(record for record in ((k, s) for k, s, *_ in records) if record[0] != "k0")


class LiveMembers:
    """The job's real Kafka offsets, except that the group's members are counted from a consumer the test
    keeps in the group: the test broker (Tansu) describes a stable group with an empty member list,
    where real Kafka lists its members."""

    def __init__(self, real, members: int) -> None:
        self.real, self.count = real, members

    def members(self) -> int:
        return self.count

    def __getattr__(self, name: str):
        return getattr(self.real, name)


def test_plan_works_on_a_live_group_without_committing_anything(broker, spark) -> None:
    name = topic(broker, partitions=2)
    produce_keyed(broker.bootstrap, name, 200, 20, extra_config=EXACT_END_OFFSETS)
    group = f"g-{name}"
    live = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "enable.auto.commit": False,
        }
    )
    live.subscribe([name])
    job = CatchupJob(config(broker, name, group), spark=spark)
    try:
        for _ in range(80):  # a live pod: a member of the group, with partitions assigned
            live.poll(0.25)
            if live.assignment():
                break
        assert live.assignment()
        job.offsets = LiveMembers(job.offsets, members=1)  # type: ignore[assignment]
        with pytest.raises(PlanError, match="1 active members"):  # a run refuses
            job.plan()
        preview = job.plan(preview=True)  # --plan: the same plan, with the refusal as a note
        assert any(note.startswith("a run would refuse now: group") for note in preview.notes)
        assert job.key_statistics(preview).messages == 200
        assert [r.offsets for r in preview.ranges] == [r.end - r.start for r in preview.ranges]
    finally:
        job.close()
        live.close()
    assert group_committed(broker.bootstrap, group, name, 2) == {}


def test_an_existing_session_without_the_enforced_settings_is_refused(broker, spark) -> None:
    spark_conf = spark.sparkContext.getConf()
    assert spark_conf.get("spark.stage.maxConsecutiveAttempts") == "1"
    name = topic(broker, partitions=1)
    produce_keyed(broker.bootstrap, name, 10, 2, extra_config=EXACT_END_OFFSETS)
    job = CatchupJob(config(broker, name, f"g-{name}"), spark=FakeSession(spark, {"spark.speculation": "true"}))
    try:
        with pytest.raises(SparkSettingsError, match=r"spark.speculation=true \(needs false\)"):
            job.run(job.plan())
    finally:
        job.close()


class FakeSession:
    """The real session seen through a configuration with other values (a session started elsewhere)."""

    def __init__(self, real, overrides: dict[str, str]) -> None:
        self.real = real
        self.overrides = overrides

    @property
    def sparkContext(self):
        outer = self

        class Context:
            master = outer.real.sparkContext.master

            def getConf(self):
                class Conf:
                    def getAll(self):
                        return [*outer.real.sparkContext.getConf().getAll(), *outer.overrides.items()]

                return Conf()

        return Context()


def group_end(broker: EmbeddedBroker, name: str) -> dict[int, int]:
    from confluent_kafka.admin import AdminClient, OffsetSpec

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    futures = admin.list_offsets({TopicPartition(name, p): OffsetSpec.latest() for p in range(2)}, request_timeout=10)
    return {tp.partition: future.result(timeout=10).offset for tp, future in futures.items()}


def test_committed_start_without_a_commit_follows_the_groups_auto_offset_reset(broker, spark, record_dir) -> None:
    """A group that never committed: ``--start committed`` starts where its pods would, by the group's
    ``auto.offset.reset`` (here latest: nothing to handle, the fence is the end), and refuses under error."""
    name = topic(broker, partitions=2)
    produce_events(broker, name, [{"key": f"k{index % 5}", "seq": index // 5} for index in range(40)])
    group = f"g-{name}"
    _, outcome = run(spark, config(broker, name, group, kafka_property=["auto.offset.reset=latest"]))
    assert outcome.ok and outcome.committed, outcome.error
    assert [r.offsets for r in outcome.plan.ranges] == [0, 0]  # a pod would start at the end too
    assert read_records(str(record_dir), name) == []
    assert group_committed(broker.bootstrap, group, name, 2) == group_end(broker, name)

    other = f"g2-{name}"
    job = CatchupJob(config(broker, name, other, kafka_property=["auto.offset.reset=error"]), spark=spark)
    try:
        with pytest.raises(PlanError, match=rf"{name}\[0\]: the group has no committed offset and auto.offset.reset"):
            job.plan()
    finally:
        job.close()
    assert group_committed(broker.bootstrap, other, name, 2) == {}


def test_offsets_the_pods_finished_above_the_committed_one_are_skipped_not_handled_again(
    broker, spark, record_dir
) -> None:
    """The pods commit, with each partition's lowest unfinished offset, the offsets they finished above it
    (commit metadata): a drain skips those, as a pod taking the partition over would, and still proves
    every offset was read. The test broker keeps no commit metadata, so the job's offsets answer with the
    metadata a pod would have written (encoded by the pods' own codec)."""
    from keyorder.core import offset_metadata

    name = topic(broker, partitions=2)
    produce_events(broker, name, [{"key": f"k{index % 8}", "seq": index // 8} for index in range(400)])
    group = f"g-{name}"
    pod = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    pod.commit(offsets=[TopicPartition(name, 0, 10), TopicPartition(name, 1, 20)], asynchronous=False)
    pod.close()
    finished = {0: [11, 12, 13, 30, 31], 1: [21, 25]}  # done by the pods before they stopped

    job = CatchupJob(config(broker, name, group, wave_offsets=60, split_offsets=25), spark=spark)
    real = job.offsets.committed_with_metadata

    def with_metadata(partitions):
        return {
            tp: (offset, offset_metadata.encode(offset, finished[tp[1]]) if offset is not None else None)
            for tp, (offset, _) in real(partitions).items()
        }

    job.offsets.committed_with_metadata = with_metadata  # type: ignore[method-assign]
    try:
        outcome = job.run(job.plan())
    finally:
        job.close()

    assert outcome.ok and outcome.committed, (outcome.error, outcome.audit and outcome.audit.problems)
    report = outcome.report()
    assert report["skipped"] == 7 and report["read"] == report["processed"] == 400 - 30 - 7
    assert {row["partition"]: row["skipped"] for row in report["partitions"]} == {0: 5, 1: 2}
    records = read_records(str(record_dir), name)
    handled = [(partition, offset) for _, _, partition, offset, _ in records]
    assert len(handled) == len(set(handled)) == 363
    assert not {(p, o) for p, offsets in finished.items() for o in offsets} & set(handled)  # never handled again
    ends = group_end(broker, name)
    expected = {(p, o) for p in (0, 1) for o in range((10, 20)[p], ends[p])} - {
        (p, o) for p, offsets in finished.items() for o in offsets
    }
    assert set(handled) == expected  # every other offset from the committed one to the fence: none lost
    sequences: dict[str, list[int]] = {}
    for key, seq, *_ in records:
        sequences.setdefault(key, []).append(seq)
    assert all(seqs == sorted(seqs) for seqs in sequences.values())  # each key in order
    assert group_committed(broker.bootstrap, group, name, 2) == ends
    assert any("finished by the group's consumers" in note for note in outcome.plan.notes)


def test_a_wave_failed_by_a_transient_fault_is_run_again_and_the_fence_committed(broker, spark, record_dir) -> None:
    """A Python worker dies mid-wave (once): the wave's job fails, the job runs that wave again (and only
    that one), every key is handled in order, and the fence is committed."""
    name = topic(broker, partitions=2)
    events = [{"key": f"k{index % 10}", "seq": index // 10} for index in range(400)]
    events[250]["crash_once"] = True  # k0#25, in a middle wave
    produce_events(broker, name, events)
    group = f"g-{name}"
    _, outcome = run(spark, config(broker, name, group, wave_offsets=50, wave_retry_pause=0.2))

    assert (record_dir / f"{name}.crashed").exists()  # the fault happened
    assert outcome.ok and outcome.committed, (outcome.error, outcome.audit and outcome.audit.problems)
    report = outcome.report()
    retried = [wave for wave in report["waves"] if wave["attempts"] > 1]
    assert len(retried) == 1 and retried[0]["attempts"] == 2 and report["wave_retries"] == 1
    (failure,) = retried[0]["failed_attempts"]
    assert failure["attempt"] == 1 and "Python worker exited unexpectedly" in failure["error"], failure
    assert all(wave["attempts"] == 1 for wave in report["waves"] if wave is not retried[0])  # only that wave again
    assert report["processed"] == 400 and report["waves_committed"] == report["waves_planned"]
    records = [(key, seq) for key, seq, *_ in read_records(str(record_dir), name)]
    assert_at_least_once(records, {f"k{key}": 40 for key in range(10)})
    assert_first_processing_in_order(records)  # per key, by sequence number
    rehandled = len(records) - 400
    assert rehandled <= sum(end - start for start, end in retried[0]["ranges"].values())  # that wave's, at most
    assert group_committed(broker.bootstrap, group, name, 2) == group_end(broker, name)


def test_sparks_arrow_batches_to_the_handler_tasks_are_cut_at_the_jobs_byte_bound(spark) -> None:
    """The handler task's memory budget counts one Arrow input batch of ``memory.ARROW_BATCH_BYTES``: Spark
    must cut ``mapInArrow``'s input by ``spark.sql.execution.arrow.maxBytesPerBatch`` (its default cuts only at
    10,000 rows). 2,000 rows of 10 KB in one Spark partition: without the bound they come as one 20 MB batch."""
    from pyspark.sql import functions

    from keyorder.catchup.job import memory_settings
    from keyorder.catchup.memory import ARROW_BATCH_BYTES

    def batch_sizes(batches):
        import pyarrow

        sizes = [(batch.num_rows, batch.nbytes) for batch in batches]
        yield pyarrow.RecordBatch.from_pylist([{"rows": rows, "bytes": size} for rows, size in sizes])

    rows = spark.range(0, 2_000, numPartitions=1).select(
        functions.expr("cast(repeat('x', 10000) as binary)").alias("value")
    )
    ((name, value),) = memory_settings({}).items()
    assert int(value) == ARROW_BATCH_BYTES
    spark.conf.set(name, value)
    try:
        sizes = rows.mapInArrow(batch_sizes, "rows long, bytes long").collect()
    finally:
        spark.conf.unset(name)
    assert sum(row["rows"] for row in sizes) == 2_000
    assert len(sizes) >= 20_000_000 // ARROW_BATCH_BYTES
    assert max(row["bytes"] for row in sizes) <= ARROW_BATCH_BYTES + 10_100  # one row may close a batch
