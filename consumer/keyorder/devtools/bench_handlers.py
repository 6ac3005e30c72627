"""Handlers of ``keyorder bench``'s executor runs, importable by path so worker processes load them.

A process executor's handler runs in other processes, so the bench's in-process order check cannot
see it. These handlers note ``(key, seq, started)`` per message in memory instead, and the
tear-down hook (``save``) writes them to ``$KEYORDER_BENCH_RECORDS_DIR/<pid>.txt`` once the pool
stops; the bench merges the files of every process by start time and checks each key's sequence
(``order_violations``). A key's calls never overlap, so start times order them. The thread runs
of the same comparison use the same handlers and hooks.

``cpu`` burns about 175 µs of CPU (the bench's ``CPU_LOOP``); ``sleep`` waits
``$KEYORDER_BENCH_LATENCY_SECONDS`` (an IO-bound call). ``sink`` and ``sink_batch`` are a fast sink
with a bulk form (issue 40): a call costs ``SINK_CALL_SECONDS`` (slept: a round trip to a database)
plus ``SINK_MESSAGE_SECONDS`` of CPU per message in it (building each row), so one call of 100
messages costs about what two single calls do. A batch's messages all note the call's start: they
are of different keys (a batch holds one message per key), and a key's calls never overlap. The sink's
notes keep the raw value and ``save`` parses it: its cost is the call and its 3 µs a message, and the
order check's parse (1.5 to 4 µs a message on the bench's machine) would add as much again to every
message of a call, on the pod's core with threads. The no-op handlers parse in the call: parsing and
recording is what they model.
"""

from __future__ import annotations

import json
import operator
import os
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from keyorder.message import Message

CPU_LOOP = 2_000
RECORDS_DIR_VARIABLE = "KEYORDER_BENCH_RECORDS_DIR"
LATENCY_VARIABLE = "KEYORDER_BENCH_LATENCY_SECONDS"
SINK_CALL_SECONDS = 0.0003
"""A sink call's fixed cost (a round trip), slept so the GIL is free meanwhile."""
SINK_MESSAGE_SECONDS = 0.000003
"""A sink's cost per message of a call (building its row), spent on the CPU, holding the GIL."""

_records: list[tuple[bytes, int, float, int]] = []  # list.append is atomic: thread workers share it
_latency: list[float] = []


def _note(message: Message, started: float) -> None:
    _records.append((message.key or b"", json.loads(message.value or b"{}")["seq"], started, message.partition))


_raw_records: list[tuple[float, list[tuple[bytes | None, bytes | None, int]]]] = []
"""``(started, [(key, value, partition), ...])`` per call: the values kept whole, parsed by ``save`` after the run."""
_key_value_partition = operator.attrgetter("key", "value", "partition")


def _note_raw(messages: Sequence[Message], started: float) -> None:
    """``_note`` for every message of a call, the values kept whole: one append per call, the fields taken
    in C (``map`` of an ``attrgetter``), so the harness adds as little as it can to the sink's modelled cost."""
    _raw_records.append((started, list(map(_key_value_partition, messages))))


def cpu(message: Message) -> None:
    started = time.monotonic()
    total = 0
    for number in range(CPU_LOOP):
        total += number * number
    _note(message, started)


def sleep(message: Message) -> None:
    started = time.monotonic()
    if not _latency:
        _latency.append(float(os.environ.get(LATENCY_VARIABLE, "0.01")))
    time.sleep(_latency[0])
    _note(message, started)


def spin(seconds: float) -> None:
    """Busy for ``seconds`` of wall time on this thread (CPU work that holds the GIL, as building rows does)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sink_call(messages: int) -> None:
    """One sink call carrying ``messages`` messages: the round trip, then each message's CPU."""
    time.sleep(SINK_CALL_SECONDS)
    spin(SINK_MESSAGE_SECONDS * messages)


def sink(message: Message) -> None:
    started = time.monotonic()
    sink_call(1)
    _note_raw((message,), started)


def sink_batch(messages: Sequence[Message]) -> None:
    started = time.monotonic()
    sink_call(len(messages))
    _note_raw(messages, started)


def save() -> None:
    """The tear-down hook: this process's records, one ``key-hex seq started partition`` line each."""
    directory = Path(os.environ[RECORDS_DIR_VARIABLE])
    _records.extend(
        (key or b"", json.loads(value or b"{}")["seq"], started, partition)
        for started, noted in _raw_records
        for key, value, partition in noted
    )
    _raw_records.clear()
    lines = [f"{key.hex()} {seq} {started!r} {partition}" for key, seq, started, partition in _records]
    (directory / f"{os.getpid()}-{time.monotonic_ns()}.txt").write_text("\n".join(lines) + "\n")
    _records.clear()


def order_violations(directory: Path) -> tuple[int, int]:
    """``(violations, records)`` over every file in ``directory``: each key's sequence numbers, in
    the order their calls started, must be 0, 1, 2, ... (the pool stopped mid-backlog, so a key's
    last numbers may be missing, but never one in the middle)."""
    records: list[tuple[float, str, int]] = []
    for path in directory.glob("*.txt"):
        records.extend(_parse(path.read_text().splitlines()))
    records.sort()
    expected: dict[str, int] = {}
    violations = 0
    for _started, key, seq in records:
        if seq != expected.get(key, 0):
            violations += 1
        expected[key] = seq + 1
    return violations, len(records)


def _parse(lines: Iterable[str]) -> Iterable[tuple[float, str, int]]:
    for started, key, seq, _partition in read_records(lines):
        yield started, key, seq


def read_records(lines: Iterable[str]) -> Iterable[tuple[float, str, int, int]]:
    """``(started, key-hex, seq, partition)`` per line ``save`` wrote."""
    for line in lines:
        if line:
            key, seq, started, partition = line.split()
            yield float(started), key, int(seq), int(partition)


def noop(message: Message) -> None:
    _note(message, time.monotonic())


def noop_batch(messages: Sequence[Message]) -> None:
    """The no-op's work for each message of a batch (``tools/ceiling_probe.py pod --batch``)."""
    started = time.monotonic()
    for message in messages:
        _note(message, started)


def forget() -> None:
    """Drop this process's records (the bench's own micro-measurements keep none)."""
    _records.clear()
    _raw_records.clear()
