"""Observing a consumer group's backlog directly from Kafka, the way KEDA does (no Prometheus).

Lag = end offset - committed offset, summed over the partitions of the group's topics (before a
group's first commit, from where ``auto.offset.reset`` starts it). The
drain rate is the movement of the committed offsets between two samples, the arrival rate the
movement of the end offsets; both are derived by the pure ``rates`` function. Anything that
prevents an exact answer (broker unreachable, topic missing) raises ``LagUnavailable``:
the policy then keeps the current size rather than guessing.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from confluent_kafka.admin import AdminClient

    from keyorder_operator.pod_signals import PodSignals
    from keyorder_operator.policy import Observation

# Only the standard library at import time: the lag reader's child process (``lag_reader``) imports this
# module, and starts faster and smaller without the spec models (pydantic) and the policy.

log = logging.getLogger(__name__)


class LagUnavailable(RuntimeError):
    """The lag could not be measured; the message says why (never includes credentials). ``reason`` is the
    same without the timing (how long ago it was asked, when it will be asked again): the condition shows
    it, so a cluster that stays down does not rewrite status on every poll. ``condition`` is the LagUnknown
    condition's reason: ``LagUnavailable``, or what went wrong on the operator's side of the read
    (``KafkaPropertyRefused``, ``lag_reader.READER_FAILED``)."""

    def __init__(self, message: str, reason: str | None = None, condition: str = "LagUnavailable") -> None:
        super().__init__(message)
        self.reason = reason or message
        self.condition = condition


@dataclass(frozen=True)
class LagSample:
    at: float
    partitions: int
    end_total: int
    committed_total: int
    partition_lags: tuple[int, ...] = ()
    """Lag of each partition, in topic/partition order (for displays; totals drive the policy)."""
    end_offsets: tuple[tuple[str, int, int], ...] = ()
    """``(topic, partition, end offset)`` per partition: the fence of a catch-up started now."""

    @property
    def lag(self) -> int:
        return max(self.end_total - self.committed_total, 0)


Request = tuple[tuple[str, ...], str]
"""(topics, group): what a lag sample answers."""


class LagSource(Protocol):
    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample: ...

    def close(self) -> None:
        """Release the client (its connections); a closed source is never sampled again."""


def start_daemon_thread(probe: Callable[[], None]) -> None:
    """Run ``probe`` on its own daemon thread (it only waits on Kafka's answer)."""
    threading.Thread(target=probe, name="keyorder-lag-probe", daemon=True).start()


class BoundedLagSource:
    """A lag source whose ``sample`` never holds the poll for long, and stops asking a cluster that
    does not answer, for a while.

    The poll runs on kopf's shared handler threads, and one Kafka request that does not answer costs
    the client's timeouts (seconds). So every request runs on its own thread (``start_probe``), at most
    one at a time per resource:

    - while the cluster answers, ``sample`` waits for the answer up to ``wait_seconds``. An answer that
      comes later is kept: the next ``sample`` starts the next request, waits for it as long, and
      returns the kept answer if the new one is not there yet (a slow cluster's lag, every poll, one
      poll late; a cluster fast again is current again). A kept answer is only returned for the same
      topics and group;
    - after a failure it backs off: ``sample`` fails at once with the last reason for ``first_seconds``
      counted from the failure, doubling up to ``longest_seconds`` while the failures go on, each
      period spread by up to ``jitter`` (resources that failed together must not all probe together).
      A due probe is started in the background and ``sample`` does not wait for it; one success ends
      the back-off.

    So however many resources point at dead clusters, the threads stay free for the healthy ones. The
    schedule takes time from the caller (``now``, plus how long a failed request took on
    ``monotonic``) and randomness from ``random``; a unit test passes a ``start_probe`` that runs the
    probe inline.
    """

    def __init__(
        self,
        inner: LagSource,
        first_seconds: float = 15.0,
        longest_seconds: float = 120.0,
        jitter: float = 0.25,
        wait_seconds: float = 2.0,
        random: Callable[[], float] = random.random,
        start_probe: Callable[[Callable[[], None]], None] = start_daemon_thread,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.inner = inner
        self.first_seconds, self.longest_seconds, self.jitter = first_seconds, longest_seconds, jitter
        self.wait_seconds = wait_seconds
        self._random = random
        self._start_probe = start_probe
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._retry_at: float | None = None
        self._delay = 0.0
        self._error = ""
        self._condition = "LagUnavailable"
        """The LagUnknown condition's reason for ``_error`` (``LagUnavailable.condition``)."""
        self._in_flight: threading.Event | None = None
        self._in_flight_since = 0.0
        self._answer: tuple[Request, LagSample] | None = None

    def _take_answer(self, request: Request) -> LagSample | None:
        """The kept answer, if it answers ``request`` (the lock is held); it is used once."""
        kept, self._answer = self._answer, None
        return kept[1] if kept is not None and kept[0] == request else None

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        request: Request = (tuple(topics), group)
        with self._lock:
            kept = self._take_answer(request)
            if self._in_flight is not None:
                if kept is not None:
                    return kept
                waited = max(now - self._in_flight_since, 0.0)
                # the reason the first wait gave, unchanged while the request hangs: the LagUnknown condition
                # shows the reason, and a new wording of the same state would be a status write on each poll
                why = self._error or self._unanswered()
                raise LagUnavailable(f"{why} (asked {waited:.0f} s ago)", why, self._condition)
            backing_off = self._retry_at is not None
            if backing_off and self._retry_at is not None and now < self._retry_at:
                raise LagUnavailable(
                    f"{self._error} (not asked again for {self._retry_at - now:.0f} s)", self._error, self._condition
                )
            done = self._in_flight = threading.Event()
            self._in_flight_since = now
        try:
            self._start_probe(lambda: self._probe(request, now, done))
        except Exception as error:  # no thread to run it (the process is out of threads): never stuck in flight
            with self._lock:
                if self._in_flight is done:
                    self._in_flight = None
            if kept is not None:
                return kept
            raise LagUnavailable(f"a request to Kafka could not be started: {error}") from None
        if not backing_off:
            done.wait(self.wait_seconds)
        with self._lock:
            if self._in_flight is done:  # still unanswered
                if kept is not None:
                    return kept
                if backing_off:
                    raise LagUnavailable(
                        f"asked again in the background after: {self._error}", self._error, self._condition
                    )
                raise LagUnavailable(
                    f"Kafka has not answered within {self.wait_seconds:g} s (the answer is awaited)",
                    self._error or self._unanswered(),
                    self._condition,
                )
            fresh = self._take_answer(request)
            if fresh is not None:
                return fresh
            raise LagUnavailable(self._error, condition=self._condition)

    def _unanswered(self) -> str:
        return f"Kafka has not answered within {self.wait_seconds:g} s"

    def _probe(self, request: Request, now: float, done: threading.Event) -> None:
        started = self._monotonic()
        try:
            answer = self.inner.sample(list(request[0]), request[1], now)
        except Exception as error:  # on the probe thread: anything unexpected is a failure too
            if isinstance(error, LagUnavailable):
                reason, condition = error.reason, error.condition
            else:
                reason, condition = f"reading the lag failed: {error!r}", "LagUnavailable"
            failed_at = now + max(self._monotonic() - started, 0.0)  # the back-off counts from the failure
            with self._lock:
                self._delay = (
                    self.first_seconds if self._retry_at is None else min(self._delay * 2, self.longest_seconds)
                )
                spread = 1.0 + self.jitter * (2 * self._random() - 1)
                self._retry_at, self._error, self._condition = failed_at + self._delay * spread, reason, condition
                self._in_flight = None
        else:
            with self._lock:
                self._retry_at, self._delay, self._error, self._answer = None, 0.0, "", (request, answer)
                self._condition = "LagUnavailable"
                self._in_flight = None
        done.set()

    def close(self) -> None:
        self.inner.close()


def rates(previous: LagSample | None, current: LagSample) -> tuple[float | None, float | None]:
    """``(drain rate, arrival rate)`` in messages/s between two samples (``None`` without a previous one)."""
    if previous is None or current.at <= previous.at or current.partitions != previous.partitions:
        return None, None
    seconds = current.at - previous.at
    drain = max(current.committed_total - previous.committed_total, 0) / seconds
    arrival = max(current.end_total - previous.end_total, 0) / seconds
    return drain, arrival


def starting_position(committed: int, start: int, end: int, from_latest: bool) -> int:
    """Where the group stands on a partition: its committed offset, or, before its first commit,
    where its pods will start (``auto.offset.reset``): the log start (all of it is lag) or the end
    (none is). So a new group, or one scaled to zero before it ever committed, still has a lag and
    wakes up (KEDA's ``offsetResetPolicy``)."""
    if committed >= 0:
        return committed
    return end if from_latest else start


def observation_from(
    previous: LagSample | None,
    sample: LagSample,
    pods: PodSignals | None = None,
    rollout_settled: bool = True,
    paused: bool = False,
    pods_expected: int | None = None,
) -> Observation:
    """The policy's input from two lag samples and the pods' reports (the operator, ``keyorder
    dev`` and ``keyorder simulate`` build it the same way). ``pods_expected``: the ready pods asked
    for a report (``pods`` sums those that answered)."""
    from keyorder_operator.policy import Observation

    drain, arrival = rates(previous, sample)
    return Observation(
        lag=sample.lag,
        partitions=sample.partitions,
        drain_rate=drain,
        arrival_rate=arrival,
        partition_lags=sample.partition_lags,
        pods=pods,
        rollout_settled=rollout_settled,
        paused=paused,
        pods_expected=pods_expected,
    )


CONSUMER_ONLY = frozenset({"auto.offset.reset", "max.poll.interval.ms"})
"""Properties a lag sample (or the operator's drain check) reads but an admin client does not use
(``kafka_config.READ_NOT_PASSED``): never given to the client."""


def redact(message: str, properties: Mapping[str, str]) -> str:
    """``message`` with every property value (but the bootstrap servers) replaced: Kafka's errors may quote one."""
    for name, value in properties.items():
        if name != "bootstrap.servers" and len(value) >= 4:
            message = message.replace(value, "<redacted>")
    return message


def describe_kafka_error(error: BaseException, properties: Mapping[str, str]) -> str:
    from confluent_kafka import KafkaException

    text = error.args[0].str() if isinstance(error, KafkaException) and error.args else str(error)
    return redact(text, properties)


class KafkaLagSource:
    """Reads offsets for one Kafka configuration with an AdminClient of its own, built at the first sample.

    In the operator it lives in a namespace's lag reader process (``lag_reader``), one per distinct
    configuration of the namespace's resources, so resources that share a configuration share its client.
    Every failure, building the client included (a bad property, a wrong PEM), is a ``LagUnavailable``
    whose message carries no property value. Metadata requests name only the asked topics. ``close``
    drops the client (librdkafka destroys it once no call uses it); a closed source refuses to sample.
    Thread-safety: ``sample`` and ``close`` may run on different threads.
    """

    def __init__(self, properties: Mapping[str, str], timeout: float = 5.0) -> None:
        self._properties = dict(properties)
        self._timeout = timeout
        self._lock = threading.Lock()
        self._admin: AdminClient | None = None
        self._closed = False

    def _client(self) -> AdminClient:
        """The client, built on first use; ``LagUnavailable`` if it cannot be built or the source is closed.
        Kept referenced here: an unreferenced AdminClient can hang a call."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        with self._lock:
            if self._closed:
                raise LagUnavailable("the Kafka client was closed (the resource or its credentials changed)")
            if self._admin is None:
                passed: dict[str, str | int | float | bool] = {
                    name: value for name, value in self._properties.items() if name not in CONSUMER_ONLY
                }
                try:
                    self._admin = AdminClient(passed, logger=logging.getLogger("keyorder.librdkafka"))
                except (KafkaException, ValueError, TypeError) as error:
                    reason = describe_kafka_error(error, self._properties)
                    raise LagUnavailable(f"the Kafka client could not be built: {reason}") from None
            return self._admin

    def _describe(self, error: BaseException) -> str:
        return describe_kafka_error(error, self._properties)

    def close(self) -> None:
        with self._lock:
            self._closed, self._admin = True, None

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        from confluent_kafka import (
            ConsumerGroupTopicPartitions,
            KafkaError,
            KafkaException,
            TopicCollection,
            TopicPartition,
        )
        from confluent_kafka.admin import OffsetSpec

        admin = self._client()
        timeout = self._timeout
        try:
            described = admin.describe_topics(TopicCollection(list(topics)), request_timeout=timeout)
            partitions = []
            for topic in topics:
                try:
                    description = described[topic].result(timeout=timeout)
                except KafkaException as error:
                    if error.args and error.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART:
                        raise LagUnavailable(f"topic {topic!r} not found") from None
                    raise
                ids = sorted(partition.id for partition in description.partitions)
                partitions += [TopicPartition(topic, partition) for partition in ids]
            request = [ConsumerGroupTopicPartitions(group, partitions)]
            groups = admin.list_consumer_group_offsets(request, request_timeout=timeout)
            ends = admin.list_offsets({tp: OffsetSpec.latest() for tp in partitions}, request_timeout=timeout)
            result = groups[group].result(timeout=timeout)
            committed = {(tp.topic, tp.partition): tp.offset for tp in result.topic_partitions}
            end = {(tp.topic, tp.partition): future.result(timeout=timeout).offset for tp, future in ends.items()}
            from_latest = self._properties.get("auto.offset.reset", "earliest") in ("latest", "largest", "end")
            # the log start matters only where the group has not committed and starts from the earliest
            # offset: once it has committed everywhere, a poll asks for no earliest offsets at all
            unstarted = [tp for tp in partitions if committed.get((tp.topic, tp.partition), -1) < 0]
            start: dict[tuple[str, int], int] = {}
            if unstarted and not from_latest:
                starts = admin.list_offsets({tp: OffsetSpec.earliest() for tp in unstarted}, request_timeout=timeout)
                start = {
                    (tp.topic, tp.partition): future.result(timeout=timeout).offset for tp, future in starts.items()
                }
        except KafkaException as error:
            raise LagUnavailable(f"Kafka: {self._describe(error)}") from error
        except TimeoutError as error:
            raise LagUnavailable(f"Kafka did not answer within {timeout}s") from error
        end_total = committed_total = 0
        partition_lags, end_offsets = [], []
        for tp in partitions:
            key = (tp.topic, tp.partition)
            end_offset, start_offset = end[key], start.get(key, 0)
            end_total += end_offset
            consumed = starting_position(committed.get(key, -1), start_offset, end_offset, from_latest)
            committed_total += consumed
            partition_lags.append(max(end_offset - consumed, 0))
            end_offsets.append((tp.topic, tp.partition, end_offset))
        return LagSample(
            at=now,
            partitions=len(partitions),
            end_total=end_total,
            committed_total=committed_total,
            partition_lags=tuple(partition_lags),
            end_offsets=tuple(end_offsets),
        )
