"""Each resource's Kafka reads in a child process of its own, so a tenant's broker cannot take the operator down.

The operator reads every OrderedConsumer's lag with librdkafka, from the brokers the tenant names
(``spec.kafka.bootstrapServers``) with the tenant's properties. librdkafka parses what those brokers answer
in C, and some answers abort it: an ApiVersions response whose array count is the compact encoding of -1
(21 bytes in all) makes ``rd_kafka_handle_ApiVersion`` (librdkafka ``src/rdkafka_request.c``) call
``rd_malloc(sizeof(**apis) * ApiArrayCnt)`` with a negative count, which ``rd_malloc`` (``src/rd.h``) asserts
non-NULL: SIGABRT. ``rd_kafka_buf_read_arraycnt`` (``src/rdkafka_buf.h``) lets -1 through. Inside the
operator's process that is every tenant's autoscaling gone, on every restart (a crash loop).

So a resource's ``sample`` runs in a child process (``LagReaderProcess``: a fresh interpreter that shares no
threads, locks or memory with the operator), which keeps one ``observe.KafkaLagSource`` between
samples. The parent sends a request and waits at most ``deadline_seconds`` for the answer; the child runs
under an address-space limit (``RLIMIT_AS``). A child that dies (signal, exit code, out of memory) or does
not answer in time is killed; the resource's sample fails with a ``LagUnavailable`` whose condition reason is
``LagReaderFailed`` and whose message names the exit code or signal and when the reader is started again.
Restarts back off (``RestartBackoff``, pure, time as a parameter): a broker that crashes every reader costs
one process start per back-off period, not one per poll. Every other resource has its own child and goes on
being polled on time.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing.connection
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from keyorder_operator.observe import LagSample, LagUnavailable

READER_FAILED = "LagReaderFailed"
"""The LagUnknown condition's reason when the reader process crashed, hung or ran out of memory."""

DEADLINE_SECONDS = 30.0
"""A sample's overall deadline: the child's client waits up to 5 s per request and a sample makes up to four
in a row (topics, committed offsets, end offsets, start offsets), plus the child's start (about 0.5 s)."""

MEMORY_BYTES = 1 << 30
"""The child's address-space limit (``RLIMIT_AS``): an idle client reserves about 190 MB of address space
(interpreter, librdkafka's thread stacks and malloc arenas; measured ``VmPeak``), of which about 35 MB is
resident, so this bounds a runaway allocation, not the ordinary client."""

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
    """When a resource's reader may be started again after failures (pure: time is a parameter).

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


def limit_memory(memory_bytes: int) -> None:
    """Cap the process's address space (before librdkafka is loaded)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))


def serve(connection: multiprocessing.connection.Connection) -> None:
    """The child's loop: the properties first, then a sample per request, until the parent is gone.
    The properties come through the pipe, never the command line or the environment (``/proc`` shows those)."""
    from keyorder_operator.observe import KafkaLagSource

    source = KafkaLagSource(json.loads(connection.recv_bytes()), timeout=CHILD_REQUEST_TIMEOUT)
    try:
        while True:
            try:
                request = json.loads(connection.recv_bytes())
            except EOFError:  # the parent closed the pipe, or died
                return
            topics, group, now = request["topics"], request["group"], request["now"]
            try:
                answer = sample_to_answer(source.sample(topics, group, now))
            except LagUnavailable as error:
                answer = {"unavailable": str(error), "reason": error.reason}
            except MemoryError:
                answer = {"unavailable": OUT_OF_MEMORY, "reason": OUT_OF_MEMORY}
            except Exception as error:  # reported to the parent, which names it in the condition
                answer = {"unavailable": f"reading the lag failed: {error!r}"}
            connection.send_bytes(json.dumps(answer).encode())
    finally:
        source.close()


def main(argv: Sequence[str]) -> None:
    """``python -m keyorder_operator.lag_reader FD MEMORY_BYTES``: serve the pipe ``FD`` under the limit."""
    limit_memory(int(argv[1]))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl-C is the operator's to handle; EOF ends us
    serve(multiprocessing.connection.Connection(int(argv[0])))


# --- the parent ------------------------------------------------------------------------------------------


