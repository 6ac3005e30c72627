"""When a catch-up reader task's first Arrow batch comes, outside Spark (issue 38, "the reader's first batch").

The hot-keys run of ``keyorder catchup-bench`` lost 1.0-1.9 s between a task's start and its hot keys'
first handler call, waiting for the reader. This tool times ``datasource.read_task`` on a task like that
run's (two partitions of 30,000 one-record batches on the embedded broker, splits of 10,000 offsets):
its first batch, its first 10,000 rows (Spark's ``maxRecordsPerBatch``: the handler's first input batch)
and all rows; with ``--old``, alternately with another checkout's ``datasource.py`` (the code before a
change). It also times the steps: a consumer's creation and assignment, its consumes from the first
fetch on, and one chunk's Arrow conversion.

    flock /tmp/keyorder-heavy.lock .venv/bin/python -m keyorder.devtools.catchup_reader_timing \
        --old /tmp/wt/consumer/keyorder/catchup/datasource.py
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from types import ModuleType
from typing import Any

from keyorder.catchup import datasource
from keyorder.devtools.embedded import EmbeddedBroker
from keyorder.devtools.loadgen import EXACT_END_OFFSETS, create_topics, produce_keyed

TOPIC = "reader-timing"
PER_PARTITION = 30_000
"""Records per partition: the hot-keys scenario's 120,000 over 4 partitions."""
SPLIT_OFFSETS = 10_000
"""``catchup_bench.bench_config``'s split size."""
SPARK_BATCH_ROWS = 10_000
"""Spark's ``spark.sql.execution.arrow.maxRecordsPerBatch``: rows in the handler's first input batch."""


def load_module(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("datasource_compared", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--old: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def task_timeline(module: Any, properties: dict[str, str], ends: list[int]) -> tuple[float, float, float, int]:
    """(first batch, first SPARK_BATCH_ROWS rows, all rows) in seconds from the task's start, and its rows."""
    splits = [
        module.Split(TOPIC, partition, first, min(first + SPLIT_OFFSETS, end), partition, 0, end)
        for partition, end in enumerate(ends)
        for first in range(0, end, SPLIT_OFFSETS)
    ]
    started = time.perf_counter()
    rows, first, enough = 0, 0.0, 0.0
    for batch in module.read_task(properties, "key", splits, 120):
        rows += batch.num_rows
        now = time.perf_counter() - started
        first = first or now
        enough = enough or (now if rows >= SPARK_BATCH_ROWS else 0.0)
    return first, enough, time.perf_counter() - started, rows


def consumer_steps(properties: dict[str, str]) -> str:
    from confluent_kafka import Consumer, TopicPartition

    started = time.perf_counter()
    consumer = Consumer(datasource.reader_config(properties))
    consumer.assign([TopicPartition(TOPIC, 0, 0)])
    assigned = time.perf_counter() - started
    consumes: list[tuple[float, int]] = []
    while sum(count for _, count in consumes) < 4_000:
        consumes.append((round(time.perf_counter() - started, 3), len(consumer.consume(1000, timeout=1.0))))
    consumer.close()
    return (
        f"consumer created and assigned in {assigned * 1000:.1f} ms; consume(1000) returned at (s, records) {consumes}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", help="another checkout's catchup/datasource.py, timed alternately with this one")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    modules: list[tuple[str, Any]] = [("this", datasource)]
    if args.old:
        modules.insert(0, ("old", load_module(args.old)))
    with EmbeddedBroker() as broker:
        properties = {"bootstrap.servers": broker.bootstrap}
        create_topics(broker.bootstrap, [TOPIC], 2)
        produce_keyed(broker.bootstrap, TOPIC, 2 * PER_PARTITION, 5_000, extra_config=EXACT_END_OFFSETS)
        ends = [log_end(broker.bootstrap, partition) for partition in (0, 1)]
        print(consumer_steps(properties))
        rows = list(datasource.read_split(properties, "key", datasource.Split(TOPIC, 0, 0, 2_000), 120))[:2_000]
        for attempt in ("first in this process", "again"):
            started = time.perf_counter()
            datasource.arrow_batch(rows)
            print(f"arrow_batch of 2,000 rows ({attempt}): {(time.perf_counter() - started) * 1000:.1f} ms")
        for _ in range(args.rounds):
            for name, module in modules:
                first, enough, total, count = task_timeline(module, properties, ends)
                print(
                    f"{name}: first batch {first:.3f} s, {SPARK_BATCH_ROWS:,} rows {enough:.3f} s, "
                    f"all {count:,} rows {total:.2f} s ({count / total:,.0f} rows/s)",
                    flush=True,
                )
    return 0


def log_end(bootstrap: str, partition: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reader-timing"})
    try:
        return int(consumer.get_watermark_offsets(TopicPartition(TOPIC, partition), timeout=10)[1])
    finally:
        consumer.close()


if __name__ == "__main__":
    raise SystemExit(main())
