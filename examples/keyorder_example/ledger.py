"""An account ledger: the classic reason for key ordering.

Each message is an event for one account (the message key) carrying that account's sequence
number. Events of one account must be applied in sequence; events of different accounts are
independent. The handler simulates a downstream call (``KEYORDER_EXAMPLE_LATENCY_MS``, default
5 ms) and records any event that arrives out of sequence, so a run can prove the guarantee.
Events of the account ``KEYORDER_EXAMPLE_POISON_KEY`` (if set) always fail.

Run it:  keyorder run --handler keyorder_example.ledger:handle --topics payments --group-id ledger
Async:   keyorder run --handler keyorder_example.ledger:handle_async ...
"""

from __future__ import annotations

import asyncio
import os
import threading
import time

from keyorder import Message

LATENCY = float(os.environ.get("KEYORDER_EXAMPLE_LATENCY_MS", "5")) / 1000.0
POISON_KEY = os.environ.get("KEYORDER_EXAMPLE_POISON_KEY")
"""Events of this account always fail (to see retries, dead letters or a blocked key)."""


class Ledger:
    """Applied sequence numbers per account; thread-safe (one lock, held for microseconds)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.next_sequence: dict[str, int] = {}
        self.applied = 0
        self.duplicates = 0
        self.out_of_order = 0

    def apply(self, account: str, sequence: int) -> None:
        with self._lock:
            expected = self.next_sequence.get(account, 0)
            if sequence == expected:
                self.next_sequence[account] = sequence + 1
                self.applied += 1
            elif sequence < expected:
                self.duplicates += 1  # a re-delivery after a crash: already applied, idempotent skip
            else:
                self.out_of_order += 1  # a gap: an earlier event of this account was not applied yet


LEDGER = Ledger()


def handle(message: Message) -> None:
    event = message.json()
    time.sleep(LATENCY)  # the downstream call, e.g. a payment API
    _refuse_poison(event)
    LEDGER.apply(event["key"], event["seq"])


async def handle_async(message: Message) -> None:
    event = message.json()
    await asyncio.sleep(LATENCY)
    _refuse_poison(event)
    LEDGER.apply(event["key"], event["seq"])


def _refuse_poison(event: dict) -> None:
    if POISON_KEY is not None and event["key"] == POISON_KEY:
        raise ValueError(f"account {event['key']}: event {event['seq']} rejected (KEYORDER_EXAMPLE_POISON_KEY)")
