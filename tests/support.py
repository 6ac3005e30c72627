"""Helpers every test directory shares: one wait, one commit check, one set of broker settings.

Why a module of its own: the suite had four wait loops, five copies of the producer setting that
makes the test broker report exact end offsets (now ``keyorder.devtools.loadgen``'s, which the
catch-up bench uses too), two ``free_port`` functions and three versions of the
"every message handled, the group's commits reached the end offsets" check. They live here once.

Waits poll an observable condition; their timeouts are hang guards, never performance assertions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from confluent_kafka import Consumer, TopicPartition

from keyorder.devtools.embedded import free_port
from keyorder.devtools.loadgen import EXACT_END_OFFSETS

__all__ = ["EXACT_END_OFFSETS", "free_port", "group_committed", "wait_for", "wait_for_commits"]

T = TypeVar("T")


def wait_for(probe: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll ``probe`` until it returns something truthy (returned). ``timeout`` is a hang guard:
    AssertionError naming ``what`` and the last value after that many seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last value: {value!r}")
        time.sleep(interval)


def group_committed(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets as the broker reports them (not the pod's view)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        found = reader.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in found if tp.offset >= 0}
    finally:
        reader.close()


def wait_for_commits(
    bootstrap: str, group: str, topic: str, end_offsets: Mapping[int, int], timeout: float = 60
) -> None:
    """Until the group's commits on ``topic``, as the broker reports them, equal ``end_offsets`` (every
    partition in it; a partition never produced to is absent from both)."""
    partitions = max(end_offsets, default=-1) + 1
    wait_for(
        lambda: group_committed(bootstrap, group, topic, partitions) == dict(end_offsets),
        timeout,
        f"group {group}'s commits on {topic} to reach the end offsets {dict(end_offsets)}",
        interval=0.3,
    )
