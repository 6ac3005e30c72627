"""The bulk SQLite example's batch handler (examples/keyorder_example/bulk_sqlite.py): one transaction
per batch, and the same table however often its events are delivered (at-least-once), in whatever
batches, with an out-of-date event never overwriting a newer one; a bad event fails alone."""

from __future__ import annotations

import json
import sqlite3

import pytest

from keyorder.message import Message
from keyorder_example import bulk_sqlite


@pytest.fixture(autouse=True)
def database(tmp_path, monkeypatch):
    path = tmp_path / "ledger.sqlite3"
    monkeypatch.setenv(bulk_sqlite.PATH_VARIABLE, str(path))
    yield path
    bulk_sqlite.close()


def event(account: str, amount: object, offset: int, partition: int = 0) -> Message:
    return Message("payments", partition, offset, account.encode(), json.dumps({"amount": amount}).encode())


LOG = [event(f"acct-{offset % 7}", offset * 10 - 300, offset, offset % 7 % 2) for offset in range(60)]
"""Seven accounts on two partitions; each account's events in offset order."""


def expected_table(events: list[Message]) -> dict[str, tuple[int, int, int, int]]:
    table: dict[str, tuple[int, int, int, int]] = {}
    for message in events:
        account = (message.key or b"").decode()
        balance, count, _, _ = table.get(account, (0, 0, 0, 0))
        table[account] = (balance + message.json()["amount"], count + 1, message.partition, message.offset)
    return table


def batches(events: list[Message], size: int) -> list[list[Message]]:
    """As keyorder forms them: at most one event per account, each account's events in order."""
    pending = list(events)
    formed = []
    while pending:
        batch: list[Message] = []
        keys: set[bytes | None] = set()
        for message in list(pending):
            if message.key not in keys and len(batch) < size:
                batch.append(message)
                keys.add(message.key)
                pending.remove(message)
            else:
                keys.add(message.key)  # a later event of a key never passes an earlier one left behind
        formed.append(batch)
    return formed


def test_a_batch_is_applied_in_one_transaction_and_the_table_sums_each_account():
    for batch in batches(LOG, 5):
        assert bulk_sqlite.handle_batch(batch) is None
    assert bulk_sqlite.balances() == expected_table(LOG)


def test_redelivered_and_duplicated_batches_leave_the_same_table():
    once = batches(LOG, 4)
    for batch in once:
        bulk_sqlite.handle_batch(batch)
    table = bulk_sqlite.balances()
    # a crash after the first half: everything since an earlier commit comes again, in other batches
    for batch in batches(LOG[20:], 3):
        assert bulk_sqlite.handle_batch(batch) is None
    # a batch that failed as a whole after its transaction committed is retried whole
    for batch in once[:3]:
        bulk_sqlite.handle_batch(batch)
    # the same event twice in one call, and every event again in one call (several per account: keyorder
    # never sends that, the handler copes anyway)
    bulk_sqlite.handle_batch([LOG[5], LOG[5]])
    bulk_sqlite.handle_batch(LOG)
    assert bulk_sqlite.balances() == table == expected_table(LOG)


def test_an_out_of_date_event_never_overwrites_a_newer_one():
    newer, older = event("a", 500, 9), event("a", 70, 4)
    bulk_sqlite.handle_batch([newer])
    bulk_sqlite.handle_batch([older])
    assert bulk_sqlite.balances() == {"a": (500, 1, 0, 9)}


def test_a_bad_event_fails_alone_and_the_rest_of_its_batch_is_written():
    no_key = Message("payments", 0, 3, None, b'{"amount": 1}')
    batch = [event("a", 5, 0), Message("payments", 0, 1, b"b", b"not json"), event("c", 2.5, 2), no_key]
    outcomes = bulk_sqlite.handle_batch(batch)
    assert outcomes is not None and len(outcomes) == 4 and outcomes[0] is None
    assert all(isinstance(outcome, ValueError) for outcome in outcomes[1:])
    assert "integer 'amount'" in str(outcomes[1]) and "'amount' must be an integer" in str(outcomes[2])
    assert "without an account" in str(outcomes[3])
    assert bulk_sqlite.balances() == {"a": (5, 1, 0, 0)}
    with pytest.raises(ValueError, match="must be JSON"):
        bulk_sqlite.handle(batch[1])