class LagReaderProcess:
    """One live child (``python -m keyorder_operator.lag_reader``, a fresh interpreter that shares no thread,
    lock or memory with the operator) and its pipe; the parent's side, not thread-safe (``IsolatedLagSource``
    locks). A subprocess rather than multiprocessing's ``spawn``, which would re-import the operator's main
    module in the child."""

    def __init__(self, properties: Mapping[str, str], memory_bytes: int) -> None:
        ours, theirs = socket.socketpair()
        environment = {**os.environ, "MALLOC_ARENA_MAX": "2"}  # fewer reserved arenas under RLIMIT_AS
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "keyorder_operator.lag_reader", str(theirs.fileno()), str(memory_bytes)],
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
        self.connection = multiprocessing.connection.Connection(ours.detach())
        with contextlib.suppress(OSError):  # the child is already gone: the first ``ask`` reports how it ended
            self.connection.send_bytes(json.dumps(dict(properties)).encode())

    @property
    def pid(self) -> int:
        return self.process.pid

    def ask(self, topics: Sequence[str], group: str, now: float, deadline_seconds: float) -> LagSample | str:
        """The child's sample (``LagUnavailable`` for its own answer that there is none), or how it failed:
        it died, answered something that is not an answer, or did not answer in time (it is then killed)."""
        try:
            self.connection.send_bytes(json.dumps({"topics": list(topics), "group": group, "now": now}).encode())
            if self.connection.poll(deadline_seconds):
                answer = answer_to_sample(self.connection.recv_bytes(MAX_ANSWER_BYTES))
                if answer is not None:
                    return answer
                cause = "answered something that is not a lag sample and was killed"
            else:
                cause = f"did not answer within {deadline_seconds:g} s and was killed"
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
        self.connection.close()


class IsolatedLagSource:
    """A ``LagSource`` whose Kafka reads run in a child process of its own (see the module docstring).

    The child is started at the first ``sample`` and kept while it answers. ``clock`` is the monotonic clock
    the restart back-off counts on (the poll's ``now`` is wall-clock time, which may jump).
    """

    def __init__(
        self,
        properties: Mapping[str, str],
        deadline_seconds: float = DEADLINE_SECONDS,
        memory_bytes: int = MEMORY_BYTES,
        backoff: RestartBackoff | None = None,
        clock: Callable[[], float] = time.monotonic,
        start_reader: Callable[[Mapping[str, str], int], LagReaderProcess] = LagReaderProcess,
    ) -> None:
        self._properties = dict(properties)
        self.deadline_seconds, self.memory_bytes = deadline_seconds, memory_bytes
        self.backoff = backoff or RestartBackoff()
        self._clock = clock
        self._start_reader = start_reader
        self._reader: LagReaderProcess | None = None
        self._closed = False
        self._sampling = threading.Lock()
        """One sample at a time (``BoundedLagSource`` asks one at a time anyway)."""
        self._state = threading.Lock()
        """Guards ``_reader`` and ``_closed``, never held while waiting: ``close`` does not wait for a sample."""
        self.started = 0
        """Readers started so far (for tests and measurements)."""

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        with self._sampling:
            moment = self._clock()
            if self.backoff.waiting(moment) > 0:
                raise reader_failure(self.backoff.cause, self.backoff, moment)
            reader = self._running_reader()
            try:
                answer = reader.ask(topics, group, now, self.deadline_seconds)
            except LagUnavailable:  # the child's own answer: it works
                self.backoff = self.backoff.succeeded()
                raise
            if isinstance(answer, str):
                with self._state:
                    closed = self._closed
                    if self._reader is reader:
                        self._reader = None
                if closed:  # killed by ``close``: not the tenant's broker's doing
                    raise LagUnavailable(CLOSED)
                return self._failed(answer)
            self.backoff = self.backoff.succeeded()
            return answer

    def _running_reader(self) -> LagReaderProcess:
        """The live child, started if there is none (the sampling lock is held)."""
        with self._state:
            if self._closed:
                raise LagUnavailable(CLOSED)
            if self._reader is not None:
                return self._reader
        try:
            reader = self._start_reader(self._properties, self.memory_bytes)
        except OSError as error:  # no process could be started: a failure like a crash
            self._failed(f"could not be started: {error}")
        self.started += 1
        with self._state:
            if not self._closed:
                self._reader = reader
                return reader
        reader.kill()
        raise LagUnavailable(CLOSED)

    def _failed(self, cause: str) -> NoReturn:
        moment = self._clock()
        self.backoff = self.backoff.failed(cause, moment)
        raise reader_failure(cause, self.backoff, moment)

    def close(self) -> None:
        """Stop the child (a sample waiting on it ends at once)."""
        with self._state:
            self._closed = True
            reader, self._reader = self._reader, None
        if reader is not None:
            reader.kill()


if __name__ == "__main__":
    main(sys.argv[1:])
