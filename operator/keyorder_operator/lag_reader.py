"""Each tenant's Kafka reads in a child process of the tenant's own, so a tenant's broker cannot take the operator down.

The operator reads every OrderedConsumer's lag with librdkafka, from the brokers the tenant names
(``spec.kafka.bootstrapServers``) with the tenant's properties. librdkafka parses what those brokers answer
in C, and some answers abort it: an ApiVersions response whose array count is the compact encoding of -1
(21 bytes in all) makes ``rd_kafka_handle_ApiVersion`` (librdkafka ``src/rdkafka_request.c``) call
``rd_malloc(sizeof(**apis) * ApiArrayCnt)`` with a negative count, which ``rd_malloc`` (``src/rd.h``) asserts
non-NULL: SIGABRT. ``rd_kafka_buf_read_arraycnt`` (``src/rdkafka_buf.h``) lets -1 through. Inside the
operator's process that is every tenant's autoscaling gone, on every restart (a crash loop).

So the reads run in child processes, one per tenant: per namespace (``LagReaders`` keeps one
``NamespaceLagReader`` per namespace that has resources). A child (``LagReaderProcess``: a fresh interpreter
that shares no threads, locks or memory with the operator) costs about 15 MB of private memory, so one per
resource would not fit hundreds of resources in the operator's memory limit; one per namespace bounds what a
tenant's broker can break to that tenant's resources. The child keeps one ``observe.KafkaLagSource`` per
distinct Kafka configuration of the namespace's resources: the parent sends a configuration's properties
once, when a resource first needs it in that child (through the pipe, never the command line or the
environment, which ``/proc`` shows), then names it by a number; a configuration no resource uses any more (a
deleted resource, a rotated password) is closed in the child, and a namespace without resources has no child.

The parent sends one request at a time per child (kopf polls resources on different threads; their requests
to one namespace's child are serialised) and waits at most ``deadline_seconds`` for the answer, counted from
when the resource asked: the time a resource waits for the namespace's other requests counts toward its own
deadline, so no resource's thread is held past its deadline by another's hung broker. The child runs under
an address-space limit (``RLIMIT_AS``) and asks the kernel to pick it first when the container runs out of
memory (``oom_score_adj``). A child that dies (signal, exit code, out of memory) or does not answer in time is
killed; every resource of the namespace then fails with a ``LagUnavailable`` whose condition reason is
``LagReaderFailed`` and whose message names the exit code or signal and when the reader is started again.
Restarts back off (``RestartBackoff``, pure, time as a parameter, one per namespace): a broker that crashes
every reader costs one process start per back-off period, not one per poll. Other namespaces have their own
children and go on being polled on time.

Why one room of over 600 lines: the parent (``LagReaders`` down to ``LagReaderProcess``) and the child
(``main``, ``serve``) speak one protocol defined here (the JSON answer both sides read, the frames), and
the child is started as ``python -m keyorder_operator.lag_reader``: the process name an operator's
process listing shows, and the one ``tests/unit/test_lag_source_isolation.py`` looks for and starts
directly. Moving the child into a module of its own would change that name; the parent is most of the
lines, and each of its classes is one layer of the one mechanism described above.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import multiprocessing.connection
import os
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from keyorder.logs import JsonFormatter, configure_logging
from keyorder_operator.observe import LagSample, LagUnavailable

READER_FAILED = "LagReaderFailed"
"""The LagUnknown condition's reason when the reader process crashed, hung or ran out of memory."""

DEADLINE_SECONDS = 30.0
"""A sample's overall deadline, counted from when the resource asked (its wait for the namespace's other requests
included): the child's client waits up to 5 s per request and a sample makes up to four in a row (topics,
committed offsets, end offsets, start offsets), plus the child's start (about 0.5 s)."""

