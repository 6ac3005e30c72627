"""The pod's own CPU per message, without a broker: where a batch handler's ceiling goes (issue 40).

A development probe, not a benchmark. It drives the real ``ConsumerRuntime`` and a real worker pool
with a FAKE in-memory source (no broker, no librdkafka: ``consume`` hands out ``Message`` objects
built in advance, in the order a client hands them out, one partition's fetch at a time), over
``--messages`` messages on ``--partitions`` partitions and ``--keys`` keys, and reports the
process's CPU per message and its rate once every message is handled. The figure is the pod's
own path (offsets, lanes, hand-offs, completions, flow control, commits), the part a batch handler's
call does not remove; ``keyorder bench --ceiling`` measures the whole pod against a real broker.

The preloaded messages are frozen out of the garbage collector's reach (``gc.freeze``): they are the
harness's, not the pod's. ``--batch N`` runs a batch handler of at most N messages a call (0: per
message); ``--verbose`` prints each run's batch calls and holds; ``--profile``
samples the run with py-spy (a development tool from PyPI) and prints the innermost frames of the
busiest functions; ``--against COMMIT`` runs the same on that commit's ``consumer/`` first (each in
its own process) and prints the ratio::

    .venv/bin/python -m tools.pod_path_cpu --batch 100
    .venv/bin/python -m tools.pod_path_cpu --batch 100 --against HEAD~3 --rounds 10 --runs 1
    .venv/bin/python -m tools.pod_path_cpu --batch 100 --profile
    .venv/bin/python -m tools.pod_path_cpu --batch 100 --workers 1 --pin 1     # every thread on CPU 1

``--pin CPU`` puts the poll thread and the workers on one core: without it they run on both, and each
message a worker takes was built on the other core (docs/performance.md, the sixth round).
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zlib
from collections import Counter, deque
from pathlib import Path
from typing import Any

from tools.poll_loop_cpu import IdleSource

ROOT = Path(__file__).resolve().parents[1]
FETCH = 2000
"""Messages of one partition a fake fetch holds (about what librdkafka hands out of one fetch here)."""


class PreloadedSource(IdleSource):
    """FAKE Source (``tools.poll_loop_cpu``'s, whose commits succeed, asynchronous ones confirmed in the next
    ``consume`` as librdkafka does): every partition assigned at the first ``consume``, its preloaded messages
    handed out a fetch at a time, partition after partition."""

    def __init__(self, by_partition: dict[tuple[str, int], list[Any]]) -> None:
        super().__init__(0, by_partition)
        self.partition_ids = list(by_partition)
        self._order = deque(self.pending)
        self._left_in_fetch = FETCH

    def consume(self, max_messages, timeout):
        self.serve_callbacks()
        out: list[Any] = []
        for _ in range(len(self._order)):
            pid = self._order[0]
            messages = self.pending[pid]
            if pid not in self.paused:
                while messages and self._left_in_fetch and len(out) < max_messages:
                    out.append(messages.popleft())
                    self._left_in_fetch -= 1
            if len(out) >= max_messages:
                break
            self._order.rotate(-1)
            self._left_in_fetch = FETCH
        if not out and timeout:
            time.sleep(min(timeout, 0.001))
        return out


def measure(
    messages: int, partitions: int, keys: int, workers: int, batch: int, verbose: bool = False
) -> dict[str, float]:
    """Run the probe with whichever ``keyorder`` this process imports."""
    from keyorder.core.retry import RetryPolicy
    from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSettings
    from keyorder.engine.worker_pools import Completions, ThreadWorkerPool
    from keyorder.message import Message

    rng = random.Random(7)
    by_partition: dict[tuple[str, int], list[Any]] = {("t", p): [] for p in range(partitions)}
    sequences: Counter[bytes] = Counter()
    for _ in range(messages):
        key = b"key-%d" % rng.randrange(keys)
        partition = by_partition[("t", zlib.crc32(key) % partitions)]
        value = json.dumps({"seq": sequences[key]}).encode()
        sequences[key] += 1
        partition.append(Message("t", 0, len(partition), key, value))
    for (_topic, number), listed in by_partition.items():
        for message in listed:
            message.partition = number
    source = PreloadedSource(by_partition)
    gc.collect()
    gc.freeze()  # the preloaded messages are the harness's, not the pod's: keep them out of its collections
    seen: dict[bytes, int] = {}
    violations = [0]

    def check(message: Any) -> None:
        seq = json.loads(message.value)["seq"]
        if seen.get(message.key, -1) != seq - 1:
            violations[0] += 1
        seen[message.key] = seq

    def per_message(message: Any) -> None:
        check(message)

    def per_batch(listed: Any) -> None:
        for message in listed:
            check(message)

    kwargs: dict[str, Any] = {}
    if batch:
        from keyorder.batch import BatchLimits

        kwargs["batch"] = BatchLimits(batch, 0.0)
    completions = Completions()
    pool = ThreadWorkerPool(per_batch if batch else per_message, workers, RetryPolicy(), None, completions, **kwargs)
    runtime = ConsumerRuntime(RuntimeSettings(topics=("t",)), source, pool, "key", completions)
    source.on_commit_result = runtime.record_commit_outcomes
    stop = threading.Event()
    thread = threading.Thread(target=runtime.run, args=(stop,), daemon=True)
    cpu, wall = time.process_time(), time.monotonic()
    thread.start()
    while not runtime.started.is_set():
        time.sleep(0.001)
    before = _thread_cpu()
    while sum(state.completed for state in list(runtime.partitions.values())) < messages:
        time.sleep(0.001)
    cpu, wall = time.process_time() - cpu, time.monotonic() - wall
    by_thread = {name: seconds - before.get(name, 0.0) for name, seconds in _thread_cpu().items()}
    snapshot = runtime.snapshot
    stats = pool.stats()  # live objects: read them before the stop folds the workers' into the retired ones
    reasons = sum((Counter(stat.batches) for stat in stats[1:]), Counter(stats[0].batches))
    calls = sum(stat.batch_sizes.count for stat in stats)
    in_calls = sum(stat.batch_sizes.total for stat in stats)
    stop.set()
    thread.join(30)
    if verbose:
        print(
            f"{calls} batch calls ({in_calls / calls if calls else 0:.1f} messages a call), by reason "
            f"{dict(reasons)}, holds {snapshot.holds}, "
            f"reading {snapshot.reading_seconds:.2f} s, waiting {snapshot.waiting_seconds:.2f} s",
            file=sys.stderr,
        )
    if violations[0] or len(seen) == 0:
        raise SystemExit(f"order violations: {violations[0]}")
    poll = by_thread.get(thread.name, 0.0)
    return {
        "cpu_us_per_message": cpu / messages * 1e6,
        "rate": messages / wall,
        "poll_us_per_message": poll / messages * 1e6,
        "workers_us_per_message": sum(
            seconds for name, seconds in by_thread.items() if name.startswith("keyorder-worker")
        )
        / messages
        * 1e6,
    }


def _thread_cpu() -> dict[str, float]:
    """CPU seconds of each thread of this process so far, by thread name (``/proc``; Linux only)."""
    names = {thread.native_id: thread.name for thread in threading.enumerate()}
    ticks = os.sysconf("SC_CLK_TCK")
    seconds: Counter[str] = Counter()
    for task in Path("/proc/self/task").iterdir():
        fields = (task / "stat").read_text().rpartition(")")[2].split()
        seconds[names.get(int(task.name), "other")] += (int(fields[11]) + int(fields[12])) / ticks
    return dict(seconds)


def _run_commit(commit: str, arguments: list[str]) -> dict[str, float]:
    """This probe on ``commit``'s ``consumer/`` (its package, this probe's code), in a child process."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "consumer"], capture_output=True, check=True)
    with tempfile.TemporaryDirectory(prefix="pod-path-") as directory:
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(directory, filter="data")
        return _child(Path(directory) / "consumer", arguments)


