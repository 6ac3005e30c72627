"""``keyorder bench``: key-ordered throughput against the partition-ordered baseline and the ideal.

One command, on the user's own machine: it starts the embedded broker, preloads N messages over
K keys and P partitions (each carrying its key's sequence number), then consumes the very same
data once per run — the partition-ordered baseline (one worker per partition: what RocketMQ
orderly or a plain Kafka consumer gives), key mode at several W (thread and asyncio workers), and
unordered — each with a fresh consumer group. Every run counts per-key order violations.

Figures compared in the report come from one invocation, as ratios, because shared machines are
noisy. Results: a JSON report, a PNG plot of throughput against W, and a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import threading
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path

from keyorder.config import RunConfig
from keyorder.core import offset_metadata
from keyorder.devtools.bench_report import (
    BenchReport,
    RunResult,
    fill_ratios,
    histogram_percentile,
    markdown_table,
    plot,
)
from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker
from keyorder.devtools.loadgen import create_topics, produce_keyed
from keyorder.logs import configure_logging
from keyorder.progress import Progress

CPU_LOOP = 2_000
STEADY_STATE_FRACTION = 0.9
"""A run's window ends at 90% of the backlog (or ``run_seconds``): the last keys to drain sit on the
busiest workers, and that tail says nothing about steady-state throughput."""


@dataclass(frozen=True)
class RunSpec:
    name: str
    mode: str  # "partition" | "key" | "unordered"
    handler: str  # "sleep" | "async-sleep" | "noop" | "cpu"
    workers: int


@dataclass(frozen=True)
class Preset:
    messages: int
    keys: int
    partitions: int
    latency_ms: float
    run_seconds: float
    runs: tuple[RunSpec, ...]
    memory_check: bool


def _sleep_runs(sync_widths, async_widths, unordered_width, partitions) -> list[RunSpec]:
    runs = [RunSpec("partition baseline", "partition", "sleep", partitions)]
    runs += [RunSpec(f"key W={w}", "key", "sleep", w) for w in sync_widths]
    runs += [RunSpec(f"key async W={w}", "key", "async-sleep", w) for w in async_widths]
    if unordered_width:
        runs.append(RunSpec(f"unordered W={unordered_width}", "unordered", "sleep", unordered_width))
    return runs


PRESETS = {
    "quick": Preset(
        messages=20_000,
        keys=10_000,
        partitions=4,
        latency_ms=10,
        run_seconds=4,
        memory_check=False,
        runs=(*_sleep_runs([64], [256], 0, 4), RunSpec("key W=16 no-op", "key", "noop", 16)),
    ),
    "full": Preset(
        messages=200_000,
        keys=10_000,
        partitions=4,
        latency_ms=10,
        run_seconds=10,
        memory_check=True,
        runs=(
            *_sleep_runs([1, 4, 16, 64, 256], [64, 256, 1024], 256, 4),
            RunSpec("partition baseline no-op", "partition", "noop", 4),
            RunSpec("key W=16 no-op", "key", "noop", 16),
            RunSpec("partition baseline cpu", "partition", "cpu", 4),
            RunSpec("key W=4 cpu", "key", "cpu", 4),
        ),
    ),
}


class OrderCheck:
    """Per-key sequence check inside the handler. Same-key calls never overlap (that is what is
    being tested), so each key's entry is only touched by one thread at a time."""

    def __init__(self) -> None:
        self.next_sequence: dict[bytes, int] = {}
        self.violations: list[tuple[bytes, int, int]] = []

    def see(self, key: bytes, value: bytes) -> None:
        sequence = json.loads(value)["seq"]
        expected = self.next_sequence.get(key, 0)
        if sequence != expected:
            self.violations.append((key, expected, sequence))
        self.next_sequence[key] = sequence + 1


