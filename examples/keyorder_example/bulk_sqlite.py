"""A bulk sink: a batch handler that writes a batch of account events to SQLite in one transaction.

Why it exists: a sink's per-call cost (a round trip, a transaction's commit) is the same for one row
as for a hundred, so a fast sink handled one message at a time stops at the pod's per-message ceiling
(docs/performance.md). With ``--batch-max-messages`` above 1 keyorder calls ``handle_batch`` with the
heads of up to that many ready keys, at most one message per key, and this handler applies them with
one ``executemany`` inside one transaction.

Each message is an event of one account (the message key) whose JSON value carries an ``amount`` in
cents; the ``accounts`` table keeps each account's balance, how many events made it, and the
partition and offset of the last event applied.

**Idempotent under redelivery.** keyorder delivers at least once: after a crash, a rebalance or a
retry of a batch that failed as a whole, messages since the last commit come again. Adding an amount
is not idempotent by itself, so each row keeps the offset of the last event applied to it, and the
upsert changes a row only for an event of a higher offset: a redelivered event (same offset) and an
out-of-date one (lower offset) leave the row as it is. A key's events all come from one partition, in
offset order, so its offsets only grow. Two partitions' offsets cannot be compared, so an account's event
from another partition than its last one (the topic's partition count was raised, which moves keys, or a
producer's own partitioner) fails instead of being skipped or applied: it is retried, then dead-lettered or
blocked, for an operator to decide. For the same reason the example reads one topic, and needs key (or
partition) ordering: under ``--ordering unordered`` an account's newer event may run first, and its older
one would then be skipped as out of date.

**Failures.** An event that cannot be applied (no key, a value that is not JSON, no integer ``amount``
within 64 bits) fails alone: the handler returns one outcome per message, that event's error among
``None``s, and keyorder retries it (then dead-letters or blocks it, by ``--on-exhausted``) on its own
key while the others of the batch are committed. So does an event the table refuses (a balance that would
leave a 64-bit integer, which SQLite would otherwise store as an inexact float; an account's event from
another partition): the batch's transaction is rolled back and its rows written again each in a
transaction of its own, the refused ones failing alone. A database error (the file locked past the busy
timeout, a full disk) raises: the transaction is rolled back and every message of the batch fails and is
retried, which the offsets make harmless.

Configuration by environment: ``KEYORDER_EXAMPLE_SQLITE_PATH`` (the database file, default
``keyorder-example.sqlite3`` in the working directory; created with its table on first use). Each
worker thread (or worker process) opens its own connection on its first call; SQLite serialises the
writers, each waiting up to ``BUSY_TIMEOUT_SECONDS`` for the lock (WAL mode: readers never wait).

Run it:  keyorder run --handler keyorder_example.bulk_sqlite:handle_batch --batch-max-messages 100 \\
             --handler-teardown keyorder_example.bulk_sqlite:close --topics payments --group-id ledger-sqlite
Per message (the same writes, one transaction each): --handler keyorder_example.bulk_sqlite:handle
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Sequence
from contextlib import closing

from keyorder import Message

PATH_VARIABLE = "KEYORDER_EXAMPLE_SQLITE_PATH"
DEFAULT_PATH = "keyorder-example.sqlite3"
BUSY_TIMEOUT_SECONDS = 30.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    account TEXT PRIMARY KEY,
    balance INTEGER NOT NULL CHECK (typeof(balance) = 'integer'),
    events INTEGER NOT NULL,
    last_partition INTEGER NOT NULL,
    last_offset INTEGER NOT NULL
);
CREATE TRIGGER IF NOT EXISTS one_partition_per_account BEFORE UPDATE ON accounts
WHEN NEW.last_partition != OLD.last_partition
BEGIN SELECT RAISE(ABORT, 'an account event from another partition than its last one'); END;
"""
"""The table, refusing what would make it wrong: a balance past 64 bits (SQLite would make it an inexact
float), and an account's event from another partition (offsets of two partitions cannot be compared)."""

UPSERT = """
INSERT INTO accounts (account, balance, events, last_partition, last_offset) VALUES (?, ?, 1, ?, ?)
ON CONFLICT (account) DO UPDATE SET
    balance = accounts.balance + excluded.balance,
    events = accounts.events + 1,
    last_partition = excluded.last_partition,
    last_offset = excluded.last_offset
WHERE excluded.last_offset > accounts.last_offset OR excluded.last_partition != accounts.last_partition
"""
"""Applies an event once: only an offset above the row's last one changes it (see the module doc); an event of
another partition is let through, for the table's trigger to refuse."""
INT64 = range(-(2**63), 2**63)

