"""``handle(message)``: apply a payment event to its account, exactly once per sequence number.

Each message is ``{"sequence": n, "amount": cents}`` keyed by the account id. keyorder delivers an
account's events in order, but at least once: after a crash the events since the last commit come
again, so the handler skips sequence numbers it has already applied (idempotence). A real handler
keeps ``applied`` next to the balance in its database, in one transaction.
"""

from __future__ import annotations

import threading

from keyorder import Message

balances: dict[str, int] = {}
applied: dict[str, int] = {}
_lock = threading.Lock()  # workers of different accounts run on different threads


def handle(message: Message) -> None:
    if message.key is None:
        raise ValueError(f"payment without an account key at {message.topic}/{message.partition}@{message.offset}")
    account = message.key.decode()
    event = message.json()
    sequence, amount = int(event["sequence"]), int(event["amount"])
    with _lock:
        if sequence <= applied.get(account, 0):
            return  # re-delivered after a restart or rebalance: already applied
        if sequence != applied.get(account, 0) + 1:
            raise RuntimeError(f"account {account}: sequence {sequence} after {applied.get(account, 0)}")
        balances[account] = balances.get(account, 0) + amount
        applied[account] = sequence
