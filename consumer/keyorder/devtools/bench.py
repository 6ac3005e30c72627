"""``keyorder bench``: key-ordered throughput against the partition-ordered baseline and the ideal.

One command, on the user's own machine: it starts the embedded broker, preloads N messages over
K keys and P partitions (each carrying its key's sequence number), then consumes the very same
data once per run — the partition-ordered baseline (one worker per partition: what RocketMQ
orderly or a plain Kafka consumer gives), key mode at several W (thread and asyncio workers), and
unordered — each with a fresh consumer group. Every run counts per-key order violations.

Fast handlers (issue 40) get rows of their own beside the per-message ones: a pure no-op, the
no-op that checks order (a small recording handler, no lock), the same recording under one lock
all workers share, a no-op batch handler (one call at a time, and 16), and a sink whose call
costs 0.3 ms plus 3 µs a message, called per message and in batches, on threads and on worker
processes.

Uniform traffic over many keys flatters a scheduler, so four scenarios follow, each on its own
preloaded topic: few keys (fewer active keys than a wide pool), a live resize under backlog, one
hot key, and the raw ceiling (a plain confluent-kafka loop, no keyorder) the no-op runs are put
against, measured warm: a first pass discarded, then the best of three, with their spread. They
check per-key order too.

Figures compared in the report come from one invocation, as ratios, because shared machines are
noisy, and a 2-core VM drifts by 1.5-2 x over minutes: so the rows an issue-40 target compares are
measured as the raw loop is (best of three passes, their spread printed) and close in time, their
passes taking turns (``pass_order``): the raw loop's with the no-op batch row's (the raw ceiling is
then measured there, not among the scenarios), the per-message sink's with the batched sink's.

Results: a JSON report, PNG plots (throughput against W; throughput over time around the
resize), and Markdown tables.

Why one room of over 600 lines: every row of the benchmark runs through one ``Runner`` (the preloaded
topic, a fresh group, the order check, the timing), so their figures are comparable as ratios from one
invocation; the scenarios and ``evaluate_targets`` read the same runs. The pure arithmetic is already
apart (``bench_report``, the order of the passes too); the seam left is the scenarios and the targets,
apart from the runner.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from keyorder.adapters.cpu import pod_cpu_seconds
from keyorder.config import RunConfig
from keyorder.core import offset_metadata
from keyorder.devtools import bench_handlers
from keyorder.devtools.bench_plots import matplotlib_missing, plot, plot_comparisons, plot_resize
from keyorder.devtools.bench_report import (
    FAST_HANDLER_LATENCY,
    LOOK_AHEAD_NOTE,
    BenchReport,
    Comparison,
    FewKeysResult,
    HotKeyResult,
    Pass,
    RawCeilingResult,
    ResizeResult,
    RunResult,
    best_of_passes,
    fill_ratios,
    histogram_percentile,
    ideal_rate,
    interleave,
    markdown_table,
    raw_ceiling_of,
    raw_ceiling_summary,
    regressions,
    resize_figures,
    scenarios_table,
    split_by_hot_partition,
    spread_suffix,
)
from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker
from keyorder.devtools.loadgen import ProducedLog, create_topics, key_name, produce_keyed
from keyorder.engine.worker_pools import Completions
from keyorder.logs import configure_logging
from keyorder.progress import Progress

CPU_LOOP = 2_000
STEADY_STATE_FRACTION = 0.9
"""A run's window ends at 90% of the backlog (or ``run_seconds``): the last keys to drain sit on the
busiest workers, and that tail says nothing about steady-state throughput."""

Handler = Callable[[Any], Any]

FEW_KEYS, FEW_KEYS_WORKERS = 200, 64
RESIZE_KEYS, RESIZE_FROM, RESIZE_TO = 200, 4, 32
RESIZE_WINDOW = 0.5
"""Seconds of the trailing window the resize throughput is sampled over (every ``RESIZE_SAMPLE``)."""
RESIZE_SAMPLE = 0.1
RESIZE_TARGET_FRACTION, RESIZE_TARGET_SECONDS = 0.8, 3.0
HOT_KEY_SHARE, HOT_KEY_OTHERS, HOT_KEY_WORKERS = 0.4, 1_000, 32
NOOP_RUN = "key W=16 no-op"
"""The run put against the raw confluent-kafka ceiling."""
FAST_RUN = "key W=16 fast"
"""A handler of a few hundred microseconds (``FAST_HANDLER_LATENCY``), against its ideal and the raw ceiling."""
PURE_RUN = "key W=16 pure no-op"
"""Does nothing but keep a reference to the message; its order is checked after the run."""
LOCKED_RUN = "key W=16 recording, one lock"
"""The no-op's parse and record under one lock shared by all workers (what a harness that collects
every ``(key, seq)`` in one list under a lock pays)."""
BATCH_SIZE = 100
"""``--batch-max-messages`` of the batch rows."""
NOOP_BATCH_WORKERS = 1
"""W of the no-op batch row put against the raw loop: one call at a time, as the raw loop is one thread.
The no-op's calls are pure CPU, and the pod's threads share one GIL, so more calls at a time run no more
of them: they only add GIL hand-offs (16 threads contending cost up to 15% of the rate here;
``WIDE_NOOP_BATCH_RUN`` shows it beside)."""
NOOP_BATCH_RUN = f"key W={NOOP_BATCH_WORKERS} no-op batch {BATCH_SIZE}"
"""The no-op's work (parse and order check) per message, one call per batch: against the raw loop."""
WIDE_NOOP_BATCH_RUN = f"key W=16 no-op batch {BATCH_SIZE}"
"""The same at W=16, one pass, compared with nothing: what a CPU-bound batch handler loses to the GIL
when many threads call it at once."""
SINK_WORKERS = 8
"""W of the sink rows: calls to the sink at a time (a database's connection pool)."""
SINK_PAIRS = tuple(
    (f"key W={SINK_WORKERS} sink {executor}", f"key W={SINK_WORKERS} sink batch {BATCH_SIZE} {executor}")
    for executor in ("thread", "process")
)
"""(per message, batched) names of the sink rows, per executor."""
RAW_LOOP = "raw confluent-kafka loop"
"""The raw loop's name in the order of passes and on the console."""
COMPARED_PASSES = 3
"""Measured passes of the rows a target compares (the no-op batch and the sink rows): as many as the raw loop's."""


@dataclass(frozen=True)
class RunSpec:
    name: str
    mode: str  # "partition" | "key" | "unordered"
    handler: str  # "sleep" | "async-sleep" | "noop" | "pure" | "recording-lock" | "noop-batch" | "fast" | "cpu" | ...
    workers: int
    executor: str = "auto"
    """Not ``auto``: the pod imports ``bench_handlers.<handler>`` by path with this ``--executor``."""
    batch: int = 1
    """``--batch-max-messages``: above 1 the handler takes a list of messages."""
    passes: int = 1
    """Measured passes, each a fresh group over the same messages; the row's figure is its best pass, by
    rate, the others its spread; order violations are summed over all passes."""


@dataclass(frozen=True)
class ScenarioSizes:
    """Backlogs and windows of the scenarios; each backlog outlasts its measurement at the ideal rate."""

    few_keys_messages: int
    resize_messages: int
    resize_before_seconds: float
    """Steady throughput measured at W=4 before the resize."""
    resize_after_seconds: float
    hot_key_messages: int
    hot_key_timeout: float
    """Longest wait for the non-hot keys to finish, from the first handler call."""