def _child(consumer: Path, arguments: list[str]) -> dict[str, float]:
    environment = {**os.environ, "PYTHONPATH": f"{consumer}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        [sys.executable, "-m", "tools.pod_path_cpu", "--json", *arguments],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def _figures(run: dict[str, float]) -> str:
    return f"{run['cpu_us_per_message']:.2f} µs/msg, {run['rate']:,.0f} msg/s"


def _medians(runs: tuple[dict[str, float], ...]) -> dict[str, float]:
    return {name: statistics.median(run[name] for run in runs) for name in runs[0]}


def _against(commit: str, arguments: list[str], rounds: int) -> None:
    """This probe on ``commit``'s ``consumer/`` and on the working tree's, taking turns ``rounds`` times, each in a
    process of its own: this shared machine drifts by more than a change worth measuring, so one pair says little."""
    pairs = []
    for number in range(1, rounds + 1):
        before, after = _run_commit(commit, arguments), _child(ROOT / "consumer", arguments)
        pairs.append((before, after))
        print(f"round {number}/{rounds}: {commit} {_figures(before)}; working tree {_figures(after)}", flush=True)
    before, after = map(_medians, zip(*pairs, strict=True))
    print(f"medians over {rounds} rounds: {commit} {_figures(before)}; working tree {_figures(after)}")
    print(f"after ÷ before (medians): CPU {after['cpu_us_per_message'] / before['cpu_us_per_message']:.2f} x, "
          f"rate {after['rate'] / before['rate']:.2f} x")  # fmt: skip


def _profile(arguments: list[str]) -> None:
    with tempfile.NamedTemporaryFile(suffix=".txt") as out:
        subprocess.run(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--gil", "--format", "raw", "--rate", "500",
             "-o", out.name, "--", sys.executable, "-m", "tools.pod_path_cpu", *arguments],
            cwd=ROOT, check=True, capture_output=True,
        )  # fmt: skip
        own: Counter[str] = Counter()
        total = 0
        for line in Path(out.name).read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            frames = stack.split(";")
            if any("sleep" in frame or "wait (" in frame for frame in frames[-2:]):
                continue  # waiting, not working
            total += int(count)
            own[frames[-1]] += int(count)
        for frame, count in own.most_common(40):
            print(f"{count / total:6.1%}  {frame}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--batch", type=int, default=100, help="most messages per batch call (0: per message)")
    parser.add_argument("--runs", type=int, default=3, help="runs; the best is reported")
    parser.add_argument("--against", help="run the same on this commit's consumer/ first")
    parser.add_argument("--rounds", type=int, default=1, help="with --against: turns on each, the medians compared")
    parser.add_argument("--profile", action="store_true", help="sample one run with py-spy")
    parser.add_argument("--verbose", action="store_true", help="print each run's batch calls, reasons and holds")
    parser.add_argument("--pin", type=int, help="run every thread of the probe on this one CPU (sched_setaffinity)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    shape = ["--messages", str(options.messages), "--partitions", str(options.partitions), "--keys",
             str(options.keys), "--workers", str(options.workers), "--batch", str(options.batch)]  # fmt: skip
    if options.pin is not None:
        os.sched_setaffinity(0, {options.pin})  # before any thread starts: they inherit it
        shape += ["--pin", str(options.pin)]
    if options.profile:
        _profile([*shape, "--runs", "1"])
        return
    if options.against:
        _against(options.against, [*shape, "--runs", str(options.runs)], options.rounds)
        return
    shape_of_run = (options.messages, options.partitions, options.keys, options.workers, options.batch)
    runs = [measure(*shape_of_run, options.verbose) for _ in range(options.runs)]
    best = min(runs, key=lambda run: run["cpu_us_per_message"])
    if options.json:
        print(json.dumps(best))
        return
    for number, run in enumerate(runs, 1):
        print(
            f"run {number}: {run['cpu_us_per_message']:.2f} µs of CPU a message (poll thread "
            f"{run['poll_us_per_message']:.2f}, workers {run['workers_us_per_message']:.2f}), {run['rate']:,.0f} msg/s"
        )


if __name__ == "__main__":
    main()