MEMORY_BYTES = 512 << 20
"""The child's address-space limit (``RLIMIT_AS``): a child with one idle client reserves about 204 MB of
address space (interpreter, librdkafka's thread stacks and malloc arenas; measured ``VmPeak``), of which about
35 MB is resident, and about 19 MB more per further configuration: some 16 configurations fit one namespace's
child. Half the chart's 1 Gi container limit, so that one tenant's child at its limit cannot run the
container out of memory by itself (with cgroup v2 the kubelet has the kernel kill every process of a
container that does, the operator included, whatever ``oom_score_adj`` says)."""

CLOSED = "the Kafka client was closed (the resource or its credentials changed)"

OUT_OF_MEMORY = "the lag reader ran out of memory"

MAX_ANSWER_BYTES = 16 << 20
"""The largest answer the parent reads from a child (a sample of 100,000 partitions is about 5 MB)."""

MAX_REASON_CHARS = 1000
"""A child's reason is cut to this many characters before it reaches a condition."""

CHILD_REQUEST_TIMEOUT = 5.0
"""Each Kafka request's timeout inside the child (``KafkaLagSource``)."""


@dataclass(frozen=True)
class RestartBackoff:
    """When a namespace's reader may be started again after failures (pure: time is a parameter).

    The first failure waits ``first_seconds``, each further one in a row twice as long up to
    ``longest_seconds``; an answer (even ``LagUnavailable``, which is the child working) ends the back-off.
    """

    first_seconds: float = 5.0
    longest_seconds: float = 300.0
    failures: int = 0
    retry_at: float | None = None
    cause: str = ""

    @property
    def delay(self) -> float:
        """The current wait (0 without a failure)."""
        if not self.failures:
            return 0.0
        return min(self.first_seconds * 2 ** (self.failures - 1), self.longest_seconds)

    def failed(self, cause: str, now: float) -> RestartBackoff:
        failed = replace(self, failures=self.failures + 1, cause=cause)
        return replace(failed, retry_at=now + failed.delay)

    def succeeded(self) -> RestartBackoff:
        return replace(self, failures=0, retry_at=None, cause="")

    def waiting(self, now: float) -> float:
        """Seconds until a reader may start again (0: now)."""
        return 0.0 if self.retry_at is None else max(self.retry_at - now, 0.0)


def exit_cause(exitcode: int | None) -> str:
    """How a child ended, for the condition: its signal by name, or its exit code."""
    if exitcode is None:
        return "did not exit"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return f"was killed by {name} (exit code {exitcode})"
    return f"exited with code {exitcode}"


def reader_failure(cause: str, backoff: RestartBackoff, now: float) -> LagUnavailable:
    """The sample's error while the reader is down: the condition's message (``reason``) names the cause and
    the back-off period, without the countdown (a condition rewritten every poll would be a write per poll)."""
    why = f"the lag reader process {cause}; it is started again after {backoff.delay:g} s (back-off)"
    return LagUnavailable(f"{why}, in {backoff.waiting(now):.0f} s", why, condition=READER_FAILED)


# --- what crosses the pipe: JSON, read strictly ----------------------------------------------------------
# Never pickle: the child parses a tenant's broker's bytes in C, and a child that broke could otherwise
# hand the operator a pickle, which runs code when it is loaded.


def sample_to_answer(sample: LagSample) -> dict[str, Any]:
    return {
        "sample": {
            "at": sample.at,
            "partitions": sample.partitions,
            "end_total": sample.end_total,
            "committed_total": sample.committed_total,
            "partition_lags": list(sample.partition_lags),
            "end_offsets": [list(entry) for entry in sample.end_offsets],
        }
    }


