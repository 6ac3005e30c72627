"""The bulk SQLite example end to end (examples/keyorder_example/bulk_sqlite.py): a pod on the embedded
broker with ``--batch-max-messages`` calls ``handle_batch`` and the table sums every account's events;
a second group then reads the whole topic again (what a crash before any commit re-delivers) and the
table does not change."""

from __future__ import annotations

import json
import random

import pytest
from confluent_kafka import Producer

from keyorder_example import bulk_sqlite
from tests.conftest import stop_pod
from tests.support import wait_for_commits

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60)]

EVENTS, ACCOUNTS = 600, 40


def produce_events(bootstrap: str, topic: str) -> tuple[dict[str, tuple[int, int]], dict[int, int]]:
    """``EVENTS`` account events; returns each account's (balance, events) and the end offsets."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 1})
    rng = random.Random(40)
    expected: dict[str, tuple[int, int]] = {}
    end_offsets: dict[int, int] = {}
    errors: list[str] = []

    def delivered(error, record) -> None:
        if error is not None:
            errors.append(str(error))
        else:
            end_offsets[record.partition()] = max(end_offsets.get(record.partition(), 0), record.offset() + 1)

    for _ in range(EVENTS):
        account, amount = f"acct-{rng.randrange(ACCOUNTS)}", rng.randrange(-500, 1_000)
        balance, count = expected.get(account, (0, 0))
        expected[account] = (balance + amount, count + 1)
        producer.produce(topic, key=account, value=json.dumps({"amount": amount}), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(30) == 0 and not errors, errors  # hang guard
    return expected, end_offsets


def test_batches_upsert_every_event_once_and_a_full_redelivery_changes_nothing(
    broker, make_topic, run_pod, tmp_path, monkeypatch
):
    monkeypatch.setenv(bulk_sqlite.PATH_VARIABLE, str(tmp_path / "ledger.sqlite3"))
    topic = make_topic(2)
    expected, end_offsets = produce_events(broker.bootstrap, topic)
    settings = {
        "batch_max_messages": 50,
        "workers": 4,
        "handler_teardown": "keyorder_example.bulk_sqlite:close",
    }
    first = run_pod(topic, "keyorder_example.bulk_sqlite:handle_batch", **settings)
    wait_for_commits(broker.bootstrap, f"g-{topic}", topic, end_offsets, 30)
    stop_pod(first)
    table = bulk_sqlite.balances()
    assert {account: (balance, events) for account, (balance, events, _, _) in table.items()} == expected

    again = run_pod(topic, "keyorder_example.bulk_sqlite:handle_batch", group=f"again-{topic}", **settings)
    wait_for_commits(broker.bootstrap, f"again-{topic}", topic, end_offsets, 30)
    handled = sum(stats.processed for stats in again.pool.stats())
    stop_pod(again)
    assert handled == EVENTS  # every event came again, and was counted once each
    assert bulk_sqlite.balances() == table
