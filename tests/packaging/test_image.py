"""The images, built from the project's Dockerfile with buildah and run, as a cluster would run them.

``tools.image`` builds the ``runtime`` and ``catchup`` targets on a local Debian-packaged stand-in for
``python:3.11-slim`` (no image registry is reachable here; the base and the Dockerfile's layers are
cached in buildah's store, so only a machine's first run pays for them). Then, as UID 65532 and on the
host network (chroot isolation), against the embedded broker:

* the runtime image's ``keyorder run`` processes a topic (the group commits every offset) and answers
  ``/metrics``;
* the catchup image's ``keyorder catchup`` drains a topic on Spark ``local[2]`` and commits the fence;
* the catchup image's entrypoint runs under tini, which passes SIGTERM on to the driver: it stops in its
  second wave, commits nothing more and exits 143.

Skipped, with the reason, only outside CI where buildah cannot run (not root, or not installed: ``make
test`` installs it as root). In CI (``CI=true``, which ``.ci/run`` sets) it never skips: a runner that
cannot build the images fails here instead of silently losing their coverage.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import pytest
from confluent_kafka import Consumer, TopicPartition

from keyorder.devtools.embedded import FAST_GROUP_JOIN, free_port
from keyorder.devtools.loadgen import create_topics, produce_keyed
from tests.support import wait_for
from tools import image

pytestmark = [pytest.mark.slow, pytest.mark.broker, pytest.mark.timeout(1200)]
USER = "65532:65532"
HANDLER = "keyorder_example.ledger:handle"


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    reason = image.unavailable()
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must build the images (run it as root; make test installs buildah): {reason}")
        pytest.skip(reason)
    started = time.monotonic()
    tags = {target: image.build(target) for target in image.TARGETS}
    print(f"images built in {time.monotonic() - started:.0f} s: {tags}")
    image.prune_if_large()
    return tags


@contextmanager
def container(tag: str) -> Iterator[str]:
    name = subprocess.run(
        ["buildah", "from", tag], env=image.ENV, capture_output=True, text=True, check=True
    ).stdout.strip()
    try:
        yield name
    finally:
        subprocess.run(["buildah", "rm", name], env=image.ENV, capture_output=True, check=False)


def run_in(name: str, *command: str) -> list[str]:
    return ["buildah", "run", "--user", USER, name, "--", *command]


def descendants(pid: int) -> list[int]:
    """The processes started under ``pid`` (buildah's chroot helper and the command it runs)."""
    children: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            children += [int(entry), *descendants(int(entry))]
    return children


def committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in offsets}