_local = threading.local()
_opened: list[tuple[threading.Thread, sqlite3.Connection]] = []
"""Every connection this process opened and has not closed, with the thread it serves, for ``close`` (the pod's
tear-down hook); one whose thread ended (a worker retired by a resize) is closed when another is opened."""
_opened_lock = threading.Lock()
_closes = 0
"""How many times ``close`` ran: a thread's connection from before the last close is not used again."""


def database_path() -> str:
    return os.environ.get(PATH_VARIABLE) or DEFAULT_PATH


def connection() -> sqlite3.Connection:
    """This thread's connection to ``database_path()``, opened (and the table created) on first use;
    reopened when the path changed (tests point each run at a file of its own) or ``close`` ran since."""
    path = database_path()
    current: sqlite3.Connection | None = getattr(_local, "connection", None)
    if current is None or _local.opened_as != (path, _closes):
        # check_same_thread off only so that ``close`` may close it from the tear-down's thread: each
        # connection is used by the one worker thread that opened it
        current = sqlite3.connect(path, timeout=BUSY_TIMEOUT_SECONDS, check_same_thread=False)
        try:
            current.execute("PRAGMA journal_mode=WAL")
            current.executescript(SCHEMA)
        except sqlite3.Error:
            current.close()
            raise
        with _opened_lock:
            ended = [opened for thread, opened in _opened if not thread.is_alive()]
            _opened[:] = [(thread, opened) for thread, opened in _opened if thread.is_alive()]
            _opened.append((threading.current_thread(), current))
        for opened in ended:
            opened.close()
        _local.connection, _local.opened_as = current, (path, _closes)
    return current


def close() -> None:
    """Close every connection this process opened (``--handler-teardown keyorder_example.bulk_sqlite:close``,
    called once the workers stopped)."""
    global _closes
    with _opened_lock:
        for _thread, opened in _opened:
            opened.close()
        _opened.clear()
        _closes += 1


def row(message: Message) -> tuple[str, int, int, int]:
    """The upsert's parameters for one event; raises ``ValueError`` for one that cannot be applied."""
    if message.key is None:
        raise ValueError(f"an account event without an account (key) at {message.partition}/{message.offset}")
    try:
        amount = json.loads(message.value or b"")["amount"]
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"account event {message.partition}/{message.offset}: the value must be JSON with an integer "
            f"'amount' ({type(error).__name__}: {error})"
        ) from error
    if not isinstance(amount, int) or isinstance(amount, bool) or amount not in INT64:
        raise ValueError(
            f"account event {message.partition}/{message.offset}: 'amount' must be an integer within 64 bits"
        )
    return message.key.decode(), amount, message.partition, message.offset


def handle_batch(messages: Sequence[Message]) -> list[BaseException | None] | None:
    """Apply a batch in one transaction; ``None`` when every event applied, else one outcome per message
    (``None`` or the event's error) so that keyorder retries only the events that failed."""
    outcomes: list[BaseException | None] = []
    rows: list[tuple[int, tuple[str, int, int, int]]] = []  # (index in the batch, parameters)
    for index, message in enumerate(messages):
        try:
            rows.append((index, row(message)))
            outcomes.append(None)
        except ValueError as error:
            outcomes.append(error)
    database = connection()
    try:
        with database:  # one transaction: committed on success, rolled back if executemany raises
            database.executemany(UPSERT, [parameters for _index, parameters in rows])
    except sqlite3.IntegrityError:  # an event the table refuses: the others must not fail with it
        for index, parameters in rows:
            try:
                with database:
                    database.execute(UPSERT, parameters)
            except sqlite3.IntegrityError as refused:
                message = messages[index]
                outcomes[index] = ValueError(
                    f"account event {message.partition}/{message.offset} refused by the table: {refused}"
                )
    return None if all(outcome is None for outcome in outcomes) else outcomes


def handle(message: Message) -> None:
    """The same write for one message, in a transaction of its own (``--batch-max-messages 1``)."""
    (outcome,) = handle_batch([message]) or [None]
    if outcome is not None:
        raise outcome


def balances(path: str | None = None) -> dict[str, tuple[int, int, int, int]]:
    """The table as ``account -> (balance, events, last_partition, last_offset)`` (for checks and demos)."""
    with closing(sqlite3.connect(path or database_path(), timeout=BUSY_TIMEOUT_SECONDS)) as database:
        found = database.execute(
            "SELECT account, balance, events, last_partition, last_offset FROM accounts ORDER BY account"
        ).fetchall()
    return {account: (balance, events, partition, offset) for account, balance, events, partition, offset in found}
