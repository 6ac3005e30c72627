"""The images, built from the project's Dockerfile with buildah and run, as a cluster would run them.

``tools.image`` builds the ``runtime`` and ``catchup`` targets on a local Debian-packaged stand-in for
``python:3.11-slim`` (no image registry is reachable here; the base and the Dockerfile's layers are
cached in buildah's store, so only a machine's first run pays for them). Then, as UID 65532 and on the
host network (chroot isolation), against the embedded broker:

* the runtime image's ``keyorder run`` processes a topic (the group commits every offset) and answers
  ``/metrics``;
* the catchup image's ``keyorder catchup`` drains a topic on Spark ``local[2]`` and commits the fence.

Skipped, with the reason, only outside CI where buildah cannot run (not root, or not installed: ``make
test`` installs it as root). In CI (``CI=true``, which ``.ci/run`` sets) it never skips: a runner that
cannot build the images fails here instead of silently losing their coverage.
"""

from __future__ import annotations

import os
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


def test_the_runtime_image_runs_keyorder_as_65532_and_processes_a_topic(images, broker, tmp_path):
    topic, group, port = "image-run", "image-run", free_port()
    create_topics(broker.bootstrap, [topic, f"{topic}.dlq"], 2)
    produced = produce_keyed(broker.bootstrap, topic, 400, 40, extra_config={"batch.num.messages": 1})
    with container(images["runtime"]) as name:
        identity = subprocess.run(run_in(name, "id", "-u"), env=image.ENV, capture_output=True, text=True, check=True)
        assert identity.stdout.strip() == "65532"
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
