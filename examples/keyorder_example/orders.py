"""Order lifecycle events: each order goes created -> paid -> shipped -> completed, in that order.

The message key is the order id; each event carries the order's sequence number (0..3). The
handler simulates a downstream call (uniformly ``KEYORDER_EXAMPLE_LATENCY_MIN_MS`` ..
``KEYORDER_EXAMPLE_LATENCY_MAX_MS``, default 5-20 ms) and, when ``KEYORDER_EXAMPLE_JOURNAL`` names
a file, appends ``order seq`` to it (one atomic ``write`` per event), so a run can be audited
afterwards: every event present, and each order's events handled in order. A long-lived key (a
hot account in ``keyorder dev --hot-key-share``) cycles through the statuses again; events
marked ``"poison": true`` (``keyorder dev --poison-key``) always fail.

Run it:  keyorder run --handler keyorder_example.orders:handle --topics orders --group-id fulfilment
"""

from __future__ import annotations

import os
import random
import time

from keyorder import Message

STATUSES = ("created", "paid", "shipped", "completed")
LOW = float(os.environ.get("KEYORDER_EXAMPLE_LATENCY_MIN_MS", "5")) / 1000.0
HIGH = float(os.environ.get("KEYORDER_EXAMPLE_LATENCY_MAX_MS", "20")) / 1000.0
_JOURNAL: list[int] = []


def _journal() -> int | None:
    path = os.environ.get("KEYORDER_EXAMPLE_JOURNAL")
    if not path:
        return None
    if not _JOURNAL:
        _JOURNAL.append(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600))
    return _JOURNAL[0]


def handle(message: Message) -> None:
    event = message.json()
    if event["status"] != STATUSES[event["seq"] % len(STATUSES)]:
        raise ValueError(f"order {event['order']}: event {event['seq']} has status {event['status']!r}")
    time.sleep(random.uniform(LOW, HIGH))  # the downstream call (payment, warehouse, ...)
    if event.get("poison"):
        raise ValueError(f"order {event['order']}: event {event['seq']} is poison (the warehouse rejects it)")
    journal = _journal()
    if journal is not None:
        os.write(journal, f"{event['order']} {event['seq']}\n".encode())
