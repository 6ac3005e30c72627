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
            lines = file.read().splitlines()
    except FileNotFoundError:
        return []
    return [
        (key, int(seq), int(partition), int(offset)) for key, seq, partition, offset in (line.split() for line in lines)
    ]