def make_handler(kind: str, latency: float, check: OrderCheck):
    if kind == "sleep":

        def handler(message):
            time.sleep(latency)
            check.see(message.key, message.value)
    elif kind == "async-sleep":

        async def handler(message):
            await asyncio.sleep(latency)
            check.see(message.key, message.value)
    elif kind == "noop":

        def handler(message):
            check.see(message.key, message.value)
    elif kind == "cpu":

        def handler(message):
            total = 0
            for number in range(CPU_LOOP):
                total += number * number
            check.see(message.key, message.value)
    else:
        raise ValueError(f"unknown handler kind {kind!r}")
    return handler


def rss_mb() -> float:
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6
    except OSError:  # not Linux: fall back to the lifetime peak
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


class Runner:
    def __init__(self, bootstrap: str, topic: str, preset: Preset, progress: Progress) -> None:
        self.bootstrap, self.topic, self.preset, self.progress = bootstrap, topic, preset, progress

    def _pod(self, spec: RunSpec, handler, topic: str | None = None):
        from keyorder.pod import Pod

        config = RunConfig(
            handler="keyorder.devtools.bench:unused",
            topics=[topic or self.topic],
            group_id=f"bench-{uuid.uuid4().hex}",
            bootstrap_servers=self.bootstrap,
            ordering=spec.mode,
            workers=spec.workers,
            max_workers=max(spec.workers, 4096),
            on_exhausted="block",
            shutdown_grace=0.5,
            kafka_property=FAST_GROUP_JOIN,
        )
        return Pod(config, handler=handler, serve_http=False)

    def run(self, spec: RunSpec, label: str) -> RunResult:
        preset = self.preset
        check = OrderCheck()
        pod = self._pod(spec, make_handler(spec.handler, preset.latency_ms / 1000.0, check))
        stop = threading.Event()
        thread = pod.start_in_thread(stop)

        def processed() -> int:
            return sum(stats.processed for stats in pod.pool.stats())

        deadline = time.monotonic() + 60
        while processed() == 0 and time.monotonic() < deadline:
            self.progress.show(f"{label} {spec.name}: joining the group")
            time.sleep(0.02)
        started, cpu_started, first = time.monotonic(), time.process_time(), processed()
        peak_rss, peak_inflight = rss_mb(), 0
        while True:
            time.sleep(0.05)
            now, done = time.monotonic(), processed()
            peak_rss, peak_inflight = max(peak_rss, rss_mb()), max(peak_inflight, pod.runtime.inflight)
            elapsed = now - started
            rate = (done - first) / max(elapsed, 1e-9)
            self.progress.show(f"{label} {spec.name}: {done:,} handled, {rate:,.0f} msg/s")
            if done >= STEADY_STATE_FRACTION * preset.messages or elapsed >= preset.run_seconds:
                break
        seconds, cpu = time.monotonic() - started, time.process_time() - cpu_started
        handled = processed() - first
        stop.set()
        thread.join(30)
        buckets = [0] * len(pod.pool.stats()[0].latency.buckets)
        for stats in pod.pool.stats():
            buckets = [a + b for a, b in zip(buckets, stats.latency.buckets, strict=True)]
        p50, p99 = histogram_percentile(buckets, 0.5), histogram_percentile(buckets, 0.99)
        return RunResult(
            name=spec.name,
            mode=spec.mode,
            handler=spec.handler,
            workers=spec.workers,
            messages=handled,
            seconds=round(seconds, 3),
            rate=handled / seconds if seconds else 0.0,
            cpu_us_per_message=cpu / handled * 1e6 if handled else 0.0,
            p50_ms=p50 * 1000 if p50 is not None else None,
            p99_ms=p99 * 1000 if p99 is not None else None,
            peak_rss_mb=round(peak_rss, 1),
            peak_inflight=peak_inflight,
            order_violations=len(check.violations),
        )

    def memory(self, topic: str) -> RunResult:
        """10,000 messages of 1 KB held in flight by a slow handler: the pod's peak RSS."""
        check = OrderCheck()
        spec = RunSpec("memory: 10,000 x 1 KB in flight", "key", "sleep", 64)
        pod = self._pod(spec, make_handler("sleep", 1.0, check), topic=topic)
        stop = threading.Event()
        thread = pod.start_in_thread(stop)
        deadline, peak_rss, peak_inflight = time.monotonic() + 30, rss_mb(), 0
        while time.monotonic() < deadline and peak_inflight < 9_900:
            time.sleep(0.1)
            peak_rss, peak_inflight = max(peak_rss, rss_mb()), max(peak_inflight, pod.runtime.inflight)
            self.progress.show(f"memory: {peak_inflight:,} in flight, RSS {peak_rss:.0f} MB")
        for _ in range(10):  # keep sampling for a second at the plateau
            time.sleep(0.1)
            peak_rss = max(peak_rss, rss_mb())
        stop.set()
        thread.join(30)
        return RunResult(
            name=spec.name,
            mode="key",
            handler="sleep-1s",
            workers=64,
            messages=0,
            seconds=0,
            rate=0,
            cpu_us_per_message=0,
            p50_ms=None,
            p99_ms=None,
            peak_rss_mb=round(peak_rss, 1),
            peak_inflight=peak_inflight,
            order_violations=len(check.violations),
        )