@dataclass(frozen=True)
class Preset:
    messages: int
    keys: int
    partitions: int
    latency_ms: float
    run_seconds: float
    runs: tuple[RunSpec, ...]
    memory_check: bool
    scenarios: ScenarioSizes
    with_scenarios: bool = True
    only_raw_ceiling: bool = False
    """Of the scenarios, run only the raw ceiling (``--ceiling``)."""
    process_hop: bool = False
    """Measure the process executor's per-message costs (``process_hop_figures``)."""
    raw_passes: int = 3
    """Measured passes of the raw loop (its rate: the best of them)."""
    raw_warmup: bool = True
    """Run one raw pass first and discard it."""


def _sleep_runs(sync_widths, async_widths, unordered_width, partitions) -> list[RunSpec]:
    runs = [RunSpec("partition baseline", "partition", "sleep", partitions)]
    runs += [RunSpec(f"key W={w}", "key", "sleep", w) for w in sync_widths]
    runs += [RunSpec(f"key async W={w}", "key", "async-sleep", w) for w in async_widths]
    if unordered_width:
        runs.append(RunSpec(f"unordered W={unordered_width}", "unordered", "sleep", unordered_width))
    return runs


EXECUTOR_RUNS = (
    RunSpec("key W=4 cpu thread", "key", "cpu", 4, executor="thread"),
    RunSpec("key W=2 cpu process", "key", "cpu", 2, executor="process"),
    RunSpec("key W=8 thread", "key", "sleep", 8, executor="thread"),
    RunSpec("key W=8 process", "key", "sleep", 8, executor="process"),
)
"""The process executor against the thread executor: the CPU-bound pair (2 processes against 4 threads, on
2 cores) and the IO-bound pair (the same W)."""
CPU_PAIR = ("key W=2 cpu process", "key W=4 cpu thread")
IO_PAIR = ("key W=8 process", "key W=8 thread")

FAST_RUNS = (
    RunSpec(PURE_RUN, "key", "pure", 16),
    RunSpec(NOOP_RUN, "key", "noop", 16),
    RunSpec(LOCKED_RUN, "key", "recording-lock", 16),
    RunSpec(NOOP_BATCH_RUN, "key", "noop-batch", NOOP_BATCH_WORKERS, batch=BATCH_SIZE, passes=COMPARED_PASSES),
    RunSpec(WIDE_NOOP_BATCH_RUN, "key", "noop-batch", 16, batch=BATCH_SIZE),
    RunSpec(FAST_RUN, "key", "fast", 16),
    *(
        RunSpec(name, "key", handler, SINK_WORKERS, executor=executor, batch=batch, passes=COMPARED_PASSES)
        for (single, batched), executor in zip(SINK_PAIRS, ("thread", "process"), strict=True)
        for name, handler, batch in ((single, "sink", 1), (batched, "sink_batch", BATCH_SIZE))
    ),
)
"""The fast-handler rows (issue 40), in the full bench and ``--ceiling``: the no-op family at W=16, the
no-op batch at W=1 (put against the raw loop) and at W=16, and the sink, per message and batched, on
threads and on worker processes (by path, as the executor rows). The rows a target compares run three
passes each, taking turns with what they are compared with (``pass_order``)."""

PRESETS = {
    "quick": Preset(
        messages=20_000,
        keys=10_000,
        partitions=4,
        latency_ms=10,
        run_seconds=3,
        memory_check=False,
        raw_passes=1,
        raw_warmup=False,
        runs=(
            *_sleep_runs([64], [256], 0, 4),
            RunSpec(NOOP_RUN, "key", "noop", 16),
            RunSpec("key W=2 cpu process", "key", "cpu", 2, executor="process"),
        ),
        scenarios=ScenarioSizes(
            few_keys_messages=6_000,
            resize_messages=20_000,
            resize_before_seconds=1.5,
            resize_after_seconds=4,
            hot_key_messages=6_000,
            hot_key_timeout=25,
        ),
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
            *FAST_RUNS,
            RunSpec("partition baseline cpu", "partition", "cpu", 4),
            RunSpec("key W=4 cpu", "key", "cpu", 4),
            *EXECUTOR_RUNS,
        ),
        process_hop=True,
        scenarios=ScenarioSizes(
            few_keys_messages=20_000,
            resize_messages=40_000,
            resize_before_seconds=4,
            resize_after_seconds=8,
            hot_key_messages=20_000,
            hot_key_timeout=90,
        ),
    ),
}
PRESETS["executors"] = replace(
    PRESETS["full"], runs=EXECUTOR_RUNS, memory_check=False, with_scenarios=False, process_hop=True
)
"""``keyorder bench --executors``: only the executor comparison and the process hop's costs."""
PRESETS["ceiling"] = replace(
    PRESETS["full"],
    runs=FAST_RUNS,
    memory_check=False,
    only_raw_ceiling=True,
)
"""``keyorder bench --ceiling``: only the fast-handler rows against the raw consume loop, in one run."""


def raw_beside_rows(preset: Preset) -> bool:
    """Whether the raw loop is measured among the rows, its passes taking turns with the no-op batch
    row's (which is put against it), rather than as the first scenario."""
    return preset.with_scenarios and any(spec.name == NOOP_BATCH_RUN for spec in preset.runs)


def pass_order(preset: Preset) -> list[Pass]:
    """Every pass of the preset's rows, in the order they run: the rows as defined, except that the rows
    compared with each other take turns (``bench_report.interleave``), so that drift hits them alike:
    each sink pair (per message, batched), and, when ``raw_beside_rows``, the raw loop (its warm-up
    pass first) with the no-op batch row, where that row is defined."""
    rows = [(spec.name, spec.passes) for spec in preset.runs]
    groups: list[tuple[str, ...]] = list(SINK_PAIRS)
    warmups: tuple[str, ...] = ()
    if raw_beside_rows(preset):
        rows.insert([name for name, _passes in rows].index(NOOP_BATCH_RUN), (RAW_LOOP, preset.raw_passes))
        groups.append((RAW_LOOP, NOOP_BATCH_RUN))
        warmups = (RAW_LOOP,) if preset.raw_warmup else ()
    return interleave(rows, groups, warmups)


def pass_line(label: str, step: Pass, rate: float, violations: int) -> str:
    """One pass of a row measured several times, on the console, as it ends."""
    discarded = " (discarded)" if step.number == 0 else ""
    return f"    {label} {step.name}, {step.text}: {rate:,.0f} msg/s{discarded}   violations {violations}"


def row_line(result: RunResult) -> str:
    """A measured row on the console: its rate (the best pass, and the spread of several), its order
    violations and, for a batch handler, its batches."""
    batching = "" if result.mean_batch is None else f"   mean batch {result.mean_batch:.1f} {result.batch_reasons}"
    return (
        f"  {result.name:<36} {result.rate:>10,.0f} msg/s{spread_suffix(result.pass_rates)}   "
        f"violations {result.order_violations}{batching}"
    )


