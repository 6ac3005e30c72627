"""Reusable test oracles for keyorder's guarantees, shared by unit, integration and demo checks.

Records are ``(key, seq)`` pairs in the order the handler *started* (or finished) them; each
message carries its key's sequence number, so order is checked per key, not by counting.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter
from collections.abc import Iterable, Mapping


def assert_key_order(records: Iterable[tuple[str, int]]) -> None:
    """Exactly-once in order: each key's sequence numbers appear as 0, 1, 2, ... with no repeat."""
    expected: dict[str, int] = {}
    for key, seq in records:
        want = expected.get(key, 0)
        assert seq == want, f"key {key}: got seq {seq}, expected {want} (out of order, duplicate or gap)"
        expected[key] = want + 1


def assert_first_processing_in_order(records: Iterable[tuple[str, int]]) -> None:
    """At-least-once in order: ignoring re-deliveries, each key's first processings are 0, 1, 2, ..."""
    seen: dict[str, int] = {}
    for key, seq in records:
        done = seen.get(key, 0)
        if seq < done:
            continue  # a re-delivery of something already processed
        assert seq == done, f"key {key}: first processing of seq {seq} before seq {done}"
        seen[key] = done + 1


def assert_at_least_once(records: Iterable[tuple[str, int]], expected: Mapping[str, int]) -> int:
    """Every ``(key, seq < expected[key])`` was processed; nothing unexpected was. Returns duplicates."""
    counts = Counter(records)
    missing = [(key, seq) for key, total in expected.items() for seq in range(total) if (key, seq) not in counts]
    assert not missing, f"{len(missing)} messages never processed, e.g. {missing[:5]}"
    unexpected = [item for item in counts if item[1] >= expected.get(item[0], 0)]
    assert not unexpected, f"processed messages that were never produced: {unexpected[:5]}"
    return sum(counts.values()) - len(counts)


class SerialPerKey:
    """Handler wrapper state: flags two concurrent calls for the same key, tracks peak concurrency."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._active_keys: set[str] = set()
        self.active = 0
        self.peak = 0
        self.violations = 0

    def enter(self, key: str) -> None:
        with self._lock:
            if key in self._active_keys:
                self.violations += 1
            self._active_keys.add(key)
            self.active += 1
            self.peak = max(self.peak, self.active)

    def leave(self, key: str) -> None:
        with self._lock:
            self._active_keys.discard(key)
            self.active -= 1

    def assert_serial(self) -> None:
        assert self.violations == 0, f"{self.violations} times a key ran on two workers at once"


def assert_serial_in_order_per_key(runs: Iterable[tuple[str, int, float, float]]) -> None:
    """Handler runs ``(key, seq, start, end)`` seen from outside (other processes included): each key's runs
    follow its sequence order and never overlap (a run starts only after the previous one ended)."""
    by_key: dict[str, list[tuple[float, float, int]]] = {}
    for key, seq, start, end in runs:
        by_key.setdefault(key, []).append((start, end, seq))
    for key, spans in by_key.items():
        spans.sort()
        for (_start, end, seq), (next_start, _next_end, next_seq) in itertools.pairwise(spans):
            assert next_seq > seq, f"key {key}: seq {next_seq} started after seq {seq} (out of order)"
            assert next_start >= end, f"key {key}: seq {next_seq} started before seq {seq} ended (overlap)"
