"""Shared fixtures: one real Kafka-protocol broker (Tansu) per test session, topics, running pods."""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings

from keyorder.config import RunConfig
from keyorder.contracts import DeadLetterSink
from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker
from keyorder.devtools.loadgen import create_topics
from keyorder.pod import Pod
from tests.guarantees import SerialPerKey
from tests.support import group_committed, wait_for

__all__ = ["Recorder", "group_committed", "stop_pod", "wait_until"]

# Hypothesis: in CI (CI=true, set by .ci/run) the examples are derandomised, so a red run is the same run
# again; elsewhere they are random and remembered in .hypothesis/. Both print the reproduction blob of a
# failing example (paste it into @reproduce_failure, or store the example with @example in the test).
settings.register_profile("ci", derandomize=True, database=None, print_blob=True, deadline=None)
settings.register_profile("dev", print_blob=True, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "dev")


SLOW_FIXTURES = frozenset({"broker", "kube"})
"""A test that needs a broker (group joins take seconds) or the API emulator with kopf (about 2 s to
start) is ``slow``, and one that needs the broker is ``broker``: marked here from the fixtures it uses,
so no module can forget (``make test-fast`` runs the rest)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if "broker" in fixtures and item.get_closest_marker("broker") is None:
            item.add_marker(pytest.mark.broker)
        if fixtures & SLOW_FIXTURES and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """A real Tansu broker process on a free port, stopped by PID at the end of the session."""
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture
def make_topic(broker: EmbeddedBroker) -> Callable[..., str]:
    def create(partitions: int = 4, with_dlq: bool = True) -> str:
        name = f"t-{uuid.uuid4().hex[:10]}"
        create_topics(broker.bootstrap, [name, f"{name}.dlq"] if with_dlq else [name], partitions)
        return name

    return create


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> None:
    """``tests.support.wait_for`` without its value (kept for the many callers)."""
    wait_for(predicate, timeout, what, interval)


class Recorder:
    """A handler that records ``(key, seq)`` as it finishes, checks per-key seriality, may sleep/fail."""

    def __init__(
        self, min_sleep: float = 0.0, max_sleep: float = 0.0, fail: Callable[[dict], bool] | None = None, seed: int = 1
    ) -> None:
        self.records: list[tuple[str, int]] = []
        self.details: list[tuple[str, int, int, int, float]] = []  # key, seq, partition, offset, finished at
        self.attempts: list[tuple[str, int, float]] = []  # failed attempts: key, seq, time
        self.serial = SerialPerKey()
        self._lock = threading.Lock()
        self._random = random.Random(seed)
        self.min_sleep, self.max_sleep = min_sleep, max_sleep
        self.fail = fail

    def __call__(self, message: Any) -> None:
        event = json.loads(message.value)
        key = event["key"]
        self.serial.enter(key)
        try:
            if self.max_sleep:
                with self._lock:
                    pause = self._random.uniform(self.min_sleep, self.max_sleep)
                time.sleep(pause)
            if self.fail is not None and self.fail(event):
                with self._lock:
                    self.attempts.append((key, event["seq"], time.monotonic()))
                raise RuntimeError(f"poison message {key}/{event['seq']}")
            with self._lock:
                self.records.append((key, event["seq"]))
                self.details.append((key, event["seq"], message.partition, message.offset, time.monotonic()))
        finally:
            self.serial.leave(key)

    def count(self) -> int:
        return len(self.records)


@pytest.fixture
def run_pod(broker: EmbeddedBroker) -> Iterator[Callable[..., Pod]]:
    """Start in-process pods on the test broker; every one is stopped at teardown."""
    running: list[tuple[Pod, threading.Event, threading.Thread]] = []

    def start(
        topic: str,
        handler: Callable[[Any], Any] | str,
        group: str | None = None,
        dead_letters: DeadLetterSink | None = None,
        **settings: Any,
    ) -> Pod:
        """``handler``: a callable, or a ``package.module:function`` path the pod imports itself (the
        process executor's worker processes do). ``dead_letters``: a sink instead of the pod's own
        (the fault tests hand it one on another broker)."""
        values: dict[str, Any] = {
            "handler": handler if isinstance(handler, str) else "tests.conftest:Recorder",
            "topics": [topic],
            "group_id": group or f"g-{topic}",
            "bootstrap_servers": broker.bootstrap,
            "http_port": 0,
            "http_host": "127.0.0.1",
            "kafka_property": FAST_GROUP_JOIN,
            "commit_interval": 0.2,
            **settings,
        }
        pod = Pod(RunConfig(**values), handler=None if isinstance(handler, str) else handler, dead_letters=dead_letters)
        stop = threading.Event()
        thread = pod.start_in_thread(stop)
        pod.stop_event = stop  # type: ignore[attr-defined]
        pod.thread = thread  # type: ignore[attr-defined]
        running.append((pod, stop, thread))
        return pod

    yield start
    for _pod, stop, _thread in running:
        stop.set()
    for _pod, _stop, thread in running:
        thread.join(60)
        assert not thread.is_alive(), "a pod did not stop within 60s"


def stop_pod(pod: Pod, timeout: float = 60) -> None:
    pod.stop_event.set()  # type: ignore[attr-defined]
    pod.thread.join(timeout)  # type: ignore[attr-defined]
    assert not pod.thread.is_alive(), "pod did not stop"  # type: ignore[attr-defined]