def worst_commit_metadata_bytes(inflight: int = 10_000, seed: int = 1) -> int:
    """Commit metadata size with ``inflight`` offsets above a stuck first one, of which a random
    half are done (the incompressible case; all done compresses to a few bytes)."""
    import random

    rng = random.Random(seed)
    base = 1_000_000
    done = [offset for offset in range(base + 1, base + 1 + inflight) if rng.random() < 0.5]
    return len(offset_metadata.encode(base, done))


def machine() -> dict:
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def add_bench_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="CI smoke preset (< 2 minutes); checks the floors")
    parser.add_argument("--messages", type=int, help="preloaded messages (default: preset)")
    parser.add_argument("--keys", type=int, help="distinct keys (default: preset, 10000)")
    parser.add_argument("--partitions", type=int, help="partitions (default: preset, 4)")
    parser.add_argument("--latency-ms", type=float, help="simulated handler latency L (default: 10)")
    parser.add_argument("--run-seconds", type=float, help="longest measurement window per run")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("bench-results"),
        help="where report.json, throughput.png and table.md go [default: bench-results]",
    )


def bench_command(args: argparse.Namespace) -> int:
    configure_logging("WARNING")
    preset = PRESETS["quick" if args.quick else "full"]
    overrides = {
        name: getattr(args, name)
        for name in ("messages", "keys", "partitions", "latency_ms", "run_seconds")
        if getattr(args, name) is not None
    }
    preset = replace(preset, **overrides)
    if preset.partitions > min(spec.workers for spec in preset.runs if spec.mode == "partition"):
        preset = replace(
            preset,
            runs=tuple(
                replace(spec, workers=preset.partitions) if spec.mode == "partition" else spec for spec in preset.runs
            ),
        )
    progress = Progress()
    report = BenchReport(
        machine=machine(),
        parameters={
            "preset": "quick" if args.quick else "full",
            "messages": preset.messages,
            "keys": preset.keys,
            "partitions": preset.partitions,
            "latency_ms": preset.latency_ms,
            "run_seconds": preset.run_seconds,
            "command": "keyorder bench" + (" --quick" if args.quick else ""),
        },
    )
    report.commit_metadata_bytes = worst_commit_metadata_bytes()
    print(
        f"keyorder bench: {preset.messages:,} messages, {preset.keys:,} keys, {preset.partitions} partitions, "
        f"L = {preset.latency_ms:g} ms, {len(preset.runs)} runs"
    )
    with EmbeddedBroker() as broker:
        topic = "bench"
        create_topics(broker.bootstrap, [topic], preset.partitions)
        produce_keyed(
            broker.bootstrap,
            topic,
            preset.messages,
            preset.keys,
            progress=lambda n: progress.show(f"preloading {n:,}/{preset.messages:,}"),
        )
        progress.done()
        runner = Runner(broker.bootstrap, topic, preset, progress)
        if preset.memory_check:
            create_topics(broker.bootstrap, ["bench-1kb"], preset.partitions)
            produce_keyed(broker.bootstrap, "bench-1kb", 12_000, preset.keys, value_bytes=1024)
            report.runs.append(runner.memory("bench-1kb"))
            progress.done()
        for index, spec in enumerate(preset.runs, start=1):
            result = runner.run(spec, f"[{index}/{len(preset.runs)}]")
            report.runs.append(result)
            progress.done()
            print(f"  {spec.name:<28} {result.rate:>10,.0f} msg/s   violations {result.order_violations}")
    measured = [run for run in report.runs if run.messages]
    fill_ratios(measured, preset.keys, preset.latency_ms / 1000.0)
    report.targets = evaluate_targets(report, quick=args.quick)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "report.json").write_text(report.to_json())
    (args.output_dir / "table.md").write_text(markdown_table(report.runs))
    image = plot(report, args.output_dir / "throughput.png")
    print()
    print(markdown_table(report.runs))
    print(
        f"commit metadata, 10,000 in flight above a stuck offset, random half done: "
        f"{report.commit_metadata_bytes} bytes"
    )
    for name, outcome in report.targets.items():
        print(f"  {'PASS' if outcome['ok'] else 'MISS'}  {name}: {outcome['detail']}")
    print(f"report: {args.output_dir / 'report.json'}" + (f", plot: {image}" if image else " (no matplotlib: no plot)"))
    failed = [name for name, outcome in report.targets.items() if outcome["required"] and not outcome["ok"]]
    if failed:
        print(f"keyorder bench: FAILED {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def evaluate_targets(report: BenchReport, quick: bool) -> dict:
    """The issue's targets. Correctness is always required; the quick preset's smoke floor too."""
    runs = {run.name: run for run in report.runs}
    targets: dict[str, dict] = {}
    violations = sum(run.order_violations for run in report.runs if run.mode != "unordered")
    targets["zero per-key order violations (ordered modes)"] = {
        "ok": violations == 0,
        "required": True,
        "detail": f"{violations} violations",
    }
    key64, baseline = runs.get("key W=64"), runs.get("partition baseline")
    if key64 and baseline:
        ratio = key64.rate / baseline.rate if baseline.rate else float("inf")
        targets["key W=64 > 4x partition baseline (smoke floor)"] = {
            "ok": ratio > 4,
            "required": True,
            "detail": f"{ratio:.1f}x",
        }
        targets["key W=64 >= 12x partition baseline"] = {
            "ok": ratio >= 12,
            "required": False,
            "detail": f"{ratio:.1f}x",
        }
        if key64.ratio_to_ideal is not None:
            targets["key W=64 >= 0.8 x ideal and >= 5,000 msg/s"] = {
                "ok": key64.ratio_to_ideal >= 0.8 and key64.rate >= 5_000,
                "required": False,
                "detail": f"{key64.ratio_to_ideal:.2f} x ideal, {key64.rate:,.0f} msg/s",
            }
    if "key async W=1024" in runs:
        rate = runs["key async W=1024"].rate
        targets["async W=1024 >= 20,000 msg/s"] = {
            "ok": rate >= 20_000,
            "required": False,
            "detail": f"{rate:,.0f} msg/s",
        }
    if "key W=16 no-op" in runs:
        noop = runs["key W=16 no-op"]
        targets["no-op >= 50,000 msg/s (<= 20 us CPU/msg)"] = {
            "ok": noop.rate >= 50_000,
            "required": False,
            "detail": f"{noop.rate:,.0f} msg/s, {noop.cpu_us_per_message:.1f} us CPU/msg",
        }
    memory = runs.get("memory: 10,000 x 1 KB in flight")
    if memory:
        targets["peak RSS <= 250 MB with 10,000 x 1 KB in flight"] = {
            "ok": memory.peak_rss_mb <= 250,
            "required": False,
            "detail": f"{memory.peak_rss_mb:.0f} MB at {memory.peak_inflight:,} in flight",
        }
    if report.commit_metadata_bytes is not None:
        targets["commit metadata <= 4 KB (10,000 in flight, stuck first offset, random half done)"] = {
            "ok": report.commit_metadata_bytes <= 4096,
            "required": True,
            "detail": f"{report.commit_metadata_bytes} bytes",
        }
    return targets