class OrderCheck:
    """Per-key sequence check inside the handler. Same-key calls never overlap (that is what is
    being tested), so each key's entry is only touched by one thread at a time.

    Handlers that should not pay for the check note what they saw instead (``unparsed``: the raw
    ``(key, value)``; ``recorded``: ``(key, seq)``), in call order, and ``settle`` checks it after the
    run: a key's calls never overlap, so a key's entries are appended in the order its calls ran."""

    def __init__(self) -> None:
        self.next_sequence: dict[bytes, int] = {}
        self.violations: list[tuple[bytes, int, int]] = []
        self.unparsed: list[tuple[bytes, bytes]] = []
        self.recorded: list[tuple[bytes, int]] = []

    def see(self, key: bytes, value: bytes) -> None:
        self.see_sequence(key, json.loads(value)["seq"])

    def see_sequence(self, key: bytes, sequence: int) -> None:
        expected = self.next_sequence.get(key, 0)
        if sequence != expected:
            self.violations.append((key, expected, sequence))
        self.next_sequence[key] = sequence + 1

    def settle(self) -> None:
        """Check what the handlers noted (after the run: the pod is stopped, nothing appends any more)."""
        for key, value in self.unparsed:
            self.see(key, value)
        for key, sequence in self.recorded:
            self.see_sequence(key, sequence)
        self.unparsed.clear()
        self.recorded.clear()


def make_handler(kind: str, latency: float, check: OrderCheck) -> Handler:
    """The simulated handler of a run: IO-bound (``sleep``, ``async-sleep``), free (``pure``, ``noop``,
    ``recording-lock``, ``noop-batch``: a list of messages), or CPU-bound; each checks per-key order
    after its work, or notes what it saw for ``OrderCheck.settle``."""

    def sleep_handler(message: Any) -> None:
        time.sleep(latency)
        check.see(message.key, message.value)

    async def async_sleep_handler(message: Any) -> None:
        await asyncio.sleep(latency)
        check.see(message.key, message.value)

    def noop_handler(message: Any) -> None:
        check.see(message.key, message.value)

    note = check.unparsed.append  # list.append is atomic under the GIL: the workers share it unlocked

    def pure_handler(message: Any) -> None:
        note((message.key, message.value))

    lock = threading.Lock()
    record = check.recorded.append

    def recording_lock_handler(message: Any) -> None:
        sequence = json.loads(message.value)["seq"]
        with lock:
            record((message.key, sequence))

    def noop_batch_handler(messages: list[Any]) -> None:
        for message in messages:
            check.see(message.key, message.value)

    def fast_handler(message: Any) -> None:
        time.sleep(FAST_HANDLER_LATENCY)
        check.see(message.key, message.value)

    def cpu_handler(message: Any) -> None:
        total = 0
        for number in range(CPU_LOOP):
            total += number * number
        check.see(message.key, message.value)

    handlers: dict[str, Handler] = {
        "sleep": sleep_handler,
        "async-sleep": async_sleep_handler,
        "noop": noop_handler,
        "pure": pure_handler,
        "recording-lock": recording_lock_handler,
        "noop-batch": noop_batch_handler,
        "fast": fast_handler,
        "cpu": cpu_handler,
    }
    if kind not in handlers:
        raise ValueError(f"unknown handler kind {kind!r}")
    return handlers[kind]


class HotKeyWatch:
    """The hot-key scenario's handler: sleeps L and checks order like ``sleep``, and notes when the
    first call started, each key's partition, and when the last message of every key finished.

    A key is finished once its next expected sequence equals its preloaded count; the counter of
    unfinished keys is shared by all workers, so it is updated under a lock (once per key). The
    per-key entries are only written by the one worker running that key at a time."""

    def __init__(self, latency: float, expected: dict[bytes, int], hot: bytes) -> None:
        self.latency, self.expected, self.hot = latency, expected, hot
        self.check = OrderCheck()
        self.unfinished_others = sum(1 for key in expected if key != hot)
        self.hot_handled = 0
        """Only ever touched by the one worker running the hot key at a time."""
        self.partitions: dict[bytes, int] = {}
        """Key -> the partition its messages came from (the hot key's is the hot partition)."""
        self.finished: dict[bytes, float] = {}
        """Key -> when its last message finished (monotonic clock)."""
        self.first_started: float | None = None
        self.others_finished: float | None = None
        self._lock = threading.Lock()

    def __call__(self, message: Any) -> None:
        if self.first_started is None:
            started = time.monotonic()
            with self._lock:
                if self.first_started is None:
                    self.first_started = started
        time.sleep(self.latency)
        key = message.key
        self.check.see(key, message.value)
        self.partitions[key] = message.partition
        if key == self.hot:
            self.hot_handled += 1
            return
        if self.check.next_sequence[key] == self.expected.get(key):
            finished = self.finished[key] = time.monotonic()
            with self._lock:
                self.unfinished_others -= 1
                if self.unfinished_others == 0:
                    self.others_finished = finished


def batch_figures(stats: Sequence[Any]) -> tuple[float | None, dict[str, int]]:
    """Messages per batch call, and calls by reason, over every worker's ``WorkerStats``."""
    calls = sum(worker.batch_sizes.count for worker in stats)
    messages = sum(worker.batch_sizes.total for worker in stats)
    reasons: dict[str, int] = {}
    for worker in stats:
        for reason, count in worker.batches.items():
            reasons[reason] = reasons.get(reason, 0) + count
    return (messages / calls if calls else None), reasons


