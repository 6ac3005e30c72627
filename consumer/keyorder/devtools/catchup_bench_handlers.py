"""Handlers of ``keyorder catchup-bench``, importable by path so Spark's workers and a pod run the
very same code: ``cpu`` burns about a hundred microseconds of CPU, ``io`` waits 1 ms (a
downstream call), both per message."""

from __future__ import annotations

import time

from keyorder.message import Message

CPU_LOOP = 2_000
IO_SECONDS = 0.001


def cpu(message: Message) -> None:
    total = 0
    for number in range(CPU_LOOP):
        total += number * number


def io(message: Message) -> None:
    time.sleep(IO_SECONDS)
