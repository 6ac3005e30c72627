"""The engine's seams: what the poll loop and the workers need from the outside world.

``Source`` is everything the runtime asks of a broker (consume, pause/resume, commit, rebalance
callbacks); ``DeadLetterSink`` is where exhausted messages go. Their Kafka implementations live in
``adapters/`` (``kafka_source``, ``dead_letters``); a second broker (the seeds' RocketMQ, say)
would be a second adapter of these same protocols. The engine (``runtime``, ``workers``) imports
this module and ``core`` only, never an adapter, so it can be read and tested without librdkafka.

Errors a seam may raise are defined here too, because the engine handles them:

* ``SourceError``: fatal, the pod exits (and is restarted);
* ``CommitError``: one commit request failed as a whole, the next commit retries;
* ``DeadLetterError``: the dead-letter write failed, the message stays in flight and is retried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple, Protocol

from keyorder.message import Message

TopicPartitionId = tuple[str, int]
"""A partition of a topic: ``(topic, partition number)``."""

RebalanceCallback = Callable[[list[TopicPartitionId]], None]
"""Called on the poll thread, inside ``Source.consume``, with the partitions concerned."""

CommitOutcome = tuple[TopicPartitionId, int, str | None]
"""One partition's commit result: (partition, committed offset, error description or None)."""


class FetchPosition(NamedTuple):
    """Where a resumed partition fetches from: the next offset, with the leader epoch of the record before it
    (KIP-320; ``None``: unknown). The epoch lets the client validate the position against a log truncated
    while the partition was paused, instead of fetching past the new log's records at the reused offsets."""

    offset: int
    leader_epoch: int | None = None


class SourceError(RuntimeError):
    """A fatal consumer error: the pod must exit (and be restarted)."""


class CommitError(RuntimeError):
    """A commit request failed as a whole (transient: the next commit retries)."""


class DeadLetterError(RuntimeError):
    """The dead-letter record could not be written (it will be retried)."""


class Source(Protocol):
    """A consumer-group member with manual commits. Every method is called on the poll thread;
    only ``high_watermark`` and the two broker attributes may be read from another thread."""

    broker_reachable: bool
    """Whether a broker answered lately (``/readyz`` and ``keyorder_broker_reachable`` show it)."""
    broker_error: str | None
    """Why the broker is not reachable, while it is not."""

    def subscribe(
        self,
        topics: Sequence[str],
        on_assign: RebalanceCallback,
        on_revoke: RebalanceCallback,
        on_lost: RebalanceCallback,
    ) -> None: ...
    def consume(self, max_messages: int, timeout: float) -> list[Message]: ...
    def pause(self, partitions: Sequence[TopicPartitionId]) -> None: ...
    def resume(self, partitions: Mapping[TopicPartitionId, FetchPosition | None]) -> None: ...
    def committed(
        self, partitions: Sequence[TopicPartitionId], timeout: float
    ) -> dict[TopicPartitionId, tuple[int | None, str | None]]: ...
    def commit(
        self, offsets: Mapping[TopicPartitionId, tuple[int, str]], asynchronous: bool
    ) -> list[CommitOutcome]: ...
    def high_watermark(self, partition: TopicPartitionId) -> int | None: ...
    def fetch_queue(self, partition: TopicPartitionId) -> int | None:
        """Messages the client has fetched for the partition and not yet handed out, from its latest
        statistics; ``None`` where unknown. May be read from another thread."""
        ...

    def positions(self, partitions: Sequence[TopicPartitionId]) -> dict[TopicPartitionId, int | None]:
        """The client's position in each partition: the offset after the last record it handed out,
        moved past the records it skipped without handing them out (transaction markers, and aborted
        transactions' records under read_committed); ``None`` where unknown. Local, no broker call."""
        ...

    def close(self) -> None: ...


class DeadLetterSink(Protocol):
    """Where messages that exhausted their retries go; called from worker threads."""

    def publish(self, message: Message, error: BaseException, attempts: int) -> None:
        """Write ``message`` to the DLQ and return only once it is durable; raise on failure."""

    def close(self) -> None:
        """Flush and release the sink (called once, at shutdown)."""