def partition_inflight_bound(partitions: int) -> int:
    """The per-partition in-flight bound a bench pod (default limits) applies with ``partitions``
    assigned: the configured one capped at a fair share of the pod's, as its flow control does."""
    fields = RunConfig.model_fields
    per_pod = int(fields["max_inflight"].default)
    per_partition = int(fields["max_inflight_per_partition"].default)
    return max(1, min(per_partition, per_pod // max(partitions, 1)))


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

    def _pod(self, spec: RunSpec, handler: Handler | None, topic: str | None = None) -> Any:
        from keyorder.pod import Pod

        by_path = spec.executor != "auto"
        batching: dict[str, Any] = {}
        if spec.batch > 1:
            if "batch_max_messages" not in RunConfig.model_fields:
                raise RuntimeError(
                    f"the bench row {spec.name!r} needs --batch-max-messages (batch handlers), "
                    "which this keyorder does not have"
                )
            batching["batch_max_messages"] = spec.batch
        config = RunConfig(
            handler=f"keyorder.devtools.bench_handlers:{spec.handler}" if by_path else "keyorder.devtools.bench:unused",
            executor=spec.executor,
            handler_teardown="keyorder.devtools.bench_handlers:save" if by_path else None,
            topics=[topic or self.topic],
            group_id=f"bench-{uuid.uuid4().hex}",
            bootstrap_servers=self.bootstrap,
            ordering=spec.mode,
            workers=spec.workers,
            max_workers=max(spec.workers, 4096),
            on_exhausted="block",
            shutdown_grace=0.5,
            kafka_property=FAST_GROUP_JOIN,
            **batching,
        )
        return Pod(config, handler=None if by_path else handler, serve_http=False)

    @property
    def latency(self) -> float:
        return self.preset.latency_ms / 1000.0

    @staticmethod
    def _processed(pod: Any) -> int:
        return sum(stats.processed for stats in pod.pool.stats())

    def _await_first(self, pod: Any, text: str) -> None:
        """Wait (up to a minute) for the pod's first handled message: the group join is not measured."""
        deadline = time.monotonic() + 60
        while self._processed(pod) == 0 and time.monotonic() < deadline:
            self.progress.show(f"{text}: joining the group")
            time.sleep(0.02)

    def run(
        self, spec: RunSpec, label: str, topic: str | None = None, messages: int | None = None, pass_label: str = ""
    ) -> RunResult:
        """One pod over ``topic`` (default: the main one) holding ``messages`` (default: the preset's);
        ``pass_label`` (", pass 2/3") follows the row's name in the progress line."""
        preset = self.preset
        messages = messages or preset.messages
        check = OrderCheck()
        records = None
        if spec.executor != "auto":  # the handler runs by path, maybe in worker processes: they note the order
            records = Path(tempfile.mkdtemp(prefix="keyorder-bench-"))
            os.environ[bench_handlers.RECORDS_DIR_VARIABLE] = str(records)
            os.environ[bench_handlers.LATENCY_VARIABLE] = repr(self.latency)
            pod = self._pod(spec, None, topic=topic)
        else:
            pod = self._pod(spec, make_handler(spec.handler, self.latency, check), topic=topic)
        stop = threading.Event()
        thread = pod.start_in_thread(stop)

        def processed() -> int:
            return self._processed(pod)

        def cpu_seconds() -> float:  # the worker processes' CPU too
            return pod_cpu_seconds(pod.pool.worker_pids()) if records else time.process_time()

        self._await_first(pod, f"{label} {spec.name}{pass_label}")
        started, cpu_started, first = time.monotonic(), cpu_seconds(), processed()
        peak_rss, peak_inflight = rss_mb(), 0
        while True:
            time.sleep(0.05)
            now, done = time.monotonic(), processed()
            peak_rss, peak_inflight = max(peak_rss, rss_mb()), max(peak_inflight, pod.runtime.inflight)
            elapsed = now - started
            rate = (done - first) / max(elapsed, 1e-9)
            self.progress.show(f"{label} {spec.name}{pass_label}: {done:,} handled, {rate:,.0f} msg/s")
            if done >= STEADY_STATE_FRACTION * messages or elapsed >= preset.run_seconds:
                break
        seconds, cpu = time.monotonic() - started, cpu_seconds() - cpu_started
        handled = processed() - first
        stop.set()
        thread.join(30)
        check.settle()
        violations = len(check.violations)
        if records is not None:
            violations, _noted = bench_handlers.order_violations(records)
            shutil.rmtree(records, ignore_errors=True)
        buckets = [0] * len(pod.pool.stats()[0].latency.buckets)
        for stats in pod.pool.stats():
            buckets = [a + b for a, b in zip(buckets, stats.latency.buckets, strict=True)]
        p50, p99 = histogram_percentile(buckets, 0.5), histogram_percentile(buckets, 0.99)
        mean_batch, reasons = batch_figures(pod.pool.stats()) if spec.batch > 1 else (None, {})
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
            order_violations=violations,
            executor=spec.executor,
            batch=spec.batch,
            mean_batch=mean_batch,
            batch_reasons=reasons,
        )

    def measure(self, say: Callable[[str], None]) -> tuple[list[RunResult], RawCeilingResult | None]:
        """The preset's rows, pass by pass in ``pass_order``: each row's result is ``best_of_passes`` of its
        passes, in the order the rows are defined; the raw ceiling too when ``raw_beside_rows`` (else
        ``None``). ``say`` gets a console line per pass of a row measured several times, and one per row
        once its last pass ran."""
        runs = self.preset.runs
        specs = {spec.name: spec for spec in runs}
        labels = {spec.name: f"[{index}/{len(runs)}]" for index, spec in enumerate(runs, start=1)}
        labels[RAW_LOOP] = labels.get(NOOP_BATCH_RUN, "")
        passes: dict[str, list[RunResult]] = {}
        raw_passes: list[tuple[int, float, float, int]] = []
        raw_warmup: tuple[int, float, float, int] | None = None
        raw = None
        for step in pass_order(self.preset):
            label = labels[step.name]
            if step.name == RAW_LOOP:
                figures = self._raw_pass(f"{label} {RAW_LOOP}, {step.text}")
                self.progress.done()
                if step.number == 0:
                    raw_warmup = figures
                else:
                    raw_passes.append(figures)
                say(pass_line(label, step, figures[2], figures[3]))
                if step.last:
                    raw = raw_ceiling_of(raw_passes, raw_warmup)
                    say(f"  {RAW_LOOP:<36} {raw_ceiling_summary(raw)}   violations {raw.order_violations}")
                continue
            several = step.passes > 1
            result = self.run(specs[step.name], label, pass_label=f", {step.text}" if several else "")
            self.progress.done()
            if several:
                say(pass_line(label, step, result.rate, result.order_violations))
            passes.setdefault(step.name, []).append(result)
            if step.last:
                say(row_line(best_of_passes(passes[step.name])))
        return [best_of_passes(passes[spec.name]) for spec in runs], raw

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

    # -- scenarios ---------------------------------------------------------------------------------
    def few_keys(self, topic: str, messages: int, label: str) -> FewKeysResult:
        """200 keys on 64 workers: every key is always ready, so the ideal is min(W, 200) / L."""
        spec = RunSpec(f"few keys: {FEW_KEYS} keys, W={FEW_KEYS_WORKERS}", "key", "sleep", FEW_KEYS_WORKERS)
        run = self.run(spec, label, topic=topic, messages=messages)
        run.ideal_rate = ideal_rate(FEW_KEYS_WORKERS, FEW_KEYS, self.latency)
        run.ratio_to_ideal = run.rate / run.ideal_rate if run.ideal_rate else None
        return FewKeysResult(keys=FEW_KEYS, run=run)

    def resize(self, topic: str, messages: int, label: str) -> ResizeResult:
        """W=4 under a backlog over 200 keys, then ``request_resize(32)`` (what ``PUT /admin/workers``
        calls): handled counts are sampled every 0.1 s before and after, for the windowed rates."""
        sizes = self.preset.scenarios
        check = OrderCheck()
        spec = RunSpec("live resize", "key", "sleep", RESIZE_FROM)
        pod = self._pod(spec, make_handler("sleep", self.latency, check), topic=topic)
        stop = threading.Event()
        thread = pod.start_in_thread(stop)
        name = f"{label} live resize W={RESIZE_FROM} -> {RESIZE_TO}"
        self._await_first(pod, name)
        times, counts = [time.monotonic()], [self._processed(pod)]
        resize_at: float | None = None
        end = times[0] + sizes.resize_before_seconds + sizes.resize_after_seconds
        exhausted = False
        while times[-1] < end:
            time.sleep(RESIZE_SAMPLE)
            times.append(time.monotonic())
            counts.append(self._processed(pod))
            if resize_at is None and times[-1] - times[0] >= sizes.resize_before_seconds:
                pod.runtime.request_resize(RESIZE_TO)
                resize_at = time.monotonic()
            phase = f"W={RESIZE_FROM}" if resize_at is None else f"{times[-1] - resize_at:.1f} s after resize"
            self.progress.show(f"{name}: {counts[-1]:,}/{messages:,} handled, {phase}")
            if counts[-1] >= STEADY_STATE_FRACTION * messages:
                exhausted = True
                break
        stop.set()
        thread.join(30)
        ideal_before = ideal_rate(RESIZE_FROM, RESIZE_KEYS, self.latency)
        ideal_after = ideal_rate(RESIZE_TO, RESIZE_KEYS, self.latency)
        if resize_at is None:  # the backlog ran out before the resize: nothing to say about it
            resize_at = times[-1]
        threshold = RESIZE_TARGET_FRACTION * ideal_after if ideal_after else float("inf")
        rate_before, reached, rate_after, series = resize_figures(
            times, counts, resize_at, threshold, RESIZE_WINDOW, RESIZE_TARGET_SECONDS
        )
        return ResizeResult(
            keys=RESIZE_KEYS,
            workers_before=RESIZE_FROM,
            workers_after=RESIZE_TO,
            rate_before=rate_before,
            ideal_before=ideal_before,
            seconds_to_target=None if reached is None else round(reached, 2),
            target_fraction=RESIZE_TARGET_FRACTION,
            rate_after=rate_after,
            ideal_after=ideal_after,
            settle_seconds=RESIZE_TARGET_SECONDS,
            window_seconds=RESIZE_WINDOW,
            backlog_exhausted=exhausted,
            order_violations=len(check.violations),
            series_seconds=[round(seconds, 3) for seconds, _ in series],
            series_rates=[round(rate, 1) for _, rate in series],
        )

    def hot_key(self, topic: str, produced: ProducedLog, label: str) -> HotKeyResult:
        """W=32 while one key holds 40% of the backlog: the others should finish as if W-1 workers
        were theirs alone, i.e. in (their messages) x L / (W - 1)."""
        sizes = self.preset.scenarios
        hot = key_name(0).encode()
        expected = {key.encode(): count for key, count in produced.sequences.items()}
        watch = HotKeyWatch(self.latency, expected, hot)
        spec = RunSpec("hot key", "key", "sleep", HOT_KEY_WORKERS)
        pod = self._pod(spec, watch, topic=topic)
        stop = threading.Event()
        thread = pod.start_in_thread(stop)
        name = f"{label} hot key"
        self._await_first(pod, name)
        other_keys = sum(1 for key in expected if key != hot)
        other_messages = produced.total - expected.get(hot, 0)
        waiting = time.monotonic()
        while watch.others_finished is None:
            time.sleep(0.05)
            started = watch.first_started if watch.first_started is not None else waiting
            if time.monotonic() - started >= sizes.hot_key_timeout:
                break
            self.progress.show(
                f"{name}: {other_keys - watch.unfinished_others:,}/{other_keys:,} other keys done, "
                f"hot key {watch.hot_handled:,}/{expected.get(hot, 0):,}"
            )
        hot_handled = watch.hot_handled
        stop.set()
        thread.join(30)
        seconds = None
        if watch.others_finished is not None and watch.first_started is not None:
            seconds = watch.others_finished - watch.first_started
        ideal = other_messages * self.latency / (HOT_KEY_WORKERS - 1) if self.latency > 0 else None
        split = None
        if watch.first_started is not None:
            split = split_by_hot_partition(
                hot,
                expected,
                dict(watch.partitions),
                dict(watch.finished),
                produced.end_offsets,
                watch.first_started,
            )
        hot_partition, far, near = split if split is not None else (None, None, None)
        far_ideal = far.messages * self.latency / (HOT_KEY_WORKERS - 1) if far and self.latency > 0 else None
        return HotKeyResult(
            workers=HOT_KEY_WORKERS,
            hot_share=HOT_KEY_SHARE,
            hot_messages=expected.get(hot, 0),
            hot_handled=hot_handled,
            other_keys=other_keys,
            other_messages=other_messages,
            others_seconds=None if seconds is None else round(seconds, 3),
            others_ideal_seconds=None if ideal is None else round(ideal, 3),
            ratio_to_ideal=seconds / ideal if seconds is not None and ideal else None,
            timeout_seconds=sizes.hot_key_timeout,
            order_violations=len(watch.check.violations),
            hot_partition=hot_partition,
            partition_inflight_bound=partition_inflight_bound(self.preset.partitions),
            other_partitions_keys=far.keys if far else 0,
            other_partitions_messages=far.messages if far else 0,
            other_partitions_seconds=None if far is None or far.seconds is None else round(far.seconds, 3),
            other_partitions_ideal_seconds=None if far_ideal is None else round(far_ideal, 3),
            other_partitions_ratio_to_ideal=(
                far.seconds / far_ideal if far is not None and far.seconds is not None and far_ideal else None
            ),
            hot_partition_keys=near.keys if near else 0,
            hot_partition_messages=near.messages if near else 0,
            hot_partition_seconds=None if near is None or near.seconds is None else round(near.seconds, 3),
        )

    def raw_ceiling(self, label: str) -> RawCeilingResult:
        """The raw loop alone (no row beside it: ``raw_beside_rows`` is false), measured warm: one pass
        discarded (``raw_warmup``), then ``raw_passes`` passes, each a fresh group over the main topic;
        the best is the ceiling, the others its spread."""
        preset = self.preset
        warmup = self._raw_pass(f"{label} {RAW_LOOP}, warm-up pass") if preset.raw_warmup else None
        passes = [
            self._raw_pass(f"{label} {RAW_LOOP}, pass {number}/{preset.raw_passes}")
            for number in range(1, preset.raw_passes + 1)
        ]
        return raw_ceiling_of(passes, warmup)

    def _raw_pass(self, name: str) -> tuple[int, float, float, int]:
        """One plain confluent-kafka loop over the main topic with a fresh group: ``consume(1000)``,
        ``json.loads`` and the order check per message — the no-op handler's work, no keyorder.
        Measured like a run: from the first batch to 90% of the backlog (or ``run_seconds``).
        Returns (messages, seconds, msg/s, order violations)."""
        from confluent_kafka import Consumer, KafkaException

        properties = dict(setting.split("=", 1) for setting in FAST_GROUP_JOIN)
        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-raw-{uuid.uuid4().hex}",
                "auto.offset.reset": "earliest",
                **properties,
            }
        )
        check = OrderCheck()
        target = STEADY_STATE_FRACTION * self.preset.messages
        consumer.subscribe([self.topic])
        try:
            deadline = time.monotonic() + 60
            started: float | None = None
            handled = 0
            while handled < target:
                batch = consumer.consume(num_messages=1000, timeout=0.5)
                if started is None:
                    if not batch:
                        if time.monotonic() > deadline:
                            raise RuntimeError("the raw consumer received nothing within 60 s")
                        self.progress.show(f"{name}: joining the group")
                        continue
                    started = time.monotonic()
                for message in batch:
                    if message.error():
                        raise KafkaException(message.error())
                    key, value = message.key(), message.value()
                    if key is None or value is None:
                        raise RuntimeError(f"a bench message without key or value at offset {message.offset()}")
                    check.see(key, value)
                handled += len(batch)
                elapsed = time.monotonic() - started
                self.progress.show(f"{name}: {handled:,} handled, {handled / max(elapsed, 1e-9):,.0f} msg/s")
                if elapsed >= self.preset.run_seconds:
                    break
            seconds = time.monotonic() - started if started is not None else 0.0
        finally:
            consumer.close()
        return handled, seconds, handled / seconds if seconds else 0.0, len(check.violations)


