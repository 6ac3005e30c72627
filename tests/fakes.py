"""Test doubles shared by the unit tests. Each is a FAKE, named as one where it is used.

``FakeClock`` stands in for ``time.monotonic``/``time.sleep`` (time is a parameter everywhere in the
engine), so deadlines and pacing are table tests instead of sleeps. ``RecordingSource`` is an
in-memory ``contracts.Source`` that records commits; the real broker covers the Kafka behaviour in
tests/integration/. ``HoldingPool`` is a pool whose deliveries finish only when the test says so.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence

from keyorder.contracts import CommitError, CommitOutcome, FetchPosition, RebalanceCallback, TopicPartitionId
from keyorder.core.lanes import Delivery, LaneSummary
from keyorder.engine.worker_pools import Completions, PoolHealth
from keyorder.message import Message


class FakeClock:
    """FAKE monotonic clock: ``sleep`` advances it instantly (thread-safe). With ``step``, every reading
    also moves it on by that much, so code that waits for a deadline by reading the clock (a parked
    lane becoming due) gets there without anybody sleeping."""

    def __init__(self, start: float = 1000.0, step: float = 0.0) -> None:
        self.now = start
        self.step = step
        self.slept = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> float:
        if self.step:
            with self._lock:
                self.now += self.step
        return self.now

    def sleep(self, seconds: float) -> None:
        with self._lock:
            self.now += seconds
            self.slept += seconds
        threading.Event().wait(0.0001)  # let real worker threads run, as a real sleep would


class RecordingSource:
    """FAKE Source: no records of its own; records commits; can be told to fail the next commit."""

    broker_reachable = True
    broker_error: str | None = None

    def __init__(self, committed: Mapping[TopicPartitionId, int | None] | None = None) -> None:
        self.committed_offsets = dict(committed or {})
        self.commits: list[tuple[dict[TopicPartitionId, tuple[int, str]], bool]] = []
        self.fail_next_commit: str | None = None
        self.paused: list[TopicPartitionId] = []
        self.client_positions: dict[TopicPartitionId, int] = {}
        """What ``positions`` reports (the client's position past skipped records); empty: unknown."""

    def subscribe(
        self, topics: Sequence[str], on_assign: RebalanceCallback, on_revoke: RebalanceCallback,
        on_lost: RebalanceCallback,
    ) -> None:  # fmt: skip
        pass

    def consume(self, max_messages: int, timeout: float) -> list[Message]:
        return []

    def pause(self, partitions: Sequence[TopicPartitionId]) -> None:
        self.paused.extend(partitions)

    def resume(self, partitions: Mapping[TopicPartitionId, FetchPosition | None]) -> None:
        pass

    def committed(
        self, partitions: Sequence[TopicPartitionId], timeout: float
    ) -> dict[TopicPartitionId, tuple[int | None, str | None]]:
        return {pid: (self.committed_offsets.get(pid), None) for pid in partitions}

    def commit(self, offsets: Mapping[TopicPartitionId, tuple[int, str]], asynchronous: bool) -> list[CommitOutcome]:
        if self.fail_next_commit:
            error, self.fail_next_commit = self.fail_next_commit, None
            raise CommitError(error)
        self.commits.append((dict(offsets), asynchronous))
        if asynchronous:  # like librdkafka: the results arrive later, through the commit callback
            return []
        return [(pid, offset, None) for pid, (offset, _metadata) in offsets.items()]

    def fetch_queue(self, partition: TopicPartitionId) -> int | None:
        return None

    def high_watermark(self, partition: TopicPartitionId) -> int | None:
        return None

    def positions(self, partitions: Sequence[TopicPartitionId]) -> dict[TopicPartitionId, int | None]:
        return {pid: self.client_positions.get(pid) for pid in partitions}

    def close(self) -> None:
        pass


class HoldingPool:
    """FAKE WorkerPool without workers: it keeps what it is given until the test says a delivery is
    done (``finish``), so the poll loop's reaction to each completion is exact and single-threaded."""

    executor = "fake"

    def __init__(self, completions: Completions, size: int = 1) -> None:
        self.health = PoolHealth()
        self.completions = completions
        self.held: list[Delivery] = []
        self._size = size

    @property
    def size(self) -> int:
        return self._size

    def start(self) -> None:
        pass

    def submit(self, deliveries: list[Delivery]) -> None:
        self.held.extend(deliveries)

    def finish(self, count: int = 1, partition: TopicPartitionId | None = None) -> None:
        """The ``count`` oldest deliveries (of ``partition``, if given) are done, as a worker reports them."""
        done = [d for d in self.held if partition is None or (d.message.topic, d.message.partition) == partition]
        done = done[:count]
        self.held = [delivery for delivery in self.held if delivery not in done]
        for delivery in done:
            self.completions.append((delivery, True))
        self.completions.signal()

    def withdraw(self, should_withdraw: Callable[[Delivery], bool]) -> list[Delivery]:
        withdrawn = [delivery for delivery in self.held if should_withdraw(delivery)]
        self.held = [delivery for delivery in self.held if not should_withdraw(delivery)]
        return withdrawn

    def resize(self, workers: int) -> None:
        self._size = workers

    def stop(self, timeout: float) -> None:
        for delivery in self.held:
            self.completions.append((delivery, False))
        self.held = []

    def stats(self) -> list:
        return []

    def begin_shutdown(self) -> None:
        pass

    def lane_summary(self) -> LaneSummary:
        return LaneSummary(running=len(self.held))

    def worker_pids(self) -> list[int]:
        return []
