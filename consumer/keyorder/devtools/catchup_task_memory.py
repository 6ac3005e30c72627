"""A catch-up handler task's peak memory with large values, measured in a process of its own.

``measure`` starts ``python -m keyorder.devtools.catchup_task_memory`` (a fresh interpreter, as a
Spark Python worker is) which loads what the handler's worker loads, runs a small warm-up task and
reads its peak RSS (``VmHWM`` of /proc/self/status) as the *base*; it then runs the real task
function (``apply.ApplyHandler``) over Arrow record batches built by the reader's own
``datasource.arrow_batch``, cut at ``batch_bytes`` as Spark cuts ``mapInArrow`` input at
``spark.sql.execution.arrow.maxBytesPerBatch``, with a handler slow enough that the look-ahead
fills, and reads the peak again. Spark is not started: its JVM and the reader's worker are other
processes, and the handler worker's input is exactly these batches.

The task must stay within ``base + look-ahead + one Arrow batch + one slice`` (``memory``); the
report gives the figures and ``memory.handler_worker_mib``, the fixed budget the operator sizes by.
``keyorder catchup-bench`` reports it for 100 KB values; tests/unit/test_catchup_memory.py checks it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

from keyorder.message import Message

HANDLE_SECONDS = 0.0005
"""The probe handler's time per message: slower than the feeder, so the look-ahead fills."""
KEYS = 64
TOPIC = "t"
"""The probe task's topic: its partitions 0.. are the task's sources."""


def slow(message: Message) -> None:
    time.sleep(HANDLE_SECONDS)