REGRESSION_FLOOR = 0.9
"""A row under this fraction of its rate in a baseline report counts as a regression: runs on this
shared 2-core machine differ by up to 10-19% between back-to-back runs of the same code (docs/performance.md)."""

HOP_ONE_LANE_MESSAGES, HOP_BATCHED_MESSAGES, HOP_BATCHED_KEYS = 3_000, 20_000, 1_000


class _HopPartition:
    """The runtime's partition state, as far as a pool looks at it (``core.partitions.PartitionState``)."""

    revoked = False

    def lets_go(self, offset: int, leader_epoch: int | None) -> bool:
        return False  # never revoked, never truncated: every message runs

    @property
    def may_let_go(self) -> bool:
        return False


def _pool_seconds(pool: Any, completions: Completions, keys: int, messages: int) -> float:
    """Seconds for ``pool`` (one worker) to run ``messages`` no-op messages spread over ``keys`` keys."""
    from keyorder.core.lanes import Delivery
    from keyorder.message import Message

    partition, now = _HopPartition(), time.monotonic()
    sequence: dict[bytes, int] = {}
    deliveries = []
    for offset in range(messages):
        key = key_name(offset % keys).encode()
        seq = sequence[key] = sequence.get(key, -1) + 1
        value = json.dumps({"key": key.decode(), "seq": seq}).encode()
        deliveries.append(Delivery(Message("bench", 0, offset, key, value), key, partition, now))
    completions.clear()
    started = time.monotonic()
    pool.submit(deliveries)
    while len(completions) < messages:
        time.sleep(0.001)
    return time.monotonic() - started


