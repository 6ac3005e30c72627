"""``keyorder dev``: the whole data path on one machine, with no cluster.

Starts the embedded broker, writes a keyed backlog with per-key sequence numbers, runs one
keyorder pod with the example ledger handler until the backlog is drained and committed, and
prints what happened: throughput, the partition-ordered time it beat, and per-key order
violations (which must be zero).
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time

from keyorder.config import RunConfig
from keyorder.embedded import EmbeddedBroker
from keyorder.loadgen import create_topics, produce_keyed
from keyorder.logs import configure_logging
from keyorder.progress import Progress

TOPIC = "payments"
DEV_GROUP_TIMINGS = ["session.timeout.ms=6000", "heartbeat.interval.ms=500"]
"""Faster group joins on the embedded broker (about 3 s instead of 23 s); not product defaults."""


def add_dev_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--messages", type=int, default=20_000, help="backlog size [default: 20000]")
    parser.add_argument("--keys", type=int, default=1_000, help="distinct keys (accounts) [default: 1000]")
    parser.add_argument("--partitions", type=int, default=4, help="topic partitions [default: 4]")
    parser.add_argument("--workers", type=int, default=64, help="key workers in the pod [default: 64]")
    parser.add_argument("--latency-ms", type=float, default=5.0,
                        help="simulated handler latency per message [default: 5]")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")


def dev_command(args: argparse.Namespace) -> int:
    configure_logging("WARNING")
    import os

    os.environ["KEYORDER_EXAMPLE_LATENCY_MS"] = str(args.latency_ms)
    from keyorder_example import ledger

    ledger.LATENCY = args.latency_ms / 1000.0
    from keyorder.pod import Pod

    progress = Progress()
    print(f"keyorder dev: {args.messages} messages, {args.keys} keys, {args.partitions} partitions, "
          f"{args.workers} key workers, handler latency {args.latency_ms:g} ms")
    with EmbeddedBroker() as broker:
        print(f"  embedded broker (Tansu) on {broker.bootstrap}")
        create_topics(broker.bootstrap, [TOPIC, f"{TOPIC}.dlq"], args.partitions)
        produced = produce_keyed(broker.bootstrap, TOPIC, args.messages, args.keys,
                                 progress=lambda n: progress.show(f"  producing {n}/{args.messages}"))
        progress.done()
        config = RunConfig(handler="keyorder_example.ledger:handle", topics=[TOPIC], group_id="keyorder-dev",
                           bootstrap_servers=broker.bootstrap, workers=args.workers, http_port=0,
                           kafka_property=DEV_GROUP_TIMINGS)
        pod = Pod(config, handler=ledger.handle)
        stop = threading.Event()
        started = time.monotonic()
        thread = pod.start_in_thread(stop)
        print(f"  pod running; metrics at http://127.0.0.1:{pod.http_port}/metrics")
        deadline = started + args.timeout
        drained = False
        first_message_at = None
        while time.monotonic() < deadline:
            snapshot = pod.runtime.snapshot
            committed = {part.partition: part.committed for part in snapshot.partitions}
            done = ledger.LEDGER.applied + ledger.LEDGER.duplicates
            if done and first_message_at is None:
                first_message_at = time.monotonic()
                print(f"  joined the consumer group in {first_message_at - started:.1f}s")
            elapsed = time.monotonic() - (first_message_at or started)
            progress.show(f"  consumed {done}/{produced.total}  {done / max(elapsed, 1e-9):,.0f} msg/s  "
                          f"in flight {snapshot.inflight}  workers {snapshot.workers}")
            if done >= produced.total and committed == produced.end_offsets:
                drained = True
                break
            time.sleep(0.1)
        elapsed = time.monotonic() - (first_message_at or started)
        stop.set()
        thread.join(60)
        progress.done()
    book = ledger.LEDGER
    baseline = args.messages * args.latency_ms / 1000.0 / args.partitions
    print(f"  drained {book.applied} messages in {elapsed:.1f}s = {book.applied / elapsed:,.0f} msg/s "
          f"(a partition-ordered consumer needs >= {baseline:.1f}s: {baseline / elapsed:.1f}x slower)")
    print(f"  per-key order violations: {book.out_of_order}; re-deliveries: {book.duplicates}; "
          f"committed == end offsets: {drained}")
    if not drained or book.out_of_order:
        print("keyorder dev: FAILED", file=sys.stderr)
        return 1
    print("keyorder dev: OK")
    logging.shutdown()
    return 0
