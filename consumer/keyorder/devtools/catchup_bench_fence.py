"""What the wave-attempt fence costs a catch-up task's handler threads, measured without Spark (issue 38).

Every catch-up task copy checks ``live.TaskReporter.fenced`` before each handler call and reports to the
driver's ``live.ProgressListener`` (which answers go on or stop) about once a second. The hot-keys run of
``keyorder catchup-bench`` is within about a second of its target, and its run-to-run spread on a shared
machine is of the same size, so the fence's share cannot be read from it. This runs one by-partition task
(``apply.ApplyHandler``, 16 task workers, the bench's ``io`` handler) over the hot-keys shape scaled to one
task (2 hot keys among 1,000 light keys, two partitions, Arrow batches built by the reader's own
``datasource.arrow_batch``) with the fence and without it, alternately, and gives each run's time over one
hot key's chain (its handler calls one after another, measured here): the fence's cost is the difference.

The listener runs in this process, so its answers take the task's GIL: a dearer setting than Spark's,
where the driver is another process.

    python -m keyorder.devtools.catchup_bench_fence [--per-hot 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from keyorder.catchup.apply import ApplyHandler
from keyorder.catchup.datasource import PROGRESS_SCALE, arrow_batch, lane_hash, progress_of, record_lane
from keyorder.catchup.live import ProgressListener, WaveAttempt
from keyorder.core.retry import RetryPolicy
from keyorder.devtools.catchup_bench_handlers import io

HANDLER = "keyorder.devtools.catchup_bench_handlers:io"
TOPIC = "catchup-bench-fence"
ATTEMPT = WaveAttempt("catchup-bench-fence", 0, 1)
BATCH_ROWS = 2_000
"""Rows per Arrow batch, as the reader's ``ARROW_BATCH_ROWS``."""


def task_frames(
    per_hot: int, hot_keys: int = 2, light_keys: int = 1_000, per_light: int = 8, partitions: int = 2, seed: int = 1
) -> list[Any]:
    """One by-partition task's input: the keys' messages (a key in one partition, in a random order) as
    the reader hands them over, sorted by ``(progress, source, offset)``, then each partition's end
    marker, in Arrow batches of ``BATCH_ROWS``."""
    keys = [f"hot-{index}".encode() for index in range(hot_keys) for _ in range(per_hot)]
    keys += [f"light-{index}".encode() for index in range(light_keys) for _ in range(per_light)]
    random.Random(seed).shuffle(keys)
    homes: dict[bytes, int] = {}
    per_partition: list[list[bytes]] = [[] for _ in range(partitions)]
    for key in keys:
        per_partition[homes.setdefault(key, len(homes) % partitions)].append(key)
    rows: list[tuple[Any, ...]] = []
    for partition, records in enumerate(per_partition):
        for offset, key in enumerate(records):
            progress = progress_of(offset, 0, len(records))
            rows.append(
                (record_lane(TOPIC, partition, key), partition, progress, offset, key, b"", [], 0.0, None, None)
            )
        marker = lane_hash(f"marker:{partition}".encode())
        rows.append((marker, partition, PROGRESS_SCALE, len(records), None, None, [], None, len(records), 0))
    rows.sort(key=lambda row: (row[2], row[1], row[3]))
    return [arrow_batch(rows[start : start + BATCH_ROWS]) for start in range(0, len(rows), BATCH_ROWS)]


def chain_seconds(per_hot: int) -> float:
    """One hot key's chain: ``per_hot`` handler calls one after another, measured on up to 500 of them."""
    calls = min(per_hot, 500)
    started = time.perf_counter()
    for _ in range(calls):
        io(None)  # type: ignore[arg-type]  # the handler reads nothing of its message
    return (time.perf_counter() - started) / calls * per_hot


def task_seconds(frames: list[Any], partitions: int, workers: int, listener: ProgressListener | None) -> float:
    """One task over ``frames``: with the fence (reporting to ``listener``) or, with None, without it."""
    task = ApplyHandler(
        handler=HANDLER,
        policy=RetryPolicy(max_attempts=1),
        dlq_topic=f"{TOPIC}.dlq",
        sources=[(TOPIC, partition) for partition in range(partitions)],
        task_workers=workers,
        run_id=ATTEMPT.run_id,
        wave=ATTEMPT.wave,
        wave_attempt=ATTEMPT.attempt,
        live_address=(listener.task_host, listener.port) if listener is not None else None,
    )
    started = time.perf_counter()
    for _ in task(iter(frames)):
        pass
    return time.perf_counter() - started


@dataclass
class FenceCost:
    chain_seconds: float
    fenced: list[float] = field(default_factory=list)
    """Each run with the fence: its time over the chain's."""
    unfenced: list[float] = field(default_factory=list)
    """Each run without it, in the same rounds."""

    def difference(self) -> float:
        """The median run with the fence over the chain minus the median one without it."""
        return statistics.median(self.fenced) - statistics.median(self.unfenced)


def measure(per_hot: int, rounds: int, workers: int = 16, partitions: int = 2, light_keys: int = 1_000) -> FenceCost:
    """``rounds`` pairs of runs, without then with the fence, over the same input (``task_frames``)."""
    frames = task_frames(per_hot, light_keys=light_keys, partitions=partitions)
    cost = FenceCost(chain_seconds(per_hot))
    listener = ProgressListener("127.0.0.1")
    try:
        for _ in range(rounds):
            listener.expect(ATTEMPT)
            cost.unfenced.append(task_seconds(frames, partitions, workers, None) / cost.chain_seconds)
            cost.fenced.append(task_seconds(frames, partitions, workers, listener) / cost.chain_seconds)
            if not listener.reported():
                raise RuntimeError("the task never reported to the driver's listener: the fence was not measured")
    finally:
        listener.close()
    return cost


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m keyorder.devtools.catchup_bench_fence", description=__doc__)
    parser.add_argument("--per-hot", type=int, default=2_000, help="messages per hot key [default: 2000]")
    parser.add_argument("--rounds", type=int, default=3, help="runs with and without the fence [default: 3]")
    args = parser.parse_args(argv)
    cost = measure(args.per_hot, args.rounds)
    print(f"one hot key's chain: {cost.chain_seconds:.2f} s; each run's time over it:")
    for name, runs in (("without the fence", cost.unfenced), ("with the fence", cost.fenced)):
        print(f"  {name:<18} {' '.join(f'{run:.3f}' for run in runs)}  median {statistics.median(runs):.3f}")
    print(f"the fence's cost: {cost.difference():+.3f} of the chain (medians)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