def peak_rss_kib() -> int:
    """This process's peak resident memory (VmHWM), in KiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise RuntimeError("no VmHWM in /proc/self/status (not Linux?)")


def batches(messages: int, value_bytes: int, batch_bytes: int, sources: int = 4) -> Iterator[Any]:
    """Rows as a by-partition task gets them (keys spread over ``sources`` partitions, offsets increasing),
    in Arrow batches of at most ``batch_bytes`` of values (at least one row), each built only when asked
    for and referenced by nothing here once handed over; then one end marker per partition
    (``datasource.arrow_batch``)."""
    from keyorder.catchup.datasource import PROGRESS_SCALE, arrow_batch

    per_source = -(-messages // sources)
    rows_per_batch = max(batch_bytes // max(value_bytes, 1), 1)
    offsets = [0] * sources
    for first in range(0, messages, rows_per_batch):
        yield _batch(first, min(rows_per_batch, messages - first), value_bytes, offsets, per_source)
    markers: list[tuple] = [
        (0, source, PROGRESS_SCALE, offsets[source], None, None, [], None, offsets[source], 0)
        for source in range(len(offsets))
    ]
    yield arrow_batch(markers)


def _batch(first: int, count: int, value_bytes: int, offsets: list[int], per_source: int) -> Any:
    """Rows ``first ..`` as one Arrow batch of ``datasource.arrow_schema``, the next offsets of their partitions
    (``offsets`` advanced), their values in one buffer of its exact size, as Spark's Arrow stream reader
    allocates it (built row by row, the buffer would double on the way)."""
    import pyarrow

    from keyorder.catchup.datasource import arrow_schema, progress_of, record_lane

    schema = arrow_schema()
    sources_of = [(first + n) % len(offsets) for n in range(count)]
    keys = [b"key-%d-%d" % (source, (first + n) % KEYS) for n, source in enumerate(sources_of)]
    numbers = []
    for source in sources_of:
        numbers.append(offsets[source])
        offsets[source] += 1
    ends = pyarrow.array([n * value_bytes for n in range(count + 1)], pyarrow.int32())
    values = pyarrow.BinaryArray.from_buffers(
        pyarrow.binary(), count, [None, ends.buffers()[1], pyarrow.py_buffer(b"v" * (value_bytes * count))]
    )
    columns = {
        # the lane the reader gives a keyed record: its key within its partition (``TOPIC``, partition = source)
        "lane": pyarrow.array(
            [record_lane(TOPIC, source, key) for source, key in zip(sources_of, keys, strict=True)], pyarrow.int64()
        ),
        "source": pyarrow.array(sources_of, pyarrow.int32()),
        "progress": pyarrow.array([progress_of(o, 0, per_source) for o in numbers], pyarrow.int64()),
        "offset": pyarrow.array(numbers, pyarrow.int64()),
        "key": pyarrow.array(keys, pyarrow.binary()),
        "value": values,
        "headers": pyarrow.array([[]] * count, schema.field("headers").type),
        "timestamp": pyarrow.nulls(count, pyarrow.float64()),
        "marker_read": pyarrow.nulls(count, pyarrow.int64()),
        "marker_skipped": pyarrow.nulls(count, pyarrow.int64()),
    }
    return pyarrow.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


def run_task(messages: int, value_bytes: int, batch_bytes: int, lookahead_mb: int, workers: int) -> int:
    """Run one handler task over the batches; its handled count."""
    from keyorder.catchup.apply import ApplyHandler
    from keyorder.core.retry import RetryPolicy

    handler = ApplyHandler(
        handler="keyorder.devtools.catchup_task_memory:slow",
        policy=RetryPolicy(max_attempts=1),
        dlq_topic="unused",
        sources=[(TOPIC, source) for source in range(4)],
        task_workers=workers,
        lookahead_bytes=lookahead_mb << 20,
    )
    (summary,) = list(handler(batches(messages, value_bytes, batch_bytes)))
    return sum(summary.column("processed").to_pylist())


def probe(messages: int, value_bytes: int, batch_bytes: int, lookahead_mb: int, workers: int) -> dict[str, Any]:
    """In this process: the base after a warm-up task, then the peak over the measured task."""
    run_task(200, 100, 1 << 20, lookahead_mb, workers)  # imports, threads, the handler: the worker's own memory
    base = peak_rss_kib()
    started = time.monotonic()
    handled = run_task(messages, value_bytes, batch_bytes, lookahead_mb, workers)
    return {
        "messages": messages,
        "handled": handled,
        "value_bytes": value_bytes,
        "batch_bytes": batch_bytes,
        "lookahead_mb": lookahead_mb,
        "base_kib": base,
        "peak_kib": peak_rss_kib(),
        "seconds": round(time.monotonic() - started, 2),
    }


def measure(
    messages: int, value_bytes: int, batch_bytes: int, lookahead_mb: int, workers: int = 16, timeout: float = 300
) -> dict[str, Any]:
    """``probe`` in a fresh interpreter, plus the budgets: ``allowed_growth_kib`` above the measured base
    (``memory.handler_growth_bytes``: look-ahead, one batch, one slice, the allocator's slack), and
    ``budget_mib`` for the whole worker (``memory.handler_worker_mib``, the figure the operator sizes by)."""
    from keyorder.catchup.memory import handler_growth_bytes, handler_worker_mib

    command = [sys.executable, "-m", __name__, str(messages), str(value_bytes), str(batch_bytes), str(lookahead_mb)]
    done = subprocess.run(
        [*command, str(workers)], capture_output=True, text=True, timeout=timeout, check=False
    )  # hang guard
    if done.returncode != 0:
        raise RuntimeError(f"the memory probe failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    report["allowed_growth_kib"] = handler_growth_bytes(lookahead_mb, batch_bytes) >> 10
    report["growth_kib"] = report["peak_kib"] - report["base_kib"]
    report["budget_mib"] = handler_worker_mib(lookahead_mb, batch_bytes)
    report["within_budget"] = (
        report["growth_kib"] <= report["allowed_growth_kib"] and report["peak_kib"] <= report["budget_mib"] << 10
    )
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("messages", "value_bytes", "batch_bytes", "lookahead_mb", "workers"):
        parser.add_argument(name, type=int)
    args = parser.parse_args(argv)
    report = probe(args.messages, args.value_bytes, args.batch_bytes, args.lookahead_mb, args.workers)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
