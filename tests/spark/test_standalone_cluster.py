"""``keyorder catchup`` through ``spark-submit`` on a real standalone cluster: a master and two workers
in their own JVMs, executors with their own Python workers, all on loopback (``standalone``).

The handler is not importable on the cluster: it is shipped the documented way (docs/catchup.md,
"Standalone"), ``--py-files handler.zip``, with its environment in ``spark.executorEnv.*`` and
keyorder on the interpreter named by ``spark.pyspark.python``. The Kafka configuration reaches
the executors' readers from a properties file on the driver. The test checks what a real cluster
does to all of this: two executor JVMs ran the handler, every key in order, every message once,
waves committed and the fence committed for the group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid
import zipfile
from pathlib import Path

import pytest

import keyorder.catchup.__main__ as catchup_main
from keyorder.devtools.loadgen import create_topics, produce_keyed
from tests.conftest import group_committed
from tests.guarantees import assert_key_order
from tests.spark.standalone import SPARK_HOME, StandaloneCluster, spark_env
from tests.support import EXACT_END_OFFSETS

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
    with StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=2, cores=1, memory="1g") as running:
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
        "--key-partitions",
        "4",
        "--report",
        str(report),
    ]
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
