"""Fixtures of the fault tests: a Tansu broker reached only through a ``FaultProxy``, and an audit
of the group's commits while faults happen.

Here the ``broker`` fixture (used by ``make_topic`` and ``run_pod``) is that proxied broker: its
``bootstrap`` is the proxy's address and Tansu advertises the proxy too, so every connection of
every client (pods, producers, the audit) goes through the proxy. One broker serves the whole
package; each test heals the proxy at teardown, so a failed test leaves no fault behind.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from keyorder.devtools.embedded import EmbeddedBroker, free_port
from tests.faults.proxy import FaultProxy


@dataclass
class ProxiedBroker:
    """A real Tansu broker whose advertised listener is ``proxy``."""

    tansu: EmbeddedBroker
    proxy: FaultProxy

    @property
    def bootstrap(self) -> str:
        return self.proxy.address


@pytest.fixture(scope="package")
def broker() -> Iterator[ProxiedBroker]:
    """Tansu and its proxy for the fault tests; both stopped at the end (Tansu by PID)."""
    proxy_port = free_port()
    tansu = EmbeddedBroker(advertised_port=proxy_port)
    with FaultProxy(tansu.port, port=proxy_port) as proxy, tansu:
        yield ProxiedBroker(tansu, proxy)


@pytest.fixture(autouse=True)
def _heal_after_each_test(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "broker" in request.fixturenames:
        request.getfixturevalue("broker").proxy.heal()


class CommitAudit:
    """Samples the group's committed offsets from the broker (every ``interval`` seconds, on its own
    thread) while a fault test runs, so the test can check afterwards that no committed offset ever
    passed a message that was not handled by then. Samples that fail during a fault are skipped."""

    def __init__(self, bootstrap: str, group: str, topic: str, partitions: int, interval: float = 0.5) -> None:
        self._reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
        self._partitions = [TopicPartition(topic, partition) for partition in range(partitions)]
        self._interval = interval
        self.samples: list[tuple[float, dict[int, int]]] = []
        """(monotonic time the answer arrived, partition -> committed offset)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commit-audit", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                found = self._reader.committed(self._partitions, timeout=2)
            except KafkaException:
                continue  # the broker is out of reach (the fault): no sample
            committed = {tp.partition: tp.offset for tp in found if tp.error is None and tp.offset >= 0}
            self.samples.append((time.monotonic(), committed))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._reader.close()

    def assert_never_past_unhandled(self, handled: Iterable[tuple[int, int, float]]) -> int:
        """``handled``: ``(partition, offset, finished at)`` of every completion (handled or
        dead-lettered). Each sampled committed offset must have every offset below it finished
        before the sample. Returns how many samples were checked."""
        first_done: dict[tuple[int, int], float] = {}
        for partition, offset, at in handled:
            if at < first_done.get((partition, offset), float("inf")):
                first_done[(partition, offset)] = at
        for sampled_at, committed in self.samples:
            for partition, position in committed.items():
                unhandled = [
                    offset
                    for offset in range(position)
                    if first_done.get((partition, offset), sampled_at + 1) > sampled_at
                ]
                assert not unhandled, (
                    f"partition {partition}: committed {position} at {sampled_at:.2f} while offsets "
                    f"{unhandled[:5]} were not handled yet"
                )
        return len(self.samples)


@pytest.fixture
def commit_audit() -> Iterator[Callable[..., CommitAudit]]:
    audits: list[CommitAudit] = []

    def start(bootstrap: str, group: str, topic: str, partitions: int) -> CommitAudit:
        audit = CommitAudit(bootstrap, group, topic, partitions)
        audits.append(audit)
        return audit

    yield start
    for audit in audits:
        audit.close()
