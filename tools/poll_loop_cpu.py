"""The poll thread's CPU while some partitions are paused and the workers have nothing to do.

Issue 36 (defect 8) measured about 38% of a core at 2,000 partitions: while any partition is
paused, the loop calls ``consume`` with a 5 ms timeout (``PARTLY_PAUSED_TIMEOUT``) so that a resume
is prompt, and each of those turns rebuilt every partition's load and let flow control walk them
all. This probe drives the real ``ConsumerRuntime`` and ``ThreadWorkerPool`` with a FAKE in-memory
source (no broker: the figure is the loop's own work, not librdkafka's): ``--partitions`` assigned,
``--paused`` of them holding their in-flight share on a key whose handler never returns (so flow
control pauses them after ``pause_after``), nothing else to read. It reports the poll thread's CPU
seconds per wall second (``time.thread_time`` read inside the fake ``consume``, which runs on the
poll thread) and its turns per second, over ``--seconds`` once the pauses are in place.

``--against COMMIT`` runs the same probe on that commit's ``consumer/`` (extracted with ``git
archive``) and on the working tree, one after the other, each in its own process, and prints the
ratio::

    .venv/bin/python -m tools.poll_loop_cpu --against ba9dbdb
    .venv/bin/python -m tools.poll_loop_cpu --partitions 2000 --paused 10 --seconds 3
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HOT_KEY = b"hot"


class IdleSource:
    """FAKE Source: ``partitions`` assigned at the first ``consume``; only the hot ones have records.

    An empty ``consume`` waits its timeout in real time, as the Kafka client does; asynchronous commit
    results are handed to ``on_commit_result`` inside the next ``consume``, as librdkafka does."""

    broker_reachable = True
    broker_error = None

    def __init__(self, partitions: int, hot: dict[tuple[str, int], list[Any]]) -> None:
        self.partition_ids = [("t", partition) for partition in range(partitions)]
        self.pending = {pid: deque(messages) for pid, messages in hot.items()}
        self.paused: set[tuple[str, int]] = set()
        self.on_commit_result: Any = None
        self._results: list[Any] = []
        self._on_assign: Any = None
        self.samples: list[tuple[float, float]] = []
        """(wall, poll-thread CPU) at each ``consume``."""

    def subscribe(self, topics, on_assign, on_revoke, on_lost):
        self._on_assign = on_assign

    def serve_callbacks(self) -> None:
        """What librdkafka does inside ``consume`` before records: the assignment, then the commit results."""
        if self._on_assign is not None:
            on_assign, self._on_assign = self._on_assign, None
            on_assign(self.partition_ids)
        if self._results and self.on_commit_result is not None:
            results, self._results = self._results, []
            self.on_commit_result(results)

    def consume(self, max_messages, timeout):
        self.samples.append((time.monotonic(), time.thread_time()))
        self.serve_callbacks()
        out = []
        for pid, messages in self.pending.items():
            while messages and pid not in self.paused and len(out) < max_messages:
                out.append(messages.popleft())
        if not out and timeout:
            threading.Event().wait(timeout)
        return out

    def pause(self, partitions):
        self.paused.update(partitions)

    def resume(self, partitions):
        self.paused.difference_update(partitions)

    def committed(self, partitions, timeout):
        return {pid: (0, None) for pid in partitions}

    def commit(self, offsets, asynchronous):
        results = [(pid, offset, None) for pid, (offset, _metadata) in offsets.items()]
        if asynchronous:
            self._results.extend(results)
            return []
        return results

    def positions(self, partitions):
        return dict.fromkeys(partitions)

    def high_watermark(self, partition):
        return None

    def fetch_queue(self, partition):
        return None

    def close(self):
        pass


def measure(partitions: int, paused: int, seconds: float) -> dict[str, float]:
    """Run the probe with whichever ``keyorder`` this process imports."""
    from keyorder.core.flow import FlowLimits
    from keyorder.core.retry import RetryPolicy
    from keyorder.core.routing import Ordering
    from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSettings
    from keyorder.engine.worker_pools import Completions, ThreadWorkerPool
    from keyorder.message import Message

    limits = FlowLimits()
    share = max(1, min(limits.max_inflight_per_partition, limits.max_inflight // partitions))
    hot = {("t", p): [Message("t", p, offset, HOT_KEY, b"") for offset in range(share)] for p in range(paused)}
    source = IdleSource(partitions, hot)
    release = threading.Event()

    def handle(message: Any) -> None:
        if message.key == HOT_KEY:
            release.wait(seconds + 60)

    completions = Completions()
    pool = ThreadWorkerPool(handle, paused + 4, RetryPolicy(), None, completions)
    runtime = ConsumerRuntime(RuntimeSettings(topics=("t",), flow=limits), source, pool, Ordering.KEY, completions)
    source.on_commit_result = runtime.record_commit_outcomes
    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,), name="poll-loop", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while len(source.paused) < paused and time.monotonic() < deadline:
            time.sleep(0.05)
        if len(source.paused) < paused:
            raise RuntimeError(f"only {len(source.paused)} of {paused} partitions were paused within 30 s")
        first = len(source.samples)
        time.sleep(seconds)
        window = source.samples[first:]
    finally:
        release.set()
        stop.set()
        thread.join(30)
    (wall0, cpu0), (wall1, cpu1) = window[0], window[-1]
    return {
        "cpu_per_wall_second": (cpu1 - cpu0) / (wall1 - wall0),
        "consume_calls_per_second": (len(window) - 1) / (wall1 - wall0),
    }


def run_in_process(consumer: Path, args: argparse.Namespace) -> dict[str, float]:
    """The probe in a fresh process importing ``keyorder`` from ``consumer``."""
    command = [sys.executable, "-m", "tools.poll_loop_cpu", "--json"]
    command += ["--partitions", str(args.partitions), "--paused", str(args.paused), "--seconds", str(args.seconds)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(consumer), str(ROOT)])}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def describe(label: str, figures: dict[str, float]) -> str:
    return (
        f"{label}: poll thread {figures['cpu_per_wall_second']:.3f} CPU s per wall s, "
        f"{figures['consume_calls_per_second']:.0f} consume calls/s"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", type=int, default=2000, help="partitions assigned (default 2000)")
    parser.add_argument("--paused", type=int, default=10, help="partitions held by a handler that never returns")
    parser.add_argument("--seconds", type=float, default=3.0, help="measured window, once the pauses are in place")
    parser.add_argument("--against", metavar="COMMIT", help="also run the probe on this commit's consumer/")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if not 0 < args.paused < args.partitions:
        parser.error(f"--paused must be between 1 and --partitions - 1, got {args.paused}")
    if args.json:
        print(json.dumps(measure(args.partitions, args.paused, args.seconds)))
        return 0
    setup = f"{args.partitions} partitions, {args.paused} paused, idle workers, {args.seconds:g} s"
    if args.against is None:
        print(describe(f"working tree ({setup})", run_in_process(ROOT / "consumer", args)))
        return 0
    with tempfile.TemporaryDirectory(prefix="keyorder-poll-cpu-") as folder:
        archive = subprocess.run(
            ["git", "archive", args.against, "consumer"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(folder, filter="data")
        before = run_in_process(Path(folder) / "consumer", args)
    after = run_in_process(ROOT / "consumer", args)
    print(setup)
    print(describe(f"{args.against}", before))
    print(describe("working tree", after))
    ratio = after["cpu_per_wall_second"] / before["cpu_per_wall_second"]
    print(f"after / before: {ratio:.3f} x the poll thread's CPU")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
