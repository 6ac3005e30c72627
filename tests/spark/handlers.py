"""Handlers for the Spark catch-up tests; they run in Spark's Python workers, not in pytest.

Each handled message appends ``key seq partition offset attempt`` to ``<dir>/<topic>.txt`` (one
``os.write`` on an O_APPEND descriptor per line, so lines from several workers never interleave).
``<dir>`` comes from ``KEYORDER_TEST_RECORD_DIR``, set before the Spark session starts. A value
with ``"fail_first": n`` fails its first n attempts; ``"poison": true`` fails every attempt;
``"crash_once": true`` kills the Python worker running it, once per topic (a marker file says it
happened), so its Spark task fails as after an OOM kill: a transient fault the job retries.
``slow_record`` sleeps ``KEYORDER_TEST_HANDLER_SECONDS`` before recording (a run long enough to stop).
"""

from __future__ import annotations

import json
import os
import time

from keyorder import Message

_ATTEMPTS: dict[tuple[str, int, int], int] = {}


def record(message: Message) -> None:
    event = json.loads(message.value)
    where = (message.topic, message.partition, message.offset)
    attempt = _ATTEMPTS[where] = _ATTEMPTS.get(where, 0) + 1
    if event.get("poison") or attempt <= event.get("fail_first", 0):
        raise RuntimeError(f"test failure of {event['key']}#{event['seq']} on attempt {attempt}")
    if event.get("crash_once"):
        marker = os.path.join(os.environ["KEYORDER_TEST_RECORD_DIR"], f"{message.topic}.crashed")
        try:
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        except FileExistsError:
            pass  # crashed once already: handle it this time
        else:
            os._exit(1)  # the whole Python worker, mid-task, as the kernel's OOM killer would
    line = f"{event['key']} {event['seq']} {message.partition} {message.offset} {attempt}\n"
    path = os.path.join(os.environ["KEYORDER_TEST_RECORD_DIR"], f"{message.topic}.txt")
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(descriptor, line.encode())
    finally:
        os.close(descriptor)


def slow_record(message: Message) -> None:
    """``record`` after a sleep: a message whose handler was killed during the sleep is not recorded."""
    time.sleep(float(os.environ.get("KEYORDER_TEST_HANDLER_SECONDS", "0.1")))
    record(message)


def read_records(directory: str, topic: str) -> list[tuple[str, int, int, int, int]]:
    try:
        with open(os.path.join(directory, f"{topic}.txt")) as file:
            lines = file.read().splitlines()
    except FileNotFoundError:
        return []
    return [
        (key, int(seq), int(partition), int(offset), int(attempt))
        for key, seq, partition, offset, attempt in (line.split() for line in lines)
    ]