def process_hop_figures(progress: Progress) -> dict:
    """What the process executor adds per message, in µs: pickling a ``Message`` (as the pool sends it,
    a tuple of its fields, and as a dataclass), pickling the result, and the whole hop (a no-op handler
    on one worker process against one worker thread), one lane at a time (a round trip per message)
    and over many lanes (batched round trips)."""
    import functools
    import pickle

    from keyorder.adapters.handlers import load_for_worker_process
    from keyorder.core.retry import RetryPolicy
    from keyorder.engine.process_child import message_fields
    from keyorder.engine.process_pool import ProcessWorkerPool
    from keyorder.engine.worker_pools import ThreadWorkerPool
    from keyorder.message import Message

    progress.show("process hop: pickling")
    message = Message("bench", 3, 123_456, key_name(42).encode(), json.dumps({"key": key_name(42), "seq": 7}).encode())
    rounds = 20_000

    def per_call(function: Callable[[], Any]) -> float:
        started = time.perf_counter()
        for _ in range(rounds):
            function()
        return (time.perf_counter() - started) / rounds * 1e6

    figures = {
        "pickle_message_dataclass_us": per_call(lambda: pickle.loads(pickle.dumps(message))),
        "pickle_message_fields_us": per_call(lambda: Message(*pickle.loads(pickle.dumps(message_fields(message))))),
        "pickle_result_us": per_call(lambda: pickle.loads(pickle.dumps(0.000175))),
    }
    load = functools.partial(load_for_worker_process, "keyorder.devtools.bench_handlers:noop", None, None)
    for executor in ("thread", "process"):
        completions = Completions()
        pool: Any = (
            ThreadWorkerPool(bench_handlers.noop, 1, RetryPolicy(), None, completions)
            if executor == "thread"
            else ProcessWorkerPool(load, 1, RetryPolicy(), None, completions)
        )
        pool.start()
        try:
            progress.show(f"process hop: {executor}, one lane")
            _pool_seconds(pool, completions, 1, 200)  # warm up (and let the handler time settle)
            one = _pool_seconds(pool, completions, 1, HOP_ONE_LANE_MESSAGES)
            progress.show(f"process hop: {executor}, {HOP_BATCHED_KEYS:,} lanes")
            batched = _pool_seconds(pool, completions, HOP_BATCHED_KEYS, HOP_BATCHED_MESSAGES)
        finally:
            pool.stop(5)
            bench_handlers.forget()
        figures[f"{executor}_one_lane_us"] = one / HOP_ONE_LANE_MESSAGES * 1e6
        figures[f"{executor}_batched_us"] = batched / HOP_BATCHED_MESSAGES * 1e6
    figures["hop_one_lane_us"] = figures["process_one_lane_us"] - figures["thread_one_lane_us"]
    figures["hop_batched_us"] = figures["process_batched_us"] - figures["thread_batched_us"]
    return {name: round(value, 2) for name, value in figures.items()}


def process_hop_summary(figures: dict) -> str:
    return (
        f"process hop (one worker, no-op handler): {figures['hop_one_lane_us']:.1f} us/msg added with a round trip "
        f"per message ({figures['process_one_lane_us']:.1f} vs {figures['thread_one_lane_us']:.1f} us on a thread), "
        f"{figures['hop_batched_us']:.1f} us/msg batched over {HOP_BATCHED_KEYS:,} lanes "
        f"({figures['process_batched_us']:.1f} vs {figures['thread_batched_us']:.1f}); pickling a Message: "
        f"{figures['pickle_message_fields_us']:.2f} us as fields, {figures['pickle_message_dataclass_us']:.2f} us as "
        f"a dataclass; a result: {figures['pickle_result_us']:.2f} us (dumps + loads)"
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
    parser.add_argument(
        "--executors",
        action="store_true",
        help="only the process executor against the thread executor (CPU- and IO-bound) and the process hop's costs",
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="only the fast-handler rows (no-op family, 0.3 ms, batch handlers and the sink on threads and "
        "processes) against a raw confluent-kafka loop, best of three warm passes; the rows a target compares "
        "are measured the same way, their passes taking turns with the raw loop's or their pair's (about 5 minutes)",
    )
    parser.add_argument("--messages", type=int, help="preloaded messages (default: preset)")
    parser.add_argument("--keys", type=int, help="distinct keys (default: preset, 10000)")
    parser.add_argument("--partitions", type=int, help="partitions (default: preset, 4)")
    parser.add_argument("--latency-ms", type=float, help="simulated handler latency L (default: 10)")
    parser.add_argument("--run-seconds", type=float, help="longest measurement window per run")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("bench-results"),
        help="where report.json, table.md and the plots (throughput.png, compared.png, resize.png) go "
        "[default: bench-results]",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        help="a report.json of the same command on other code (run just before): each row also measured there "
        f"is put against it (target: no row under {REGRESSION_FLOOR:g} x)",
    )


