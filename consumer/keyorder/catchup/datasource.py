"""A Spark 4 Python Data Source that reads fenced offset ranges of Kafka partitions.

Spark's own Kafka connector is a JVM jar; this reader needs only confluent-kafka, on the
executors' Python. Each split is one ``(topic, partition, start, end)``, and each reader task (Spark
input partition) a list of splits: one split in the shuffle layout, its partitions' splits in the
by-partition one (``layout``; ``read_task`` interleaves the partitions). The reader assigns a split's
partition at ``start``, reads up to the fence ``end`` (excluded), and then emits one *end marker* row
with the number of records it read, so the driver can prove every split reached its fence.
Records the group's consumers already finished (the offsets their commit metadata lists above the
committed one, shipped with the split) are read and counted in the marker as skipped, never
yielded: no handler sees them, and the audit still accounts for every offset. Clients are created
inside ``read()``: confluent-kafka objects do not pickle.

Rows carry only fixed-width columns besides the record itself, so the shuffle hashes and the
sort compares integers, never key bytes: ``lane`` (a stable 64-bit hash of the *route*, the unit
whose messages must stay in order: the key *within its partition* (topic, partition, key), or the
partition for keyless records and in partition ordering, as in the pods), ``source`` (the
partition's index in the plan, instead of its topic name) and ``progress`` (how far into its
partition's range the record lies, scaled to ``PROGRESS_SCALE``). A route never spans two
partitions, so sorting a Spark partition by ``(progress, source, offset)`` keeps every route's
messages in offset order, while interleaving the partitions and keys as a pod sees them in its
poll batches (see ``apply``). A key that sits in two partitions (after partitions were added) has
two routes, handled independently, in both layouts, as two pods would.

Transient read errors (a broker restart, a leader change) are retried inside the reader, as the
pods' client does, with a growing pause, for as long as the split may go without a record
(``read_timeout`` seconds, a time and not a count of errors: a broker restart takes the time it
takes); only a fatal or permanent error, or no record for ``read_timeout`` seconds, fails the
split.

A reader task's memory is bounded in bytes (``reader_shares``): at most ``READER_TASK_BYTES`` for its
open consumers' pre-fetch queues, one fetch response each, and the chunks waiting to be interleaved.
A task of many partitions opens at most ``open_at_once`` of them at a time (the largest first), each
with a smaller pre-fetch and smaller chunks; every partition is still read in offset order. Those
partitions' consumers are all created and assigned before the task waits for a record (``open_split``,
``merge_chunks``): librdkafka fetches for each in its own threads, so the task's first batch waits for one
first fetch, not for one per partition in turn.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NamedTuple, cast

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from keyorder.catchup import shipped
from keyorder.catchup.memory import READER_TASK_BYTES

SOURCE_NAME = "keyorder_kafka_ranges"
ROW_SCHEMA = (
    "lane long, source int, progress long, offset long, key binary, value binary, "
    "headers array<struct<name: string, value: binary>>, timestamp double, marker_read long, marker_skipped long"
)
"""``marker_read`` and ``marker_skipped`` are null on records and set on a split's end marker (then
key/value are null)."""
PROGRESS_SCALE = 1 << 20
"""``progress`` runs from 0 (the range's start) to PROGRESS_SCALE (its fence)."""
READ_BATCH = 1000
"""Most records one ``consume`` call returns."""
ARROW_BATCH_ROWS = 2_000
"""Most rows per Arrow batch a reader task yields (and per chunk when it interleaves partitions)."""
PREFETCH_KBYTES = 4096
"""librdkafka's pre-fetch queue per reader at most (its default is 64 MiB), unless the properties set it."""
FETCH_RESPONSE_BYTES = 1 << 20
"""librdkafka's ``max.partition.fetch.bytes`` default: one fetch response can land past a full pre-fetch queue."""
CHUNK_BYTES_MAX = 8 << 20
"""Largest chunk (Arrow batch) a reader task yields."""
STREAM_MIN_BYTES = 3 << 20
"""The least one open partition gets: 1 MiB of pre-fetch, one fetch response, a 1 MiB chunk."""
ROW_OVERHEAD = 128
"""Bytes a row costs besides its key, value and headers (the tuple, the ints), for chunk sizes."""
READ_ERROR_PAUSE_MAX = 2.0
"""Longest pause between two reads after transient errors (the pause doubles from 0.1 s up to it)."""
PERMANENT_ERRORS = frozenset(
    {
        "_AUTO_OFFSET_RESET",
        "OFFSET_OUT_OF_RANGE",
        "TOPIC_AUTHORIZATION_FAILED",
        "GROUP_AUTHORIZATION_FAILED",
        "CLUSTER_AUTHORIZATION_FAILED",
        "_INVALID_ARG",
        "_UNKNOWN_PARTITION",
    }
)
"""Error names that retrying cannot fix: the split fails at once."""
log = logging.getLogger(__name__)
OPTION_SPLITS = "splits"
OPTION_PROPERTIES_FILE = "kafka.properties.file"
"""The name of the run's shipped Kafka properties (``shipped``): the properties stay out of the reader's pickle."""
OPTION_ORDERING = "ordering"
OPTION_TIMEOUT = "read.timeout.seconds"
MARKER_PREFIX = b"\x00marker:"
KEYLESS_PREFIX = b"\x00partition:"
KEY_PREFIX = b"\x00key:"


class SplitReadError(RuntimeError):
    """A split could not be read up to its fence (the job fails; nothing is committed)."""


def partition_route(topic: str, partition: int) -> bytes:
    return KEYLESS_PREFIX + f"{topic}:{partition}".encode()


def key_route_prefix(topic: str, partition: int) -> bytes:
    """What a key's route starts with: the partition it sits in (topic names cannot contain ``:``)."""
    return KEY_PREFIX + f"{topic}:{partition}:".encode()


def route_of(ordering: str, topic: str, partition: int, key: bytes | None) -> bytes:
    """The unit of order: messages with equal routes are handled one at a time in offset order. A route
    never spans partitions: ``(topic, partition, key)``, or the partition (keyless records, partition
    ordering), which is the order the pods give (a key in two partitions is two routes there too)."""
    if ordering == "partition" or key is None:
        return partition_route(topic, partition)
    return key_route_prefix(topic, partition) + key


def record_lane(topic: str, partition: int, key: bytes) -> int:
    """The ``lane`` of a keyed record in key ordering: the hash of its route (its key within its partition)."""
    return lane_hash(key_route_prefix(topic, partition) + key)


def lane_hash(route: bytes) -> int:
    """A signed 64-bit hash of a route, the same in every process (Python's ``hash`` is salted)."""
    return int.from_bytes(hashlib.blake2b(route, digest_size=8).digest(), "big", signed=True)


def progress_of(offset: int, start: int, end: int) -> int:
    """``offset``'s position in ``[start, end)`` scaled to ``[0, PROGRESS_SCALE)``: non-decreasing in offset."""
    return (offset - start) * PROGRESS_SCALE // max(end - start, 1)


class KafkaRangeDataSource(DataSource):
    """``spark.read.format("keyorder_kafka_ranges").option("splits", json)...load()``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return ROW_SCHEMA

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaRangeReader(self.options)


class KafkaRangeReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.tasks = json.loads(options[OPTION_SPLITS])
        """Each reader task's splits, as JSON lists in ``Split``'s field order."""
        self.properties_file = options[OPTION_PROPERTIES_FILE]
        """Read in ``read`` on the executor: the reader is pickled into every task, the properties are not."""
        self.ordering = options.get(OPTION_ORDERING, "key")
        self.timeout = float(options.get(OPTION_TIMEOUT, "120"))

    def partitions(self) -> list[InputPartition]:
        return [InputPartition(task) for task in self.tasks]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        splits = [Split(*split) for split in partition.value]
        properties = shipped.load(self.properties_file, shipped.READER)
        yield from read_task(properties, self.ordering, splits, self.timeout)


class ReaderShares(NamedTuple):
    """How a reader task of several partitions shares its ``READER_TASK_BYTES`` (``reader_shares``)."""

    open_at_once: int
    """Partitions read at the same time (each an open consumer and a chunk waiting)."""
    prefetch_kbytes: int
    """Each open consumer's ``queued.max.messages.kbytes``."""
    chunk_bytes: int
    """Most bytes of rows per chunk (a chunk holds at least one row)."""

    def bytes(self) -> int:
        """At most what the task holds: every open partition's pre-fetch, fetch response and chunk, plus
        the Arrow copy of the chunk being yielded."""
        return self.open_at_once * (self.prefetch_kbytes * 1024 + FETCH_RESPONSE_BYTES + self.chunk_bytes) + (
            self.chunk_bytes
        )


def reader_shares(partitions: int, budget: int = READER_TASK_BYTES) -> ReaderShares:
    """How many of a task's ``partitions`` are open at once and what each may buffer, so that the whole
    stays within ``budget`` bytes (pure): as many as get ``STREAM_MIN_BYTES`` each, sharing the budget
    evenly, up to ``PREFETCH_KBYTES`` of pre-fetch and ``CHUNK_BYTES_MAX`` per chunk. One partition
    (the shuffle layout's reader tasks) gets the most of both."""
    open_at_once = max(1, min(partitions, budget // STREAM_MIN_BYTES - 1))
    share = budget // (open_at_once + 1) - FETCH_RESPONSE_BYTES  # +1: the chunk being converted to Arrow
    prefetch = max(min(PREFETCH_KBYTES, share // 2 // 1024), 1)
    chunk = max(min(CHUNK_BYTES_MAX, share - prefetch * 1024), 1)
    return ReaderShares(open_at_once, prefetch, chunk)


def read_task(
    properties: dict[str, str],
    ordering: str,
    splits: Sequence[Split],
    timeout: float,
    chunk_rows: int = ARROW_BATCH_ROWS,
    budget: int = READER_TASK_BYTES,
    **read_options: Any,
) -> Iterator[Any]:
    """One reader task's splits as Arrow batches: each partition's splits one after another, different
    partitions interleaved by ``progress`` (a chunk at a time), as a pod's poll batches interleave them.
    The by-partition layout hands these batches straight to the handlers, so no partition waits for
    another to be read first. At most ``reader_shares(...).open_at_once`` partitions are open at a time
    (the largest ranges first), all opened (consumer created and assigned) before the task waits for any
    record, so their first fetches overlap; the others start as those end, so their keys start late
    (docs/catchup.md, How it works, step 2, says why they are not reordered)."""
    by_source: dict[int, list[Split]] = {}
    for split in splits:
        by_source.setdefault(split.source, []).append(split)
    shares = reader_shares(len(by_source), budget)
    settings = {**properties}
    settings.setdefault("queued.max.messages.kbytes", str(shares.prefetch_kbytes))

    def size(chain: list[Split]) -> int:
        return sum(split.end - split.start for split in chain)

    def opener(chain: list[Split]) -> Callable[[], Iterator[list[tuple]]]:
        def open_chain() -> Iterator[list[tuple]]:
            first, *rest = sorted(chain, key=lambda s: s.start)
            opened = open_split(settings, ordering, first, timeout, **read_options)

            def rows() -> Iterator[tuple]:
                yield from opened
                for split in rest:
                    yield from read_split(settings, ordering, split, timeout, **read_options)

            chain_rows = rows()
            chunks = _chunks(chain_rows, chunk_rows, shares.chunk_bytes)
            # Closing a generator that never started runs none of its code (and on CPython >= 3.12 keeps its
            # locals until it is freed): close each layer, the opened consumer's own generator last.
            return _Stream(chunks, (chunks.close, chain_rows.close, opened.close))  # type: ignore[attr-defined]

        return open_chain

    chains = sorted(by_source.values(), key=lambda chain: (-size(chain), chain[0].source))
    for chunk in merge_chunks([opener(chain) for chain in chains], shares.open_at_once):
        yield arrow_batch(chunk)


class _Stream:
    """A stream of chunks with a ``close`` that releases what its opener opened, started or not.

    ``close`` calls each of ``closers`` in turn (all of them, even after one raised; the first error is
    raised after the rest ran, any later one logged)."""

    def __init__(self, chunks: Iterator[list[tuple]], closers: Sequence[Callable[[], object]]) -> None:
        self._chunks = chunks
        self._closers = closers

    def __iter__(self) -> Iterator[list[tuple]]:
        return self

    def __next__(self) -> list[tuple]:
        return next(self._chunks)

    def close(self) -> None:
        first_error: BaseException | None = None
        for closer in self._closers:
            try:
                closer()
            except Exception as error:
                if first_error is not None:
                    log.exception("closing a reader stream failed again")
                first_error = first_error or error
        if first_error is not None:
            raise first_error


def row_bytes(row: tuple) -> int:
    """A row's estimated memory: its key, value and headers plus ``ROW_OVERHEAD``."""
    size = ROW_OVERHEAD + len(row[4] or b"") + len(row[5] or b"")
    for name, value in row[6] or ():
        size += len(name) + len(value or b"")
    return size


def _chunks(rows: Iterator[tuple], size: int, max_bytes: int = CHUNK_BYTES_MAX) -> Iterator[list[tuple]]:
    """Rows in chunks of at most ``size`` rows and ``max_bytes`` (``row_bytes``; at least one row each)."""
    chunk: list[tuple] = []
    held = 0
    for row in rows:
        chunk.append(row)
        held += row_bytes(row)
        if len(chunk) >= size or held >= max_bytes:
            yield chunk
            chunk, held = [], 0
    if chunk:
        yield chunk


def _chunk_progress(chunk: list[tuple]) -> int:
    """The progress of a chunk's first record (-1 for end markers only: nothing to wait for)."""
    for row in chunk:
        if row[_MARKER_COLUMN] is None:
            return int(row[_PROGRESS_COLUMN])
    return -1


def merge_chunks(
    openers: Sequence[Callable[[], Iterator[list[tuple]]]], open_at_once: int | None = None
) -> Iterator[list[tuple]]:
    """Chunks of several streams, the one least far into its range first; each stream's own order kept.
    A stream is opened by calling its opener (``read_task``'s create and assign its first split's consumer,
    which then fetches in librdkafka's own threads) and started by asking it for its first chunk. At most
    ``open_at_once`` streams (None: all) are open and not yet ended at any time: the next one (in the given
    order) opens and starts when one ends. The first ``open_at_once`` are all opened before any is asked for
    a chunk, so their first fetches overlap: the first chunk comes after one fetch's wait, not one per
    stream (issue 38: two partitions' first fetches one after the other held a task's first batch for
    0.9-1.3 s)."""
    waiting = iter(enumerate(openers))
    heads: list[tuple[int, int, list[tuple]]] = []
    streams: dict[int, Iterator[list[tuple]]] = {}

    def open_next() -> int | None:
        for index, opener in waiting:
            streams[index] = opener()
            return index
        return None

    def start(index: int) -> bool:
        """Ask an opened stream for its first chunk; False if it had none (it ended)."""
        chunk = next(streams[index], None)
        if chunk is None:
            del streams[index]
            return False
        heapq.heappush(heads, (_chunk_progress(chunk), index, chunk))
        return True

    def start_next() -> None:
        while (index := open_next()) is not None:
            if start(index):
                return

    try:
        opened = [open_next() for _ in range(len(openers) if open_at_once is None else open_at_once)]
        for index in opened:
            if index is not None and not start(index):
                start_next()  # an empty stream's place goes to the next one
        while heads:
            _, index, chunk = heapq.heappop(heads)
            yield chunk
            following = next(streams[index], None)
            if following is not None:
                heapq.heappush(heads, (_chunk_progress(following), index, following))
            else:
                del streams[index]
                start_next()
    finally:
        for index, stream in streams.items():  # a failed or abandoned task: close the consumers still open
            close = getattr(stream, "close", None)
            if close is None:
                continue
            try:
                close()
            except Exception:  # the others still close, and the task's own error (if any) is the one raised
                log.exception("closing the reader task's stream %d failed", index)


def arrow_schema():
    import pyarrow

    return pyarrow.schema(
        [
            ("lane", pyarrow.int64()),
            ("source", pyarrow.int32()),
            ("progress", pyarrow.int64()),
            ("offset", pyarrow.int64()),
            ("key", pyarrow.binary()),
            ("value", pyarrow.binary()),
            ("headers", pyarrow.list_(pyarrow.struct([("name", pyarrow.string()), ("value", pyarrow.binary())]))),
            ("timestamp", pyarrow.float64()),
            ("marker_read", pyarrow.int64()),
            ("marker_skipped", pyarrow.int64()),
        ]
    )


_PROGRESS_COLUMN = 2
_MARKER_COLUMN = 8


def arrow_batch(rows: list[tuple]) -> Any:
    """Rows as one Arrow record batch: Spark takes it without converting row by row."""
    import pyarrow

    schema = arrow_schema()
    columns = zip(*rows, strict=True)
    arrays = [pyarrow.array(list(column), type=field.type) for column, field in zip(columns, schema, strict=True)]
    return pyarrow.RecordBatch.from_arrays(arrays, schema=schema)


class Split(NamedTuple):
    """One input split as the driver ships it (a JSON list in this field order)."""

    topic: str
    partition: int
    start: int
    end: int
    """The fence of this split (excluded)."""
    source: int = 0
    """The partition's index in the plan: the rows carry it instead of the topic name."""
    range_start: int = -1
    """The start of the partition's whole range in this wave (for ``progress``); -1: ``start``."""
    range_end: int = -1
    """The end of the partition's whole range in this wave; -1: ``end``."""
    skip: Sequence[Sequence[int]] = ()
    """Runs ``[first, end)`` of offsets the group's commit metadata marks finished (``plan.skip_runs``):
    read and counted, never yielded."""


def reader_config(properties: dict[str, str]) -> dict[str, Any]:
    """The split reader's consumer settings: never a group member, bounded pre-fetch."""
    return {
        "queued.max.messages.kbytes": PREFETCH_KBYTES,
        "queued.min.messages": 10_000,
        **properties,
        "group.id": "keyorder-catchup-reader",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "error",
    }


def _error_name(error: Any) -> str:
    try:
        return str(error.name())
    except Exception:  # an error object without a name
        return str(error.code())


def read_split(
    properties: dict[str, str],
    ordering: str,
    split: Split,
    timeout: float,
    consumer_factory: Any = None,
    sleep: Any = time.sleep,
    clock: Any = time.monotonic,
) -> Iterator[tuple]:
    """Rows of records at offsets ``start <= offset < end``, then the split's end marker; the consumer is
    created when the first row is asked for (``open_split`` creates it at once)."""
    yield from open_split(properties, ordering, split, timeout, consumer_factory, sleep, clock)


def open_split(
    properties: dict[str, str],
    ordering: str,
    split: Split,
    timeout: float,
    consumer_factory: Any = None,
    sleep: Any = time.sleep,
    clock: Any = time.monotonic,
) -> Iterator[tuple]:
    """``read_split``'s rows, with the split's consumer created and assigned now: librdkafka connects and
    fetches in its own threads from here on, while the caller opens other splits or reads other rows.
    Closing the returned iterator closes the consumer."""
    rows = _split_rows(properties, ordering, split, timeout, consumer_factory, sleep, clock)
    next(rows)  # runs up to the assignment (the generator is started, so closing it closes the consumer)
    return cast("Iterator[tuple]", rows)


def _split_rows(
    properties: dict[str, str],
    ordering: str,
    split: Split,
    timeout: float,
    consumer_factory: Any,
    sleep: Any,
    clock: Any,
) -> Iterator[tuple | None]:
    """First ``None`` once the consumer is assigned, then the split's rows and its end marker.

    Transient errors are logged and retried (librdkafka reconnects by itself) with a growing
    pause, until the split went ``timeout`` seconds without a record; a fatal or permanent error
    fails the split at once.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    topic, partition, start, end = split.topic, split.partition, split.start, split.end
    config = {**reader_config(properties), "logger": logging.getLogger("keyorder.librdkafka")}
    consumer = (consumer_factory or Consumer)(config)
    read = skipped = 0
    errors_in_a_row = 0
    finished = frozenset(offset for first, stop in split.skip for offset in range(first, stop))
    partition_lane = lane_hash(partition_route(topic, partition))
    range_start, range_end = (split.range_start, split.range_end) if split.range_start >= 0 else (start, end)
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        yield None  # opened: ``open_split`` returns here
        position = start
        quiet_since = clock()
        while position < end:
            # consume() returns once it has num_messages or after the timeout: never ask for more than the
            # fence leaves, or the last batch of a split that ends at the log's end waits out the whole
            # timeout (1 s per split). Offsets the log lacks (compaction, transaction markers) are made up
            # by the end-of-partition event or by records past the fence.
            batch = consumer.consume(num_messages=min(READ_BATCH, end - position), timeout=1.0)
            if not batch:
                if clock() - quiet_since > timeout:
                    raise SplitReadError(
                        f"{topic}[{partition}]: no records for {timeout}s at offset {position}, before the fence {end}"
                    )
                continue
            for record in batch:
                error = record.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        eof_offset = record.offset()
                        if eof_offset is None:
                            raise SplitReadError(f"{topic}[{partition}]: end-of-partition event without an offset")
                        position = max(position, eof_offset)
                        if position < end:  # the end offset moved back (topic recreated?) or log truncated
                            raise SplitReadError(
                                f"{topic}[{partition}]: the log ends at {position}, before the fence {end}"
                            )
                        continue
                    if error.fatal() or _error_name(error) in PERMANENT_ERRORS:
                        raise SplitReadError(f"{topic}[{partition}]: {error.str()}")
                    errors_in_a_row += 1
                    if clock() - quiet_since > timeout:
                        raise SplitReadError(
                            f"{topic}[{partition}]: no record for {timeout}s at offset {position}, "
                            f"{errors_in_a_row} read errors in a row, the last: {error.str()}"
                        )
                    pause = min(0.05 * 2 ** min(errors_in_a_row, 10), READ_ERROR_PAUSE_MAX)
                    log.warning(
                        "%s[%d]: read error at offset %d (%d in a row, retrying in %.2fs): %s",
                        topic,
                        partition,
                        position,
                        errors_in_a_row,
                        pause,
                        error.str(),
                    )
                    sleep(pause)
                    continue
                offset = record.offset()
                if offset is None:  # only error events lack one
                    raise SplitReadError(f"{topic}[{partition}]: record without an offset")
                errors_in_a_row = 0
                quiet_since = clock()
                position = offset + 1
                if offset >= end:
                    break
                if offset in finished:
                    skipped += 1
                    continue
                key = record.key()
                timestamp_type, timestamp_ms = record.timestamp()
                # The stub's HeadersType also covers what produce() accepts (a dict); a consumed
                # record's headers are always a list of (name, bytes or None).
                record_headers = cast("list[tuple[str, bytes | None]] | None", record.headers())
                headers = [(name, value) for name, value in (record_headers or [])]
                read += 1
                yield (
                    partition_lane if ordering == "partition" or key is None else record_lane(topic, partition, key),
                    split.source,
                    progress_of(offset, range_start, range_end),
                    offset,
                    key,
                    record.value(),
                    headers,
                    timestamp_ms / 1000 if timestamp_type and timestamp_ms >= 0 else None,
                    None,
                    None,
                )
    finally:
        consumer.close()
    # The marker sorts after every record of its range (progress = PROGRESS_SCALE).
    marker_lane = lane_hash(MARKER_PREFIX + f"{topic}:{partition}:{start}".encode())
    yield (marker_lane, split.source, PROGRESS_SCALE, end, None, None, [], None, read, skipped)
