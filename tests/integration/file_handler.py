"""Handler for subprocess tests: appends ``key seq partition offset`` lines to a file.

One ``os.write`` per line on an O_APPEND descriptor: a line is either fully in the file or absent,
even when the process is killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import time

from keyorder import Message

_SLEEP = float(os.environ.get("KEYORDER_TEST_SLEEP", "0"))
_FD: list[int] = []


def _record_fd() -> int:
    if not _FD:
        _FD.append(os.open(os.environ["KEYORDER_TEST_RECORD_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
    return _FD[0]


def handle(message: Message) -> None:
    event = json.loads(message.value)
    if _SLEEP:
        time.sleep(_SLEEP)
    os.write(_record_fd(), f"{event['key']} {event['seq']} {message.partition} {message.offset}\n".encode())


def read_records(path: str) -> list[tuple[str, int, int, int]]:
    try:
        with open(path) as file:
            text = file.read()
    except FileNotFoundError:
        return []
    # only whole lines: a read may catch a write half done (or a kill -9 may have cut one short), and
    # such a record is not there yet (the message is handled again after a crash)
    lines = text.split("\n")[:-1]
    return [
        (key, int(seq), int(partition), int(offset)) for key, seq, partition, offset in (line.split() for line in lines)
    ]


def handle_timed(message: Message) -> None:
    """Like ``handle``, plus the process id and when the call started and ended (monotonic seconds);
    the message of key ``KEYORDER_TEST_STALL_KEY`` with seq 0 first stalls for a minute, once (a
    marker file next to the record file holds the stalling process id)."""
    started = time.monotonic()
    event = json.loads(message.value)
    if event["key"] == os.environ.get("KEYORDER_TEST_STALL_KEY") and event["seq"] == 0:
        marker = os.environ["KEYORDER_TEST_RECORD_FILE"] + ".stalled"
        if not os.path.exists(marker):
            with open(marker + ".tmp", "w") as file:
                file.write(str(os.getpid()))
            os.rename(marker + ".tmp", marker)
            time.sleep(60)
    if event["key"] == os.environ.get("KEYORDER_TEST_POISON_KEY"):
        raise ValueError(f"poison {event['key']}/{event['seq']}")
    if _SLEEP:
        time.sleep(_SLEEP)
    where = f"{message.partition} {message.offset} {os.getpid()}"
    os.write(_record_fd(), f"{event['key']} {event['seq']} {where} {started!r} {time.monotonic()!r}\n".encode())


def read_timed(path: str) -> list[tuple[str, int, int, int, int, float, float]]:
    """``(key, seq, partition, offset, pid, start, end)`` of every run ``handle_timed`` completed."""
    try:
        with open(path) as file:
            lines = file.read().split("\n")[:-1]  # only whole lines (see read_records)
    except FileNotFoundError:
        return []
    return [
        (key, int(seq), int(partition), int(offset), int(pid), float(start), float(end))
        for key, seq, partition, offset, pid, start, end in (line.split() for line in lines)
    ]
