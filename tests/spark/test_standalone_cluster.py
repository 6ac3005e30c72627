"""``keyorder catchup`` through ``spark-submit`` on a real standalone cluster: a master and two workers
in their own JVMs, executors with their own Python workers, all on loopback (``standalone``).

The handler is not importable on the cluster: it is shipped the documented way (docs/catchup.md,
"Standalone"), ``--py-files handler.zip``, with its environment in ``spark.executorEnv.*`` and
keyorder on the interpreter named by ``spark.pyspark.python``. The Kafka configuration reaches
the executors' readers from a properties file on the driver. The test checks what a real cluster
does to all of this: two executor JVMs ran the handler, every key in order, every message once,
waves committed and the fence committed for the group. The cluster requires Spark authentication
(``standalone``): the driver gives the cluster's secret, and everything runs with the job's security
settings on (authentication, network and I/O encryption).

The second test runs ``keyorder catchup`` as the catch-up image does (the driver in-process,
``--master spark://...``) and sends it SIGTERM in its second wave (issue 27, defect 3). The third
runs it the same way with a handler that kills its Python worker once: the failed wave is run
again (issue 27, defect 7).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
import zipfile
from pathlib import Path

import pytest

import keyorder.catchup.__main__ as catchup_main
from keyorder.devtools.loadgen import create_topics, produce_keyed
from tests.conftest import group_committed
from tests.guarantees import assert_key_order
from tests.spark.handlers import read_records
from tests.spark.standalone import SPARK_HOME, StandaloneCluster, spark_env
from tests.support import EXACT_END_OFFSETS, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(480)]

HANDLER = textwrap.dedent(
    '''
    """Shipped to the executors in a zip: records key, seq, partition, offset and the executor JVM."""
    import json
    import os


    def _executor_jvm():
        pid = os.getpid()
        for _ in range(10):  # Python worker -> daemon -> executor JVM
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                if b"CoarseGrainedExecutorBackend" in cmdline.read():
                    return pid
        return -1


    EXECUTOR = _executor_jvm()


    def record(message):
        event = json.loads(message.value)
        line = f"{event['key']} {event['seq']} {message.partition} {message.offset} {EXECUTOR}\\n"
        path = os.path.join(os.environ["SHIPPED_HANDLER_RECORD_DIR"], f"{message.topic}.txt")
        descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)
    '''
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    with StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=2, cores=2, memory="1g") as running:
        yield running


def test_spark_submit_on_a_standalone_cluster_ships_the_handler_and_commits_the_fence(
    broker, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    name = f"sa-{uuid.uuid4().hex[:8]}"
    create_topics(broker.bootstrap, [name, f"{name}.dlq"], 4)
    produced = produce_keyed(broker.bootstrap, name, 2_000, 100, extra_config=EXACT_END_OFFSETS)
    package = tmp_path / "handler.zip"
    with zipfile.ZipFile(package, "w") as archive:
        archive.writestr("shipped_handler.py", HANDLER)
    records = tmp_path / "records"
    records.mkdir()
    properties = tmp_path / "kafka.properties"
    properties.write_text(f"bootstrap.servers={broker.bootstrap}\n")
    group = f"g-{name}"
    report = tmp_path / "report.json"
    command = [
        str(SPARK_HOME / "bin" / "spark-submit"),
        "--master",
        cluster.master_url,
        "--py-files",
        str(package),
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        f"spark.executorEnv.SHIPPED_HANDLER_RECORD_DIR={records}",
        "--conf",
        "spark.executor.memory=768m",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        f"spark.authenticate.secret={cluster.secret}",
        catchup_main.__file__,
        "--kafka-properties-file",
        str(properties),
        "--topics",
        name,
        "--group-id",
        group,
        "--handler",
        "shipped_handler:record",
        "--wave-offsets",
        "300",
        "--report",
        str(report),
    ]  # no --key-partitions: one per core of the executors, once they registered (issue 27, defect 5)
    env = spark_env({"PYSPARK_DRIVER_PYTHON": sys.executable, "PYSPARK_PYTHON": sys.executable})
    result = subprocess.run(command, capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]

    lines = [line.split() for line in (records / f"{name}.txt").read_text().splitlines()]
    assert len(lines) == 2_000  # every message once
    assert_key_order((key, int(seq)) for key, seq, *_ in lines)
    executors = {int(jvm) for *_, jvm in lines}
    assert len(executors) == 2 and -1 not in executors  # two executor JVMs handled messages
    assert os.getpid() not in executors
    assert group_committed(broker.bootstrap, group, name, 4) == produced.end_offsets  # the fence
    summary = json.loads(report.read_text())
    assert summary["ok"] and summary["committed"] and summary["processed"] == 2_000
    assert summary["waves_planned"] == summary["waves_committed"] >= 2
    # 2 workers x 2 cores: the old default (defaultParallelism when the plan was printed, before the
    # executors registered) cut 2 key partitions
    assert summary["key_partitions"] == 2 * cluster.cores, summary["key_partitions_reason"]
    assert "registered" in summary["key_partitions_reason"]


REPO = Path(__file__).resolve().parents[2]


def driver_command(
    cluster: StandaloneCluster,
    bootstrap: str,
    topic: str,
    handler: str,
    records: Path,
    report: Path,
    options: list[str],
    spark_conf: dict[str, str] | None = None,
) -> list[str]:
    """``keyorder catchup`` as a client-mode driver on ``cluster``, for group ``g-<topic>``, with a handler of
    ``tests.spark.handlers`` recording into ``records``."""
    settings = {
        "spark.pyspark.python": sys.executable,
        "spark.driver.host": "127.0.0.1",
        "spark.authenticate.secret": cluster.secret,
        "spark.executor.memory": "768m",
        "spark.executorEnv.PYTHONPATH": str(REPO),  # the handler: tests.spark.handlers
        "spark.executorEnv.KEYORDER_TEST_RECORD_DIR": str(records),
        **(spark_conf or {}),
    }
    return [
        sys.executable,
        "-m",
        "keyorder.catchup",
        "--master",
        cluster.master_url,
        "--bootstrap-servers",
        bootstrap,
        "--topics",
        topic,
        "--group-id",
        f"g-{topic}",
        "--handler",
        f"tests.spark.handlers:{handler}",
        "--report",
        str(report),
        *options,
        *(argument for setting in settings.items() for argument in ("--spark-conf", "=".join(setting))),
    ]


def executor_processes(app_id: str) -> list[int]:
    """PIDs of executor JVMs (in the workers) that run for ``app_id``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                    words = cmdline.read().split(b"\0")
            except OSError:
                continue
            if any(b"ExecutorBackend" in word for word in words) and app_id.encode() in words:
                found.append(int(entry))
    return found