def bench_command(args: argparse.Namespace) -> int:
    configure_logging("WARNING")
    # read before the runs, so that a bad path fails at once
    earlier = BenchReport.from_json(args.baseline.read_text()) if args.baseline else None
    preset_name = "quick" if args.quick else "executors" if args.executors else "ceiling" if args.ceiling else "full"
    preset = PRESETS[preset_name]
    overrides = {
        name: getattr(args, name)
        for name in ("messages", "keys", "partitions", "latency_ms", "run_seconds")
        if getattr(args, name) is not None
    }
    preset = replace(preset, **overrides)
    if preset.partitions > min(
        (spec.workers for spec in preset.runs if spec.mode == "partition"), default=preset.partitions
    ):
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
            "preset": preset_name,
            "messages": preset.messages,
            "keys": preset.keys,
            "partitions": preset.partitions,
            "latency_ms": preset.latency_ms,
            "run_seconds": preset.run_seconds,
            "command": "keyorder bench"
            + {"quick": " --quick", "executors": " --executors", "ceiling": " --ceiling", "full": ""}[preset_name],
        },
    )
    report.commit_metadata_bytes = worst_commit_metadata_bytes()
    print(
        f"keyorder bench: {preset.messages:,} messages, {preset.keys:,} keys, {preset.partitions} partitions, "
        f"L = {preset.latency_ms:g} ms, {len(preset.runs)} runs"
        + (" + the raw ceiling" if preset.only_raw_ceiling else " + 4 scenarios" if preset.with_scenarios else "")
    )
    if preset.process_hop:
        report.process_hop = process_hop_figures(progress)
        progress.done()
        print(process_hop_summary(report.process_hop))
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
        results, report.scenarios.raw_ceiling = runner.measure(print)
        report.runs += results
        if preset.with_scenarios:
            run_scenarios(broker.bootstrap, runner, report, progress)
    measured = [run for run in report.runs if run.messages]
    fill_ratios(measured, preset.keys, preset.latency_ms / 1000.0)
    raw, noop = report.scenarios.raw_ceiling, next((run for run in report.runs if run.name == NOOP_RUN), None)
    if raw is not None and noop is not None and raw.rate:
        raw.compared_run, raw.compared_fraction = noop.name, noop.rate / raw.rate
    report.targets = evaluate_targets(report, quick=args.quick, earlier=earlier)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "report.json").write_text(report.to_json())
    tables = markdown_table(report.runs) + ("\n" + scenarios_table(report.scenarios) if preset.with_scenarios else "")
    if report.process_hop:
        tables += "\n" + process_hop_summary(report.process_hop) + "\n"
    (args.output_dir / "table.md").write_text(tables)
    images = [
        plot(report, args.output_dir / "throughput.png"),
        plot_comparisons(comparisons(report), args.output_dir / "compared.png"),
    ]
    if report.scenarios.resize is not None:
        images.append(plot_resize(report.scenarios.resize, args.output_dir / "resize.png"))
    print()
    print(tables)
    print(
        f"commit metadata, 10,000 in flight above a stuck offset, random half done: "
        f"{report.commit_metadata_bytes} bytes"
    )
    for name, outcome in report.targets.items():
        print(f"  {'PASS' if outcome['ok'] else 'MISS'}  {name}: {outcome['detail']}")
    plots = ", ".join(str(path) for path in images if path)
    if plots:
        drawn = f", plots: {plots}"
    else:
        drawn = " (no plot: matplotlib is missing)" if matplotlib_missing() else " (no plot: no rows to draw)"
    print(f"report: {args.output_dir / 'report.json'}{drawn}")
    failed = [name for name, outcome in report.targets.items() if outcome["required"] and not outcome["ok"]]
    if failed:
        print(f"keyorder bench: FAILED {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


def run_scenarios(bootstrap: str, runner: Runner, report: BenchReport, progress: Progress) -> None:
    """The raw ceiling over the main topic (unless measured beside the rows: ``raw_beside_rows``), then
    few keys, live resize and hot key, each on a topic of its own preloaded just before it (so no producer
    competes with a measurement)."""
    preset, sizes = runner.preset, runner.preset.scenarios
    scenarios = report.scenarios

    def preload(topic: str, messages: int, keys: int, hot_key_share: float = 0.0) -> ProducedLog:
        create_topics(bootstrap, [topic], preset.partitions)
        produced = produce_keyed(
            bootstrap,
            topic,
            messages,
            keys,
            hot_key_share=hot_key_share,
            progress=lambda n: progress.show(f"preloading {topic}: {n:,}/{messages:,}"),
        )
        progress.done()
        return produced

    if scenarios.raw_ceiling is None:
        raw = scenarios.raw_ceiling = runner.raw_ceiling("[scenario 1/4]")
        progress.done()
        print(f"  {RAW_LOOP:<28} {raw_ceiling_summary(raw)}   violations {raw.order_violations}")
    if preset.only_raw_ceiling:
        return

    preload("bench-few-keys", sizes.few_keys_messages, FEW_KEYS)
    few = scenarios.few_keys = runner.few_keys("bench-few-keys", sizes.few_keys_messages, "[scenario 2/4]")
    progress.done()
    print(
        f"  {few.run.name:<28} {few.run.rate:>10,.0f} msg/s   "
        f"{few.run.ratio_to_ideal or 0:.2f} x ideal   violations {few.run.order_violations}"
    )

    preload("bench-resize", sizes.resize_messages, RESIZE_KEYS)
    resize = scenarios.resize = runner.resize("bench-resize", sizes.resize_messages, "[scenario 3/4]")
    progress.done()
    reached = "never" if resize.seconds_to_target is None else f"{resize.seconds_to_target:.1f} s"
    print(
        f"  {f'live resize {RESIZE_FROM} -> {RESIZE_TO}':<28} {resize.rate_before:>10,.0f} msg/s before, "
        f"{resize.rate_after or 0:,.0f} after; {RESIZE_TARGET_FRACTION:g} x new ideal: {reached}   "
        f"violations {resize.order_violations}"
    )

    hot_produced = preload("bench-hot-key", sizes.hot_key_messages, HOT_KEY_OTHERS + 1, HOT_KEY_SHARE)
    hot = scenarios.hot_key = runner.hot_key("bench-hot-key", hot_produced, "[scenario 4/4]")
    progress.done()
    print(f"  {'hot key':<28} {hot_key_summary(hot)}   violations {hot.order_violations}")


def hot_key_summary(hot: HotKeyResult) -> str:
    """The hot-key scenario on the console: the two groups of other keys, then all of them."""

    def done(seconds: float | None) -> str:
        return "not done" if seconds is None else f"done in {seconds:.2f} s"

    everyone = f"all {hot.other_keys:,} others {done(hot.others_seconds)} (ideal {hot.others_ideal_seconds or 0:.2f} s)"
    if hot.hot_partition is None:
        return everyone
    ratio = hot.other_partitions_ratio_to_ideal
    indent = "\n" + " " * 31
    return (
        f"others on other partitions ({hot.other_partitions_keys:,} keys, {hot.other_partitions_messages:,} "
        f"messages) {done(hot.other_partitions_seconds)} (ideal {hot.other_partitions_ideal_seconds or 0:.2f} s"
        f"{'' if ratio is None else f', {ratio:.2f} x'})"
        f"{indent}others on the hot key's partition {hot.hot_partition} ({hot.hot_partition_keys:,} keys, "
        f"{hot.hot_partition_messages:,} messages) {done(hot.hot_partition_seconds)}: {LOOK_AHEAD_NOTE} "
        f"({hot.partition_inflight_bound or 0:,} in flight per partition)"
        f"{indent}{everyone}"
    )


NOOP_BATCH_FACTOR, SINK_BATCH_FACTOR = 0.8, 5.0
"""Issue 40's targets: the no-op batch row against the raw loop, each batched sink against its per-message row."""


def comparisons(report: BenchReport) -> list[Comparison]:
    """The targets that put one row of this run against another, for the targets and their plot: the no-op
    batch row against the raw loop, and each batched sink against its per-message row (rows the preset did
    not run are left out)."""
    runs = {run.name: run for run in report.runs}
    found: list[Comparison] = []
    raw = report.scenarios.raw_ceiling
    if raw is not None and raw.rate and NOOP_BATCH_RUN in runs:
        batch_row = runs[NOOP_BATCH_RUN]
        found.append(
            Comparison(
                NOOP_BATCH_RUN,
                batch_row.rate,
                batch_row.pass_rates,
                RAW_LOOP,
                raw.rate,
                raw.pass_rates,
                NOOP_BATCH_FACTOR,
            )
        )
    for single, batched in SINK_PAIRS:
        if single in runs and batched in runs and runs[single].rate:
            one, many = runs[single], runs[batched]
            found.append(
                Comparison(batched, many.rate, many.pass_rates, single, one.rate, one.pass_rates, SINK_BATCH_FACTOR)
            )
    return found


def evaluate_targets(report: BenchReport, quick: bool, earlier: BenchReport | None = None) -> dict:
    """The issue's targets. Correctness is always required; the quick preset's smoke floor too.
    ``earlier``: a report of the same command on other code (``--baseline``), for the no-regression target."""
    runs = {run.name: run for run in report.runs}
    targets: dict[str, dict] = {}
    in_runs = sum(run.order_violations for run in report.runs if run.mode != "unordered")
    scenarios = report.scenarios
    violations = in_runs + scenarios.order_violations
    targets["zero per-key order violations (ordered modes and scenarios)"] = {
        "ok": violations == 0,
        "required": True,
        "detail": f"{violations} violations ({in_runs} in runs, {scenarios.order_violations} in scenarios)",
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
    for name, floor in (("key W=256", 0.8), ("key async W=1024", 0.4), (FAST_RUN, 0.5)):
        run = runs.get(name)
        if run is not None and run.ratio_to_ideal is not None:
            targets[f"{name} >= {floor:g} x ideal"] = {
                "ok": run.ratio_to_ideal >= floor,
                "required": False,
                "detail": f"{run.ratio_to_ideal:.2f} x ideal ({run.rate:,.0f} of {run.ideal_rate or 0:,.0f} msg/s)",
            }
    if NOOP_RUN in runs:
        noop = runs[NOOP_RUN]
        targets["no-op >= 50,000 msg/s (<= 20 us CPU/msg)"] = {
            "ok": noop.rate >= 50_000,
            "required": False,
            "detail": f"{noop.rate:,.0f} msg/s, {noop.cpu_us_per_message:.1f} us CPU/msg",
        }
    few = scenarios.few_keys.run if scenarios.few_keys else None
    if few is not None and few.ratio_to_ideal is not None:
        targets[f"few keys ({FEW_KEYS} keys, W={FEW_KEYS_WORKERS}) >= 0.85 x ideal"] = {
            "ok": few.ratio_to_ideal >= 0.85,
            "required": False,
            "detail": f"{few.ratio_to_ideal:.2f} x ideal ({few.rate:,.0f} of {few.ideal_rate:,.0f} msg/s)",
        }
    resize = scenarios.resize
    if resize is not None:
        reached = resize.seconds_to_target
        name = (
            f"live resize W={RESIZE_FROM} -> {RESIZE_TO} under backlog: "
            f">= {RESIZE_TARGET_FRACTION:g} x new ideal within {RESIZE_TARGET_SECONDS:g} s"
        )
        targets[name] = {
            "ok": reached is not None and reached <= RESIZE_TARGET_SECONDS,
            "required": False,
            "detail": (
                f"{'not reached' if reached is None else f'reached after {reached:.1f} s'}; "
                f"{resize.rate_before:,.0f} msg/s before, "
                f"{'-' if resize.rate_after is None else f'{resize.rate_after:,.0f}'} msg/s after "
                f"(ideals {resize.ideal_before or 0:,.0f} -> {resize.ideal_after or 0:,.0f})"
            ),
        }
    hot = scenarios.hot_key
    if hot is not None and hot.other_partitions_messages:
        # Only the keys on the other partitions: those sharing the hot key's partition are bounded
        # by its look-ahead window (reported in the table, no target).
        hot_ratio, ideal = hot.other_partitions_ratio_to_ideal, hot.other_partitions_ideal_seconds or 0
        targets[
            f"hot key ({hot.hot_share:.0%} on one key): the others on other partitions finish within 1.5 x their ideal"
        ] = {
            "ok": hot_ratio is not None and hot_ratio <= 1.5,
            "required": False,
            "detail": (
                f"not all done within {hot.timeout_seconds:g} s (ideal {ideal:.2f} s)"
                if hot_ratio is None
                else f"{hot_ratio:.2f} x ideal ({hot.other_partitions_seconds or 0:.2f} s vs {ideal:.2f} s)"
            )
            + f"; {hot.other_partitions_keys:,} keys, {hot.other_partitions_messages:,} messages",
        }
    raw = scenarios.raw_ceiling
    if raw is not None and raw.compared_fraction is not None:
        targets[f"{raw.compared_run} >= 0.3 x a raw confluent-kafka loop"] = {
            "ok": raw.compared_fraction >= 0.3,
            "required": False,
            "detail": f"{raw.compared_fraction:.2f} x ({raw.rate:,.0f} msg/s raw)",
        }
    for comparison in comparisons(report):
        if comparison.against == RAW_LOOP:  # a fraction, to two places
            against = f"the raw loop (best of {max(len(comparison.against_passes), 1)})"
            times = "{:.2f} x".format
        else:  # a multiple, to one place
            against, times = comparison.against, "{:.1f}x".format
        medians = comparison.median_ratio
        targets[f"{comparison.row} >= {comparison.factor:g} x {against}"] = {
            "ok": comparison.met,
            "required": False,
            "detail": f"{times(comparison.ratio)} (best {comparison.row_rate:,.0f} vs {comparison.against_rate:,.0f}"
            + " msg/s"
            + ("" if medians is None else f"; medians {times(medians)}")
            + ")",
        }
    if earlier is not None:
        ratios, below = regressions(report.runs, earlier.runs, REGRESSION_FLOOR)
        if ratios:
            worst = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in (below or ratios[:3]))
            targets[f"no regression: every row measured in the baseline >= {REGRESSION_FLOOR:g} x its rate there"] = {
                "ok": not below,
                "required": False,
                "detail": f"{len(ratios)} rows compared, {len(below)} below; "
                + ("below: " if below else "lowest: ")
                + worst,
            }
    for (measured, against), floor in ((CPU_PAIR, 1.6), (IO_PAIR, 0.8)):
        if measured in runs and against in runs and runs[against].rate:
            ratio = runs[measured].rate / runs[against].rate
            targets[f"process executor: {measured} >= {floor:g} x {against}"] = {
                "ok": ratio >= floor,
                "required": False,
                "detail": f"{ratio:.2f}x ({runs[measured].rate:,.0f} vs {runs[against].rate:,.0f} msg/s)",
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