def _whole(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not a whole number: {type(value).__name__}")
    return value


def answer_to_sample(data: bytes) -> LagSample | None:
    """The child's answer as a ``LagSample``; raises ``LagUnavailable`` for the child's "no sample, because";
    ``None`` for anything that is neither (a child that misbehaves: it is killed)."""
    try:
        answer = json.loads(data)
        if not isinstance(answer, dict):
            return None
        if "unavailable" in answer:
            message = str(answer["unavailable"])[:MAX_REASON_CHARS]
            reason = answer.get("reason")
            raise LagUnavailable(message, str(reason)[:MAX_REASON_CHARS] if reason is not None else None)
        fields = answer["sample"]
        at = fields["at"]
        if isinstance(at, bool) or not isinstance(at, int | float):
            return None
        return LagSample(
            at=float(at),
            partitions=_whole(fields["partitions"]),
            end_total=_whole(fields["end_total"]),
            committed_total=_whole(fields["committed_total"]),
            partition_lags=tuple(_whole(lag) for lag in fields["partition_lags"]),
            end_offsets=tuple(
                (str(topic), _whole(partition), _whole(offset)) for topic, partition, offset in fields["end_offsets"]
            ),
        )
    except (ValueError, TypeError, KeyError):
        return None


# --- the child -------------------------------------------------------------------------------------------
# Requests, one JSON object each: {"do": "configure", "id": N, "properties": {...}} and {"do": "forget", "id": N}
# get no answer; {"do": "sample", "id": N, "topics": [...], "group": "...", "now": T} gets exactly one.


def limit_memory(memory_bytes: int) -> None:
    """Cap the process's address space (before librdkafka is loaded)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def prefer_for_oom_kill() -> None:
    """Ask the kernel to kill this process first when the container runs out of memory (the operator then
    reports the reader's death like any other crash). Raising one's own score needs no privilege."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as score:
        score.write("1000")


def serve(connection: multiprocessing.connection.Connection) -> None:
    """The child's loop: a ``KafkaLagSource`` per configuration the parent sends, a sample per request, until
    the parent is gone. The properties come through the pipe, never the command line or the environment
    (``/proc`` shows those)."""
    from keyorder_operator.observe import KafkaLagSource

    sources: dict[int, KafkaLagSource] = {}
    try:
        while True:
            try:
                request = json.loads(connection.recv_bytes())
            except EOFError:  # the parent closed the pipe, or died
                return
            number = request["id"]
            if request["do"] == "configure":
                sources[number] = KafkaLagSource(request["properties"], timeout=CHILD_REQUEST_TIMEOUT)
                continue
            if request["do"] == "forget":
                forgotten = sources.pop(number, None)
                if forgotten is not None:
                    forgotten.close()
                continue
            try:
                source = sources.get(number)
                if source is None:
                    raise LagUnavailable(f"the lag reader was never sent configuration {number}")
                answer = sample_to_answer(source.sample(request["topics"], request["group"], request["now"]))
            except LagUnavailable as error:
                answer = {"unavailable": str(error), "reason": error.reason}
            except MemoryError:
                answer = {"unavailable": OUT_OF_MEMORY, "reason": OUT_OF_MEMORY}
            except Exception as error:  # reported to the parent, which names it in the condition
                answer = {"unavailable": f"reading the lag failed: {error!r}"}
            connection.send_bytes(json.dumps(answer).encode())
    finally:
        for source in sources.values():
            source.close()


def main(argv: Sequence[str]) -> None:
    """``python -m keyorder_operator.lag_reader FD MEMORY_BYTES LEVEL FORMAT``: serve the pipe ``FD`` under
    the limit, logging (to the stderr it shares with the operator) at the operator's level and in its format,
    so a ``--log-format json`` operator's stderr stays one JSON object per line. A parent that is gone ends the
    child quietly; anything else that ends it is logged in that format, not printed as a bare traceback."""
    limit_memory(int(argv[1]))
    prefer_for_oom_kill()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the operator's to handle; EOF ends us
    configure_logging(argv[2], argv[3])
    try:
        serve(multiprocessing.connection.Connection(int(argv[0])))
    except (BrokenPipeError, ConnectionResetError):  # the operator exited while we answered
        return
    except BaseException:
        logging.getLogger(__name__).exception("the lag reader process %d failed", os.getpid())
        raise SystemExit(1) from None


def operator_logging() -> tuple[str, str]:
    """The operator's root logging as ``(level, format)`` for a child: ``json`` when a root handler formats
    JSON (``--log-format json``), else ``text``."""
    root = logging.getLogger()
    json_lines = any(isinstance(handler.formatter, JsonFormatter) for handler in root.handlers)
    return logging.getLevelName(root.getEffectiveLevel()), "json" if json_lines else "text"


# --- the parent ------------------------------------------------------------------------------------------

FRAME_HEADER = struct.Struct("!i")
"""``multiprocessing.connection``'s frame header for payloads under 2 GiB (CPython
``Lib/multiprocessing/connection.py``, ``Connection._send_bytes`` / ``_recv_bytes``): a signed big-endian
32-bit length, then the bytes. The child speaks through a ``Connection``; the parent frames by hand."""

SEND_SECONDS = 5.0
"""How long the parent may wait to hand the child one request (a few hundred bytes; the child reads them)."""


def receive_frame(channel: socket.socket, limit: int, deadline: float) -> bytes:
    """One frame's payload from ``channel`` by ``deadline`` (``time.monotonic``), for the whole frame, not per
    read: ``TimeoutError`` past it, ``EOFError`` if the peer closed, ``OSError`` for a frame over ``limit``
    bytes (refused before it is read)."""
    (size,) = FRAME_HEADER.unpack(_receive_exactly(channel, FRAME_HEADER.size, deadline))
    if not 0 <= size <= limit:
        raise OSError(f"a frame of {size} bytes (limit {limit})")
    return _receive_exactly(channel, size, deadline)


def _receive_exactly(channel: socket.socket, size: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    left = size
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"{size - left} of {size} bytes by the deadline")
        channel.settimeout(remaining)
        try:
            chunk = channel.recv(min(left, 1 << 20))
        except TimeoutError:
            raise TimeoutError(f"{size - left} of {size} bytes by the deadline") from None
        if not chunk:
            raise EOFError(f"the peer closed after {size - left} of {size} bytes")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


class LagReaderProcess:
    """One live child (``python -m keyorder_operator.lag_reader``, a fresh interpreter that shares no thread,
    lock or memory with the operator) and its pipe; the parent's side, not thread-safe (``NamespaceLagReader``
    sends one request at a time). A subprocess rather than multiprocessing's ``spawn``, which would re-import
    the operator's main module in the child."""

    def __init__(self, memory_bytes: int) -> None:
        ours, theirs = socket.socketpair()
        environment = {**os.environ, "MALLOC_ARENA_MAX": "2"}  # fewer reserved arenas under RLIMIT_AS
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "keyorder_operator.lag_reader",
                    str(theirs.fileno()),
                    str(memory_bytes),
                    *operator_logging(),
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                env=environment,
                close_fds=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        self.socket = ours
        """The parent's end, in ``multiprocessing.connection``'s framing (what the child's ``Connection``
        reads and writes) but read here under a deadline: ``Connection.recv_bytes`` blocks with none once the
        first byte is there, and a child that stalls mid-answer would hold the resource's thread for good."""

    @property
    def pid(self) -> int:
        return self.process.pid

    def _send(self, request: Mapping[str, Any]) -> None:
        """One request frame; a child that stopped reading cannot hold the sender past ``SEND_SECONDS``."""
        payload = json.dumps(request).encode()
        self.socket.settimeout(SEND_SECONDS)
        self.socket.sendall(FRAME_HEADER.pack(len(payload)) + payload)

    def forget(self, numbers: Sequence[int]) -> None:
        """Tell the child to close these configurations' clients (raises ``OSError`` if it is gone)."""
        for number in numbers:
            self._send({"do": "forget", "id": number})

    def ask(
        self,
        number: int,
        topics: Sequence[str],
        group: str,
        now: float,
        deadline_seconds: float,
        properties: Mapping[str, str] | None = None,
        forget: Sequence[int] = (),
    ) -> LagSample | str:
        """Configuration ``number``'s sample (``LagUnavailable`` for the child's own answer that there is none),
        or how the child failed: it died, answered something that is not an answer, or did not answer in time
        (it is then killed). ``properties``: the configuration's, sent first if the child does not have them
        yet; ``forget``: configurations to close first."""
        try:
            self.forget(forget)
            if properties is not None:
                configure = {"do": "configure", "id": number, "properties": dict(properties)}
                self._send(configure)
            self._send({"do": "sample", "id": number, "topics": list(topics), "group": group, "now": now})
            answer = answer_to_sample(receive_frame(self.socket, MAX_ANSWER_BYTES, time.monotonic() + deadline_seconds))
            if answer is not None:
                return answer
            cause = "answered something that is not a lag sample and was killed"
        except TimeoutError:  # nothing, or only part of an answer, by the deadline
            cause = f"did not answer within {deadline_seconds:.2g} s and was killed"
        except (EOFError, OSError):  # the pipe closed (the child died), or an answer over MAX_ANSWER_BYTES
            try:
                self.process.wait(2.0)
                cause = exit_cause(self.process.returncode)
            except subprocess.TimeoutExpired:
                cause = "broke off its answer and was killed"
        self.kill()
        return cause

    def kill(self) -> None:
        """End the child now (it keeps nothing worth a graceful stop: the kernel closes its connections)."""
        with contextlib.suppress(OSError):
            self.process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5.0)
        self.socket.close()


@dataclass
class Configuration:
    """One distinct Kafka configuration of a namespace's resources: its properties and how many resources use it."""

    key: tuple[tuple[str, str], ...]
    properties: dict[str, str]
    users: int = 0


class NamespaceLagReader:
    """One namespace's reader child and the Kafka configurations its resources use (see the module docstring).

    The child is started at the first sample and kept while it answers; after a failure the next one starts
    once the namespace's ``RestartBackoff`` allows. Requests go one at a time (``_turn``); a resource waits for
    its turn at most what is left of its deadline. ``clock`` is the monotonic clock the restart back-off
    counts on (the poll's ``now`` is wall-clock time, which may jump); the deadline is waited on the real
    monotonic clock, since it bounds real waits on a pipe and a lock.
    """

    def __init__(
        self,
        namespace: str,
        deadline_seconds: float = DEADLINE_SECONDS,
        memory_bytes: int = MEMORY_BYTES,
        backoff: RestartBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_reader: Callable[[int], LagReaderProcess] = LagReaderProcess,
    ) -> None:
        self.namespace = namespace
        self.deadline_seconds, self.memory_bytes = deadline_seconds, memory_bytes
        self.backoff = backoff or RestartBackoff()
        self._clock = clock
        self._start_reader = start_reader
        self._configurations: dict[int, Configuration] = {}
        self._numbers: dict[tuple[tuple[str, str], ...], int] = {}
        self._next_number = itertools.count(1)
        self._reader: LagReaderProcess | None = None
        self._sent: set[int] = set()
        """Configurations the live child holds."""
        self._released: set[int] = set()
        """Configurations no resource uses any more that the live child still holds (closed at the next request)."""
        self._closed = False
        self._turn = threading.Lock()
        """One request to the child at a time."""
        self._state = threading.Lock()
        """Guards the fields above, never held while waiting: ``close`` does not wait for a sample."""
        self.started = 0
        """Readers started so far (for tests and measurements)."""

    @property
    def pid(self) -> int | None:
        """The live child's process id (None before the first sample, after a failure and after ``close``)."""
        with self._state:
            return self._reader.pid if self._reader is not None else None

    @property
    def configurations(self) -> int:
        """Distinct configurations in use."""
        with self._state:
            return len(self._configurations)

    def register(self, properties: Mapping[str, str]) -> int:
        """One more resource uses ``properties``: the configuration's number (the same for the same properties)."""
        key = tuple(sorted(properties.items()))
        with self._state:
            number = self._numbers.get(key)
            if number is None:
                number = self._numbers[key] = next(self._next_number)
                self._configurations[number] = Configuration(key, dict(properties))
            self._configurations[number].users += 1
            return number

    def release(self, number: int) -> int:
        """One resource fewer uses configuration ``number`` (the last one closes it); returns the configurations
        left. The child is told at once if it is idle, else with the next request."""
        with self._state:
            configuration = self._configurations.get(number)
            if configuration is not None:
                configuration.users -= 1
                if configuration.users <= 0:
                    del self._configurations[number], self._numbers[configuration.key]
                    if number in self._sent:
                        self._released.add(number)
            left = len(self._configurations)
        if left and self._turn.acquire(blocking=False):
            try:
                reader, released = self._take_released()
                if reader is not None and released:
                    with contextlib.suppress(OSError):  # the child is gone: the next sample says how it ended
                        reader.forget(released)
            finally:
                self._turn.release()
        return left

    def _take_released(self) -> tuple[LagReaderProcess | None, list[int]]:
        """The live child and the configurations to close in it, no longer counted as sent (the turn is held)."""
        with self._state:
            released = sorted(self._released & self._sent)
            self._released.clear()
            self._sent.difference_update(released)
            return self._reader, released

    def _busy(self) -> LagUnavailable:
        why = (
            f"the lag reader process of namespace {self.namespace} was busy with other resources' requests for "
            f"this resource's whole {self.deadline_seconds:g} s deadline"
        )
        return LagUnavailable(why, condition=READER_FAILED)

    def sample(self, number: int, topics: Sequence[str], group: str, now: float) -> LagSample:
        """Configuration ``number``'s sample; ``LagUnavailable`` (``LagReaderFailed`` when the child failed, was
        busy for the whole deadline or is backing off)."""
        asked = time.monotonic()
        if not self._turn.acquire(timeout=self.deadline_seconds):
            raise self._busy()
        try:
            with self._state:
                if self._closed or number not in self._configurations:
                    raise LagUnavailable(CLOSED)
            moment = self._clock()
            if self.backoff.waiting(moment) > 0:
                raise reader_failure(self.backoff.cause, self.backoff, moment)
            remaining = self.deadline_seconds - (time.monotonic() - asked)
            if remaining <= 0:
                raise self._busy()
            reader = self._running_reader()
            _, released = self._take_released()
            with self._state:
                configuration = self._configurations.get(number)
                if configuration is None:
                    raise LagUnavailable(CLOSED)
                properties = None if number in self._sent else configuration.properties
                self._sent.add(number)
            try:
                answer = reader.ask(number, topics, group, now, remaining, properties, released)
            except LagUnavailable:  # the child's own answer: it works
                self.backoff = self.backoff.succeeded()
                raise
            if isinstance(answer, str):
                with self._state:
                    closed = self._closed
                    if self._reader is reader:
                        self._reader = None
                        self._sent.clear()
                        self._released.clear()
                if closed:  # killed by ``close``: not the tenant's broker's doing
                    raise LagUnavailable(CLOSED)
                moment = self._clock()
                self.backoff = self.backoff.failed(answer, moment)
                raise reader_failure(answer, self.backoff, moment)
            self.backoff = self.backoff.succeeded()
            return answer
        finally:
            self._turn.release()

    def _running_reader(self) -> LagReaderProcess:
        """The live child, started if there is none (the turn is held)."""
        with self._state:
            if self._closed:
                raise LagUnavailable(CLOSED)
            if self._reader is not None:
                return self._reader
        try:
            reader = self._start_reader(self.memory_bytes)
        except OSError as error:  # no process could be started: a failure like a crash
            moment = self._clock()
            self.backoff = self.backoff.failed(f"could not be started: {error}", moment)
            raise reader_failure(self.backoff.cause, self.backoff, moment) from None
        self.started += 1
        with self._state:
            if not self._closed:
                self._reader = reader
                self._sent.clear()
                self._released.clear()
                return reader
        reader.kill()
        raise LagUnavailable(CLOSED)

    def close(self) -> None:
        """Stop the child (a sample waiting on it ends at once); the namespace has no resource left."""
        with self._state:
            self._closed = True
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.kill()


class IsolatedLagSource:
    """A resource's ``LagSource``: its Kafka configuration in its namespace's reader (``LagReaders.source``).
    ``close`` gives the configuration back (the last resource of a namespace stops its child)."""

    def __init__(
        self,
        reader: NamespaceLagReader,
        configuration: int,
        release: Callable[[NamespaceLagReader, int], None],
    ) -> None:
        self.reader, self.configuration = reader, configuration
        self._release = release
        self._lock = threading.Lock()
        self._closed = False

    @property
    def started(self) -> int:
        """Readers the namespace started so far."""
        return self.reader.started

    @property
    def backoff(self) -> RestartBackoff:
        """The namespace's restart back-off."""
        return self.reader.backoff

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        with self._lock:
            if self._closed:
                raise LagUnavailable(CLOSED)
        return self.reader.sample(self.configuration, topics, group, now)

    def close(self) -> None:
        with self._lock:
            closed, self._closed = self._closed, True
        if not closed:
            self._release(self.reader, self.configuration)


class LagReaders:
    """The operator's lag readers: one ``NamespaceLagReader`` (one child) per namespace and Kafka cluster
    (``bootstrap.servers``) with resources, built at the first such resource and stopped with its last. Per
    cluster too, because a child serves its requests one at a time: a tenant's unreachable cluster, whose
    samples each wait out the client's timeouts, must not hold up the same tenant's resources on a healthy one
    (``test_resources_on_an_unreachable_kafka_do_not_hold_up_a_healthy_one``). Thread-safe."""

    def __init__(
        self,
        deadline_seconds: float = DEADLINE_SECONDS,
        memory_bytes: int = MEMORY_BYTES,
        backoff: RestartBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_reader: Callable[[int], LagReaderProcess] = LagReaderProcess,
    ) -> None:
        self.deadline_seconds, self.memory_bytes = deadline_seconds, memory_bytes
        self.backoff = backoff or RestartBackoff()
        """Each namespace's back-off starts from this one (its periods; no failures)."""
        self._clock = clock
        self._start_reader = start_reader
        self._lock = threading.Lock()
        self._namespaces: dict[tuple[str, str], NamespaceLagReader] = {}
        self._closed = False

    def source(self, namespace: str, properties: Mapping[str, str]) -> IsolatedLagSource:
        """A resource's lag source for ``properties`` in ``namespace``'s reader; close it when the resource is
        deleted or its configuration changes. After ``close`` (the operator is stopping) the source is closed
        from the start: a poll still under way gets ``LagUnavailable`` instead of starting a child that nothing
        would stop."""
        key = (namespace, properties.get("bootstrap.servers", ""))
        with self._lock:
            reader = self._namespaces.get(key)
            if reader is None:
                reader = NamespaceLagReader(
                    namespace,
                    self.deadline_seconds,
                    self.memory_bytes,
                    self.backoff.succeeded(),
                    self._clock,
                    self._start_reader,
                )
                if self._closed:
                    reader.close()
                else:
                    self._namespaces[key] = reader
            number = reader.register(properties)
        return IsolatedLagSource(reader, number, self._release)

    def _release(self, reader: NamespaceLagReader, number: int) -> None:
        with self._lock:
            left = reader.release(number)
            if not left:
                for key, known in list(self._namespaces.items()):
                    if known is reader:
                        del self._namespaces[key]
        if not left:
            reader.close()

    def reader(self, namespace: str) -> NamespaceLagReader | None:
        """The namespace's first reader (None: no resource of it has a lag source)."""
        with self._lock:
            return next((reader for (name, _), reader in self._namespaces.items() if name == namespace), None)

    def close(self) -> None:
        """Stop every child (the operator is stopping)."""
        with self._lock:
            self._closed = True
            readers, self._namespaces = list(self._namespaces.values()), {}
        for reader in readers:
            reader.close()

    def __len__(self) -> int:
        """Namespaces with a reader."""
        with self._lock:
            return len(self._namespaces)


if __name__ == "__main__":
    main(sys.argv[1:])