def test_a_database_error_rolls_the_whole_batch_back_and_raises(database, monkeypatch):
    monkeypatch.setattr(bulk_sqlite, "BUSY_TIMEOUT_SECONDS", 0.05)
    bulk_sqlite.handle_batch([event("a", 1, 0)])
    other = sqlite3.connect(database, isolation_level=None)
    other.execute("BEGIN EXCLUSIVE")  # another writer holds the lock past the busy timeout
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            bulk_sqlite.handle_batch([event("b", 7, 1), event("a", 2, 2)])
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert bulk_sqlite.balances() == {"a": (1, 1, 0, 0)}  # b's insert was rolled back with the batch


def test_an_event_the_table_refuses_fails_alone_and_the_rest_of_its_batch_is_written(database):
    bulk_sqlite.handle_batch([event("a", 1, 0)])
    with sqlite3.connect(database) as other:
        other.execute(
            "CREATE TRIGGER refuse BEFORE UPDATE ON accounts WHEN NEW.account = 'a' "
            "BEGIN SELECT RAISE(ABORT, 'no'); END"
        )
    other.close()
    outcomes = bulk_sqlite.handle_batch([event("b", 7, 1), event("a", 2, 2)])
    assert outcomes is not None and outcomes[0] is None and "refused by the table: no" in str(outcomes[1])
    assert bulk_sqlite.balances() == {"a": (1, 1, 0, 0), "b": (7, 1, 0, 1)}


@pytest.mark.parametrize("amount", [2**63, -(2**63) - 1])
def test_an_amount_past_64_bits_fails_alone(amount):
    """SQLite cannot bind it: the whole batch's executemany raised (a review found one bad event failing every
    batch it landed in)."""
    outcomes = bulk_sqlite.handle_batch([event("a", amount, 0), event("b", 5, 1)])
    assert outcomes is not None and "within 64 bits" in str(outcomes[0]) and outcomes[1] is None
    assert bulk_sqlite.balances() == {"b": (5, 1, 0, 1)}


def test_a_balance_that_would_leave_64_bits_fails_alone_and_stays_exact():
    """SQLite turns an integer sum that overflows into an inexact float; the table refuses it instead."""
    bulk_sqlite.handle_batch([event("a", 2**63 - 10, 0)])
    outcomes = bulk_sqlite.handle_batch([event("a", 20, 1), event("b", 5, 2)])
    assert outcomes is not None and "refused by the table" in str(outcomes[0]) and outcomes[1] is None
    assert bulk_sqlite.balances() == {"a": (2**63 - 10, 1, 0, 0), "b": (5, 1, 0, 2)}


@pytest.mark.parametrize("offset", [3, 50])
def test_an_accounts_event_from_another_partition_fails_instead_of_being_skipped_or_applied(offset):
    """Offsets of two partitions cannot be compared: a lower one was skipped as out of date (money lost, a review
    found), a higher one would be applied whatever came before it. It fails, for an operator to decide."""
    bulk_sqlite.handle_batch([event("a", 1, 10, partition=0)])
    outcomes = bulk_sqlite.handle_batch([event("a", 5, offset, partition=1)])
    assert outcomes is not None and "another partition" in str(outcomes[0])
    assert bulk_sqlite.balances() == {"a": (1, 1, 0, 10)}


def test_the_connections_of_threads_that_ended_are_closed():
    """A worker retired by a resize leaves its thread's connection: closed when the next one is opened."""
    import threading

    opened: list[sqlite3.Connection] = []

    def work(offset: int) -> None:
        bulk_sqlite.handle(event(f"t{offset}", 1, offset))
        opened.append(bulk_sqlite.connection())

    for offset in range(3):
        thread = threading.Thread(target=work, args=(offset,))
        thread.start()
        thread.join()
    bulk_sqlite.handle(event("main", 1, 9))
    for ended in opened:
        with pytest.raises(sqlite3.ProgrammingError):
            ended.execute("SELECT 1")
    assert bulk_sqlite.connection().execute("SELECT count(*) FROM accounts").fetchone() == (4,)


def test_close_closes_every_connection_and_the_next_call_opens_a_new_one():
    bulk_sqlite.handle(event("a", 1, 0))
    first = bulk_sqlite.connection()
    bulk_sqlite.close()
    with pytest.raises(sqlite3.ProgrammingError):
        first.execute("SELECT 1")
    bulk_sqlite.handle(event("a", 1, 1))
    assert bulk_sqlite.connection() is not first and bulk_sqlite.balances() == {"a": (2, 2, 0, 1)}