def test_sigterm_cancels_the_running_wave_stops_the_executors_and_writes_the_report(
    broker, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """SIGTERM to the driver in its second wave: it stops handling (the wave's Spark job is cancelled), does
    not commit that wave, stops Spark (the cluster's executors for the app end), writes the report and exits
    143. Before the fix, the signal's default action killed the driver (as PID 1 in a container it was
    ignored instead, and the job ran to its end): no report, status -15."""
    name = f"sa-stop-{uuid.uuid4().hex[:8]}"
    partitions, messages, wave_offsets, delay = 4, 1_200, 50, 0.3
    create_topics(broker.bootstrap, [name, f"{name}.dlq"], partitions)
    produced = produce_keyed(broker.bootstrap, name, messages, 40, extra_config=EXACT_END_OFFSETS)
    assert produced.total == messages
    records = tmp_path / "records"
    records.mkdir()
    group = f"g-{name}"
    report = tmp_path / "report.json"
    command = driver_command(
        cluster,
        broker.bootstrap,
        name,
        "slow_record",
        records,
        report,
        ["--wave-offsets", str(wave_offsets), "--key-partitions", "2", "--task-workers", "2"],
        {"spark.executorEnv.KEYORDER_TEST_HANDLER_SECONDS": str(delay)},
    )
    env = spark_env({"PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable})
    log = tmp_path / "driver.log"
    with log.open("w") as output:  # a file, not a pipe: nobody reads a pipe while the driver runs
        driver = subprocess.Popen(
            command, stdout=output, stderr=subprocess.STDOUT, env=env, cwd=tmp_path, start_new_session=True
        )
    first_wave = partitions * wave_offsets
    try:

        def second_wave_running() -> bool:
            assert driver.poll() is None, f"the driver exited {driver.returncode}: {log.read_text()[-4000:]}"
            committed = group_committed(broker.bootstrap, group, name, partitions)
            return any(committed.values()) and len(read_records(str(records), name)) > first_wave + 10

        wait_for(second_wave_running, 300, "the second wave running, the first one committed", interval=0.2)
        handled_at_signal = len(read_records(str(records), name))
        driver.send_signal(signal.SIGTERM)  # to the driver alone, as tini passes it on to its child
        started = time.monotonic()
        status = driver.wait(timeout=120)  # hang guard
        print(f"the driver exited {time.monotonic() - started:.1f} s after SIGTERM")
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait(timeout=10)
    output = log.read_text()
    assert status == 143, output[-4000:]  # 128 + SIGTERM, as documented
    assert "stopped by SIGTERM" in output

    # The executors are gone: the master lists the app as completed, and no executor JVM runs for it.
    app_name = f"keyorder-catchup-{group}"
    wait_for(
        lambda: not [app for app in cluster.state()["activeapps"] if app["name"] == app_name],
        30,
        "the application no longer active on the master",
        interval=0.5,
    )
    (app,) = [app for app in cluster.state()["completedapps"] if app["name"] == app_name]
    wait_for(lambda: not executor_processes(app["id"]), 30, "no executor JVM left for the app", interval=0.5)

    # It stopped handling at once: what ran after the signal is a small part of what remained, and nothing
    # runs any more. Every key's messages ran in order, each once.
    handled = read_records(str(records), name)
    time.sleep(2)
    assert len(read_records(str(records), name)) == len(handled)
    remaining = messages - handled_at_signal
    after_signal = len(handled) - handled_at_signal
    print(f"handled {handled_at_signal} before SIGTERM, {after_signal} after it, of {remaining} remaining")
    assert after_signal < remaining // 5, (after_signal, remaining)
    assert_key_order((key, seq) for key, seq, *_ in handled)

    # The report says it was stopped, and which waves stay committed; the interrupted wave is not committed.
    summary = json.loads(report.read_text())
    assert summary["ok"] is False and summary["committed"] is False
    assert summary["stopped"] == "stopped by SIGTERM"
    assert summary["error"].startswith("stopped by SIGTERM during wave"), summary["error"]
    committed_waves = [wave for wave in summary["waves"] if wave["committed"]]
    interrupted = summary["waves"][-1]
    assert committed_waves and not interrupted["committed"] and interrupted["error"]
    assert summary["waves_committed"] == len(committed_waves) < summary["waves_planned"]
    last = committed_waves[-1]["ranges"]
    assert group_committed(broker.bootstrap, group, name, partitions) == {
        partition: last[f"{name}:{partition}"][1] for partition in range(partitions)
    }
    # and no wave after the interrupted one started
    assert all(offset < interrupted["ranges"][f"{name}:{partition}"][1] for _, _, partition, offset, _ in handled)


def test_a_wave_failed_by_a_crashed_python_worker_is_run_again_on_the_cluster(
    broker, cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """An executor's Python worker dies mid-wave (once, as after an OOM kill): with spark.task.maxFailures=1
    the wave's Spark job fails, the driver runs that wave again (only that one) after --wave-retry-pause,
    every key is handled in order (first processings by sequence number), the fence is committed and the
    command exits 0 (issue 27, defect 7). Before, the failed wave ended the job (exit 1)."""
    from confluent_kafka import Producer

    from tests.guarantees import assert_at_least_once, assert_first_processing_in_order

    name = f"sa-retry-{uuid.uuid4().hex[:8]}"
    partitions, keys, messages = 2, 10, 400
    create_topics(broker.bootstrap, [name, f"{name}.dlq"], partitions)
    producer = Producer({"bootstrap.servers": broker.bootstrap, **EXACT_END_OFFSETS})
    for index in range(messages):
        event = {"key": f"k{index % keys}", "seq": index // keys, **({"crash_once": True} if index == 250 else {})}
        producer.produce(name, key=event["key"].encode(), value=json.dumps(event).encode())
    assert producer.flush(30) == 0
    records = tmp_path / "records"
    records.mkdir()
    group = f"g-{name}"
    report = tmp_path / "report.json"
    command = driver_command(
        cluster,
        broker.bootstrap,
        name,
        "record",
        records,
        report,
        # by-partition: a task reads its partition and handles it as it reads (Python workers side by side),
        # so the crash takes the reading task down too, and the retry reads again
        ["--wave-offsets", "50", "--wave-retry-pause", "0.5", "--key-partitions", "2", "--layout", "by-partition"],
    )
    env = spark_env({"PYTHONPATH": str(REPO), "PYSPARK_PYTHON": sys.executable})
    result = subprocess.run(command, capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]

    assert (records / f"{name}.crashed").exists()  # the fault happened
    summary = json.loads(report.read_text())
    assert summary["ok"] and summary["committed"] and summary["processed"] == messages
    retried = [wave for wave in summary["waves"] if wave["attempts"] > 1]
    assert len(retried) == 1 and retried[0]["attempts"] == 2 and summary["wave_retries"] == 1
    assert "Python worker exited unexpectedly" in retried[0]["failed_attempts"][0]["error"]
    assert summary["waves_committed"] == summary["waves_planned"]
    assert {wave["layout"]["layout"] for wave in summary["waves"]} == {"by-partition"}
    assert "waves run again after a failure" in result.stderr
    handled = [(key, seq) for key, seq, *_ in read_records(str(records), name)]
    assert_at_least_once(handled, {f"k{key}": messages // keys for key in range(keys)})
    assert_first_processing_in_order(handled)
    assert len(handled) - messages <= sum(end - start for start, end in retried[0]["ranges"].values())
    assert sum(group_committed(broker.bootstrap, group, name, partitions).values()) == messages  # the fence