def run_preflight(container_name: str) -> subprocess.CompletedProcess:
    """``keyorder catchup --preflight`` in a running container, as the operator's image check runs it."""
    return subprocess.run(
        run_in(container_name, "keyorder", "catchup", "--preflight", "--handler", HANDLER),
        env=image.ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_runtime_image_runs_keyorder_as_65532_and_processes_a_topic(images, broker, tmp_path):
    topic, group, port = "image-run", "image-run", free_port()
    create_topics(broker.bootstrap, [topic, f"{topic}.dlq"], 2)
    produced = produce_keyed(broker.bootstrap, topic, 400, 40, extra_config={"batch.num.messages": 1})
    with container(images["runtime"]) as name:
        identity = subprocess.run(run_in(name, "id", "-u"), env=image.ENV, capture_output=True, text=True, check=True)
        assert identity.stdout.strip() == "65532"
        # the handler image is no catch-up image: its pre-flight fails, naming what is missing (exit 2)
        preflight = run_preflight(name)
        assert preflight.returncode == 2, preflight.stdout[-3000:] + preflight.stderr[-3000:]
        assert "FAIL java" in preflight.stdout and "FAIL pyspark" in preflight.stdout, preflight.stdout
        command = run_in(
            name,
            "keyorder",
            "run",
            "--handler",
            HANDLER,
            "--topics",
            topic,
            "--group-id",
            group,
            "--bootstrap-servers",
            broker.bootstrap,
            "--http-port",
            str(port),
            "--workers",
            "8",
            *(argument for setting in FAST_GROUP_JOIN for argument in ("--kafka-property", setting)),
        )
        log = tmp_path / "pod.log"
        with log.open("w") as output:  # a file, not a pipe: nobody reads a pipe while the pod runs
            pod = subprocess.Popen(command, env=image.ENV, stdout=output, stderr=subprocess.STDOUT)
        inside: list[int] = []
        try:

            def all_committed() -> bool:
                assert pod.poll() is None, f"keyorder run exited {pod.returncode}: {log.read_text()[-3000:]}"
                return committed(broker.bootstrap, group, topic, 2) == produced.end_offsets

            wait_for(all_committed, 90, "every message committed", interval=0.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
                metrics = response.read().decode()
            processed = sum(
                float(line.rsplit(" ", 1)[1])
                for line in metrics.splitlines()
                if line.startswith(("keyorder_messages_processed_total ", "keyorder_messages_processed_total{"))
            )
            assert processed >= produced.total, metrics
        finally:
            inside = descendants(pod.pid)
            pod.terminate()
            try:
                pod.wait(30)
            except subprocess.TimeoutExpired:
                pod.kill()
                pod.wait(10)
            for pid in inside:  # anything buildah left running, by PID
                with suppress(ProcessLookupError):
                    os.kill(pid, 9)


def test_the_catchup_image_drains_a_topic_on_local_spark(images, broker):
    topic, group = "image-catchup", "image-catchup"
    create_topics(broker.bootstrap, [topic, f"{topic}.dlq"], 2)
    produced = produce_keyed(broker.bootstrap, topic, 300, 30, extra_config={"batch.num.messages": 1})
    with container(images["catchup"]) as name:
        # the pre-flight the operator runs before it stops the pods passes in the catch-up image
        preflight = run_preflight(name)
        assert preflight.returncode == 0, preflight.stdout[-3000:] + preflight.stderr[-3000:]
        assert [line.split()[0] for line in preflight.stdout.splitlines()] == ["ok"] * 4, preflight.stdout
        done = subprocess.run(
            run_in(
                name,
                # buildah names the container's host after it and nothing resolves that name (a pod's does):
                # Spark binds its driver to loopback instead.
                "env",
                "SPARK_LOCAL_IP=127.0.0.1",
                "keyorder",
                "catchup",
                "--handler",
                HANDLER,
                "--topics",
                topic,
                "--group-id",
                group,
                "--bootstrap-servers",
                broker.bootstrap,
                "--master",
                "local[2]",
                "--key-partitions",
                "2",
            ),
            env=image.ENV,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert committed(broker.bootstrap, group, topic, 2) == produced.end_offsets


def test_the_catchup_image_runs_under_tini_and_its_driver_stops_on_sigterm(images, broker, tmp_path):
    topic, group = "image-catchup-stop", "image-catchup-stop"
    create_topics(broker.bootstrap, [topic, f"{topic}.dlq"], 2)
    produced = produce_keyed(broker.bootstrap, topic, 400, 20, extra_config={"batch.num.messages": 1})
    inspected = subprocess.run(
        ["buildah", "inspect", "--type", "image", images["catchup"]],
        env=image.ENV,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(inspected.stdout)["OCIv1"]["config"]["Entrypoint"] == ["tini", "--", "keyorder-spark-entrypoint"]
    with container(images["catchup"]) as name:
        command = run_in(
            name,
            "env",
            "SPARK_LOCAL_IP=127.0.0.1",
            "KEYORDER_EXAMPLE_LATENCY_MS=200",  # a slow handler: 4 threads, about 20 messages a second
            "tini",  # buildah run does not use the ENTRYPOINT: the same command, as a pod would run it
            "--",
            "keyorder-spark-entrypoint",
            "catchup",
            "--handler",
            HANDLER,
            "--topics",
            topic,
            "--group-id",
            group,
            "--bootstrap-servers",
            broker.bootstrap,
            "--master",
            "local[2]",
            "--key-partitions",
            "2",
            "--task-workers",
            "2",
            "--wave-offsets",
            "50",
        )
        log = tmp_path / "driver.log"
        with log.open("w") as output:
            driver = subprocess.Popen(command, env=image.ENV, stdout=output, stderr=subprocess.STDOUT)
        try:

            def first_wave_committed() -> bool:
                assert driver.poll() is None, f"keyorder catchup exited {driver.returncode}: {log.read_text()[-3000:]}"
                return any(offset > 0 for offset in committed(broker.bootstrap, group, topic, 2).values())

            wait_for(first_wave_committed, 300, "the first wave committed", interval=0.5)
            (tini,) = [pid for pid in descendants(driver.pid) if _command(pid)[:1] == ["tini"]]
            os.kill(tini, signal.SIGTERM)  # what the kubelet does to a container's PID 1
            status = driver.wait(timeout=120)  # hang guard
        finally:
            if driver.poll() is None:
                inside = descendants(driver.pid)
                driver.kill()
                driver.wait(10)
                for pid in inside:  # anything buildah left running, by PID
                    with suppress(ProcessLookupError):
                        os.kill(pid, 9)
    output = log.read_text()
    assert status == 143, output[-3000:]  # tini exits with its child's status: 128 + SIGTERM
    assert "stopped by SIGTERM" in output, output[-3000:]
    done = committed(broker.bootstrap, group, topic, 2)  # stopped in a later wave: that one and the rest not committed
    assert all(0 < done[partition] < end for partition, end in produced.end_offsets.items()), (done, produced)


def _command(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return [
                os.path.basename(word.decode()) if i == 0 else word.decode()
                for i, word in enumerate(cmdline.read().split(b"\0"))
                if word
            ]
    except OSError:
        return []
