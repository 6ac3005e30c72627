"""``keyorder catchup-bench``: catch-up on Spark against a live pod running the same handler.

On the embedded broker it preloads one backlog, then drains it with a keyorder pod (the pod's
best setting per handler: threads for the CPU handler, 64 workers for the I/O one) and with
``keyorder catchup`` on ``local[n]`` for several n, each with a fresh group. Every figure comes
from this one invocation. Spark's fixed cost (session start plus a first small job: the JVM's
JIT and the Python workers) is measured apart from its throughput on a warm session. The report
gives both, and the *crossover*: the backlog above which catch-up finishes sooner than the pod,
``N* = startup x R_pod x R_spark / (R_spark - R_pod)`` (none when Spark is not faster).

The *hot keys* scenario drains, on one warm ``local[2]`` session with the I/O handler, the same
number of messages twice: once over uniform keys, once with 4 hot keys of 10,000 messages each
among 10,000 light keys. No runner can end the hot run before one hot key's chain (its messages one
after another), so the hot run is judged against that floor (target: within 1.3x of it); its ratio to
the uniform run (hot over uniform throughput) is reported beside it.

*Task memory*: a handler task's peak RSS with 100 KB values against its budget (``memory``), measured
by ``catchup_task_memory`` in a fresh interpreter with Spark's Arrow batches as the job sets them.

Why one room of over 600 lines (a few over): the pod's drain, Spark's drain and the hot-keys scenario
feed one ``CatchupBenchReport`` from one invocation, whose figures are compared as ratios; the fence's
own bench is already apart (``catchup_bench_fence``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from keyorder.catchup.sizing import expected_cores
from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker
from keyorder.devtools.loadgen import EXACT_END_OFFSETS, create_topics, produce_keyed
from keyorder.logs import configure_logging
from keyorder.progress import Progress

TASK_MEMORY_VALUE_BYTES = 100_000
TASK_MEMORY_MESSAGES = (3_000, 1_000)
"""Messages of the task-memory measurement (full run, --quick): 300 MB and 100 MB of values."""
WARM_UP_MESSAGES = 2_000
"""A first small job per Spark session: its time (JVM start, JIT, Python workers) counts as start-up."""


@dataclass(frozen=True)
class Profile:
    handler: str
    pod_workers: int
    spark_masters: tuple[str, ...]
    shuffle_too: tuple[str, ...] = ()
    """Masters also run with ``--layout shuffle``, to compare it with the default layout in the same run."""


CPU_PROFILE = Profile(
    "keyorder.devtools.catchup_bench_handlers:cpu",
    pod_workers=4,
    spark_masters=("local[1]", "local[2]"),
    shuffle_too=("local[1]",),
)
IO_PROFILE = Profile(
    "keyorder.devtools.catchup_bench_handlers:io", pod_workers=64, spark_masters=("local[2]", "local[8]")
)
PROFILES = (CPU_PROFILE, IO_PROFILE)


@dataclass
class Measurement:
    profile: str
    runner: str
    messages: int
    seconds: float
    violations: int = 0
    cores: int = 1
    """Cores the runner may use for the handler: n for Spark local[n]; 1 for a pod's threads (the GIL)."""
    cpu_seconds: float = 0.0
    """CPU seconds of the whole process tree during the drain (the bench, its broker, Spark's JVM and
    Python workers), so both runners pay for the broker alike."""

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds else 0.0

    @property
    def rate_per_core(self) -> float:
        return self.rate / self.cores

    @property
    def cpu_micros_per_message(self) -> float:
        return self.cpu_seconds / self.messages * 1e6 if self.messages else 0.0


def tree_cpu_seconds(root: int | None = None) -> float:
    """User plus system CPU seconds of ``root`` (this process) and every live descendant (Linux /proc)."""
    from keyorder.adapters.cpu import process_cpu_seconds, process_stat

    root = os.getpid() if root is None else root
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := process_stat(int(entry))) is not None:
            parents[int(entry)] = int(fields[1])
    tree, frontier = {root}, [root]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, ppid in parents.items() if ppid == parent and pid not in tree]
        tree.update(children)
        frontier.extend(children)
    return sum(process_cpu_seconds(pid) or 0.0 for pid in tree)


PER_CORE_TARGET = 0.8
"""Spark msg/s per core over pod msg/s per core, the issue's target, for the CPU-bound handler (cores
bound its rate; the I/O-bound one is bound by threads, and its per-core figure is shown for information)."""


HOT_KEYS = 4
HOT_KEY_SETTINGS = ((16, "auto"), (16, "shuffle"), (8, "auto"))
"""(task workers, layout) of the hot-keys runs: the defaults first (the only one with --quick)."""
HOT_RUN_FLOOR_TARGET = 1.3
"""The hot run's time over its hot chain's (issue 38: no runner can end it before that chain)."""
"""Hot-key throughput over uniform-key throughput, the issue's target."""


@dataclass
class CatchupBenchReport:
    parameters: dict
    spark_startup_seconds: float = 0.0
    measurements: list[Measurement] = field(default_factory=list)
    hot_keys: list[Measurement] = field(default_factory=list)
    """The hot-keys scenario: per setting (task workers, layout), uniform keys then the hot keys, same size
    and session; the runner names end in `` | <setting>``."""
    task_memory: dict = field(default_factory=dict)
    """``catchup_task_memory.measure`` with 100 KB values: the peak RSS, its growth and their budgets."""
    hot_chain_seconds: float = 0.0
    """One hot key's messages one after another, handler time only (measured on this machine): no run with
    the hot keys can be shorter."""

    def hot_key_ceilings(self) -> dict[str, float]:
        """The best ratio each setting could reach: its uniform run's time over the hot chain's."""
        return {
            hot_setting(uniform): min(uniform.seconds / self.hot_chain_seconds, 1.0)
            for uniform in self.hot_keys[::2]
            if self.hot_chain_seconds
        }

    def hot_key_ratios(self) -> dict[str, float]:
        """Hot over uniform throughput per setting."""
        ratios = {}
        for uniform, hot in zip(self.hot_keys[::2], self.hot_keys[1::2], strict=True):
            if uniform.rate:
                ratios[hot_setting(uniform)] = hot.rate / uniform.rate
        return ratios

    def hot_run_over_chain(self) -> dict[str, float]:
        """Per setting, the hot run's time over its hot chain's (1.0: as short as the hot key allows)."""
        if not self.hot_chain_seconds:
            return {}
        return {hot_setting(hot): hot.seconds / self.hot_chain_seconds for hot in self.hot_keys[1::2]}

    def crossover(self, profile: str) -> dict:
        """The backlog above which the fastest Spark setting beats the pod, start-up included."""
        pod = next(m for m in self.measurements if m.profile == profile and m.runner.startswith("pod"))
        best = max(
            (m for m in self.measurements if m.profile == profile and m.runner.startswith("spark")),
            key=lambda m: m.rate,
        )
        result = {
            "pod_rate": round(pod.rate, 1),
            "spark_runner": best.runner,
            "spark_rate": round(best.rate, 1),
            "speedup": round(best.rate / pod.rate, 2) if pod.rate else None,
        }
        if best.rate > pod.rate > 0:
            result["crossover_messages"] = round(crossover_messages(self.spark_startup_seconds, pod.rate, best.rate))
        else:
            result["crossover_messages"] = None
        return result

    def per_core(self, profile: str) -> dict:
        """Each Spark setting's msg/s per core and per CPU-second against the pod's, for one handler."""
        pod = next(m for m in self.measurements if m.profile == profile and m.runner.startswith("pod"))
        result: dict[str, Any] = {
            "pod_per_core": round(pod.rate_per_core, 1),
            "pod_cpu_us_per_message": round(pod.cpu_micros_per_message, 1),
        }
        for m in self.measurements:
            if m.profile == profile and m.runner.startswith("spark"):
                result[m.runner] = {
                    "per_core": round(m.rate_per_core, 1),
                    "per_core_ratio": round(m.rate_per_core / pod.rate_per_core, 3) if pod.rate_per_core else None,
                    "cpu_us_per_message": round(m.cpu_micros_per_message, 1),
                    "cpu_ratio": round(pod.cpu_micros_per_message / m.cpu_micros_per_message, 3)
                    if m.cpu_micros_per_message
                    else None,
                }
        return result

    def to_json(self) -> str:
        profiles = sorted({m.profile for m in self.measurements})
        return json.dumps(
            {
                "parameters": self.parameters,
                "spark_startup_seconds": round(self.spark_startup_seconds, 2),
                "measurements": [{**asdict(m), "rate": round(m.rate, 1)} for m in self.measurements],
                "crossover": {profile: self.crossover(profile) for profile in profiles},
                "per_core": {profile: self.per_core(profile) for profile in profiles},
                "per_core_target": PER_CORE_TARGET,
                "hot_keys": {
                    "measurements": [{**asdict(m), "rate": round(m.rate, 1)} for m in self.hot_keys],
                    "ratios": {setting: round(ratio, 3) for setting, ratio in self.hot_key_ratios().items()},
                    "run_over_chain": {
                        setting: round(value, 3) for setting, value in self.hot_run_over_chain().items()
                    },
                    "run_over_chain_target": HOT_RUN_FLOOR_TARGET,
                    "hot_chain_seconds": round(self.hot_chain_seconds, 2),
                    "ceilings": {setting: round(value, 3) for setting, value in self.hot_key_ceilings().items()},
                },
                "task_memory": self.task_memory,
            },
            indent=2,
        )


def task_memory(quick: bool) -> dict:
    """A handler task's peak RSS with 100 KB values, the job's Arrow batch bytes and the default look-ahead
    (``catchup_task_memory.measure``)."""
    from keyorder.catchup.memory import ARROW_BATCH_BYTES
    from keyorder.catchup.settings import TASK_LOOKAHEAD_MB
    from keyorder.devtools.catchup_task_memory import measure

    messages = TASK_MEMORY_MESSAGES[1] if quick else TASK_MEMORY_MESSAGES[0]
    return measure(messages, TASK_MEMORY_VALUE_BYTES, ARROW_BATCH_BYTES, TASK_LOOKAHEAD_MB)


def hot_setting(measurement: Measurement) -> str:
    """The setting a hot-keys run used: what its runner name says after `` | ``."""
    return measurement.runner.rsplit(" | ", 1)[-1]


def crossover_messages(startup_seconds: float, pod_rate: float, spark_rate: float) -> float:
    """Backlog N where ``startup + N / spark_rate == N / pod_rate`` (catch-up wins above it)."""
    if spark_rate <= pod_rate:
        return float("inf")
    return startup_seconds * pod_rate * spark_rate / (spark_rate - pod_rate)


def short(handler: str) -> str:
    return handler.rsplit(":", 1)[-1]


def drain_with_pod(bootstrap: str, topic: str, profile: Profile, messages: int, progress: Progress) -> Measurement:
    from keyorder.adapters.handlers import load_handler
    from keyorder.config import RunConfig
    from keyorder.devtools.bench import OrderCheck
    from keyorder.pod import Pod

    config = RunConfig(
        handler=profile.handler,
        topics=[topic],
        group_id=f"bench-pod-{uuid.uuid4().hex[:8]}",
        bootstrap_servers=bootstrap,
        workers=profile.pod_workers,
        on_exhausted="block",
        shutdown_grace=0.5,
        kafka_property=FAST_GROUP_JOIN,
    )
    handler, check = load_handler(profile.handler).function, OrderCheck()

    def checked(message) -> None:  # the same handler, plus the per-key sequence check of `keyorder bench`
        check.see(message.key, message.value)
        handler(message)

    pod = Pod(config, handler=checked, serve_http=False)
    stop = threading.Event()
    thread = pod.start_in_thread(stop)

    def handled() -> int:
        return sum(stats.processed for stats in pod.pool.stats())

    deadline = time.monotonic() + 60
    while handled() == 0 and time.monotonic() < deadline:  # the group join is not the pod's throughput
        time.sleep(0.01)
    started, first, cpu_before = time.monotonic(), handled(), tree_cpu_seconds()
    while handled() < messages and time.monotonic() - started < 600:
        time.sleep(0.05)
        done = handled()
        progress.show(
            f"pod W={profile.pod_workers} {short(profile.handler)}: {done:,}/{messages:,}, "
            f"{(done - first) / max(time.monotonic() - started, 1e-9):,.0f} msg/s"
        )
    seconds = time.monotonic() - started
    cpu_seconds = tree_cpu_seconds() - cpu_before
    done = handled()  # the few handled before the first sample are counted, a bias of at most 10 ms
    stop.set()
    thread.join(30)
    progress.done()
    return Measurement(
        short(profile.handler),
        f"pod W={profile.pod_workers}",
        done,
        round(seconds, 3),
        violations=len(check.violations),
        cores=1,  # thread workers: the handler runs on one core at a time (the GIL)
        cpu_seconds=round(cpu_seconds, 3),
    )


def bench_config(
    bootstrap: str, topic: str, profile: Profile, master: str, task_workers: int = 16, layout: str = "auto"
):
    """The settings of one measured catch-up run (a fresh group, nothing committed)."""
    from keyorder.catchup.layout import Layout
    from keyorder.catchup.settings import CatchupConfig

    return CatchupConfig(
        bootstrap_servers=bootstrap,
        topics=[topic],
        group_id=f"bench-spark-{uuid.uuid4().hex[:8]}",
        handler=profile.handler,
        master=master,
        commit="never",
        split_offsets=10_000,
        task_workers=task_workers,
        layout=Layout(layout),
    )


def drain_with_spark(
    spark,
    bootstrap: str,
    topic: str,
    profile: Profile,
    master: str,
    runner: str | None = None,
    task_workers: int = 16,
    layout: str = "auto",
) -> Measurement:
    from keyorder.catchup.job import CatchupJob

    job = CatchupJob(bench_config(bootstrap, topic, profile, master, task_workers, layout), spark=spark)
    try:
        plan = job.plan()
        started, cpu_before = time.monotonic(), tree_cpu_seconds()
        outcome = job.run(plan)
        seconds = time.monotonic() - started
        cpu_seconds = tree_cpu_seconds() - cpu_before
    finally:
        job.close()
    if not outcome.ok:
        reason = outcome.error or (outcome.audit.problems if outcome.audit is not None else "no audit of the run")
        raise RuntimeError(f"catch-up run failed: {reason}")
    report = outcome.report()
    return Measurement(
        short(profile.handler),
        runner or f"spark {master}" + ("" if layout == "auto" else f" --layout {layout}"),
        report["processed"],
        round(seconds, 3),
        violations=report["violations"],
        cores=expected_cores(master, {})[0] or 1,
        cpu_seconds=round(cpu_seconds, 3),
    )


def hot_chain_seconds(quick: bool) -> float:
    """One hot key's chain on this machine: its messages' handler calls one after another (the I/O
    handler's 1 ms sleep takes longer than 1 ms), measured on 500 calls."""
    from keyorder.adapters.handlers import load_handler

    per_hot = 500 if quick else 10_000
    handler = load_handler(IO_PROFILE.handler).function
    started = time.perf_counter()
    for _ in range(500):
        handler(None)
    return (time.perf_counter() - started) / 500 * per_hot


def hot_keys_scenario(
    bootstrap: str, partitions: int, quick: bool, progress: Progress, sessions: SparkSessions
) -> list[Measurement]:
    """The same backlog size over uniform keys, then with ``HOT_KEYS`` hot keys, on one warm session, with
    the default 16 task workers and (not with --quick) 8: a hot key's thread waits for the GIL after each
    message, and fewer busy threads shorten that wait."""
    per_hot, light_keys, per_light = (500, 500, 8) if quick else (10_000, 10_000, 8)
    total = HOT_KEYS * per_hot + light_keys * per_light
    profile = IO_PROFILE
    topics = {"uniform": "catchup-bench-uniform", "hot": "catchup-bench-hot"}
    for name in topics.values():
        create_topics(bootstrap, [name, f"{name}.dlq"], partitions)
    produce_keyed(bootstrap, topics["uniform"], total, light_keys, extra_config=EXACT_END_OFFSETS)
    produce_keyed(
        bootstrap,
        topics["hot"],
        total,
        light_keys + HOT_KEYS,
        extra_config=EXACT_END_OFFSETS,
        hot_key_share=HOT_KEYS * per_hot / total,
        hot_keys=HOT_KEYS,
        progress=lambda n: progress.show(f"preloading hot keys {n:,}/{total:,}"),
    )
    progress.done()
    master = "local[2]"
    spark, _ = sessions.get(bench_config(bootstrap, topics["uniform"], profile, master))
    drain_with_spark(spark, bootstrap, topics["uniform"], profile, master)  # warm up
    measurements = []
    for workers, layout in HOT_KEY_SETTINGS[:1] if quick else HOT_KEY_SETTINGS:
        setting = f"W={workers} {layout}"
        for scenario, keys in (("uniform", "uniform keys"), ("hot", f"{HOT_KEYS} hot keys x {per_hot:,}")):
            runner = f"{master} {keys} | {setting}"
            measurements.append(
                drain_with_spark(spark, bootstrap, topics[scenario], profile, master, runner, workers, layout)
            )
    return measurements


class SparkSessions:
    """One Spark session at a time (a JVM per process), kept while the runs ask for the same master:
    with ``--quick`` every run is on ``local[2]``, so both profiles and the hot-keys scenario share one
    session instead of starting three (about 15 s each)."""

    def __init__(self) -> None:
        self._current: tuple[str, object] | None = None

    def get(self, config) -> tuple[object, float | None]:
        """The job's own session (same enforced settings) for ``config.master``, and how long it took
        to start (``None``: an existing one)."""
        from keyorder.catchup.job import spark_session as job_session

        if self._current is not None and self._current[0] == config.master:
            return self._current[1], None
        self.close()
        started = time.monotonic()
        session = job_session(config)
        self._current = (config.master, session)
        return session, time.monotonic() - started

    def close(self) -> None:
        from keyorder.catchup.job import stop_spark

        if self._current is not None:
            stop_spark(self._current[1])
            self._current = None


def plot(report: CatchupBenchReport, path: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not report.measurements:
        return None
    profiles = sorted({m.profile for m in report.measurements})
    figure, axes = plt.subplots(1, len(profiles), figsize=(5 * len(profiles), 3.6))
    for axis, profile in zip(axes if len(profiles) > 1 else [axes], profiles, strict=True):
        rows = [m for m in report.measurements if m.profile == profile]
        axis.barh(
            [m.runner for m in rows],
            [m.rate for m in rows],
            color=["#888888" if m.runner.startswith("pod") else "#e25a1c" for m in rows],
        )
        axis.set_title(f"{profile} handler: msg/s (higher is better)")
        axis.invert_yaxis()
        for index, m in enumerate(rows):
            axis.text(m.rate, index, f" {m.rate:,.0f}", va="center")
        axis.set_xlim(0, max(m.rate for m in rows) * 1.3)
    figure.suptitle(
        f"catch-up on Spark vs one keyorder pod, same handler; Spark start-up {report.spark_startup_seconds:.0f} s",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def add_catchup_bench_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="small backlog, local[2] only: a CI smoke run")
    parser.add_argument("--messages", type=int, help="backlog size [default: 40000; --quick 6000]")
    parser.add_argument("--keys", type=int, default=10_000, help="distinct keys [default: 10000]")
    parser.add_argument("--partitions", type=int, default=4, help="partitions [default: 4]")
    parser.add_argument(
        "--only",
        choices=("profiles", "hot-keys"),
        help="run only the pod-vs-Spark profiles or only the hot-keys scenario [default: both]",
    )
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("bench-results/catchup"),
        help="where report.json and catchup.png go [default: bench-results/catchup]",
    )


def catchup_bench_command(args: argparse.Namespace) -> int:
    configure_logging("WARNING")
    messages = args.messages or (6_000 if args.quick else 40_000)
    progress = Progress()
    command = "keyorder catchup-bench" + (" --quick" if args.quick else "")
    report = CatchupBenchReport(
        parameters={
            "messages": messages,
            "keys": args.keys,
            "partitions": args.partitions,
            "cpus": os.cpu_count(),
            "command": command,
        }
    )
    print(f"keyorder catchup-bench: {messages:,} messages, {args.keys:,} keys, {args.partitions} partitions")
    startups = []
    sessions = SparkSessions()
    with EmbeddedBroker() as broker, contextlib.closing(sessions):
        topic = "catchup-bench"
        create_topics(broker.bootstrap, [topic, f"{topic}.dlq"], args.partitions)
        produce_keyed(
            broker.bootstrap,
            topic,
            messages,
            args.keys,
            extra_config=EXACT_END_OFFSETS,
            progress=lambda n: progress.show(f"preloading {n:,}/{messages:,}"),
        )
        warm_up_topic = "catchup-bench-warm-up"
        create_topics(broker.bootstrap, [warm_up_topic, f"{warm_up_topic}.dlq"], args.partitions)
        produce_keyed(broker.bootstrap, warm_up_topic, WARM_UP_MESSAGES, args.keys, extra_config=EXACT_END_OFFSETS)
        progress.done()
        for profile in PROFILES if args.only != "hot-keys" else ():
            measured_before = len(report.measurements)
            report.measurements.append(drain_with_pod(broker.bootstrap, topic, profile, messages, progress))
            masters = ("local[2]",) if args.quick else profile.spark_masters
            for master in masters:  # local[n]: n tasks at once, so one session per setting
                spark, startup = sessions.get(bench_config(broker.bootstrap, topic, profile, master))
                warm_up = drain_with_spark(spark, broker.bootstrap, warm_up_topic, profile, master)
                if startup is not None:  # JVM, JIT and Python workers: paid once per job
                    startups.append(startup + warm_up.seconds)
                report.measurements.append(drain_with_spark(spark, broker.bootstrap, topic, profile, master))
                if master in profile.shuffle_too and not args.quick:
                    report.measurements.append(
                        drain_with_spark(spark, broker.bootstrap, topic, profile, master, layout="shuffle")
                    )
            for m in report.measurements[measured_before + 1 :]:
                print(
                    f"  {m.profile:<4} {m.runner:<16} {m.rate:>9,.0f} msg/s  ({m.messages:,} in {m.seconds:.1f} s, "
                    f"violations {m.violations})"
                )
        if args.only != "profiles":
            report.hot_keys = hot_keys_scenario(broker.bootstrap, args.partitions, args.quick, progress, sessions)
            report.hot_chain_seconds = hot_chain_seconds(args.quick)
            for m in report.hot_keys:
                print(f"  hot keys {m.runner:<48} {m.rate:>9,.0f} msg/s  ({m.messages:,} in {m.seconds:.1f} s)")
    report.spark_startup_seconds = sum(startups) / len(startups) if startups else 0.0
    report.task_memory = task_memory(args.quick)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    (args.output_dir / "report.json").write_text(report.to_json() + "\n")
    image = plot(report, args.output_dir / "catchup.png")
    print(f"Spark session start-up: {report.spark_startup_seconds:.1f} s")
    for profile_name in sorted({m.profile for m in report.measurements}):
        found = report.crossover(profile_name)
        where = (
            f"catch-up pays off above ~{found['crossover_messages']:,} messages"
            if found["crossover_messages"]
            else "Spark on this machine is not faster than the pod: no crossover here"
        )
        print(
            f"  {profile_name}: pod {found['pod_rate']:,.0f} msg/s, best Spark ({found['spark_runner']}) "
            f"{found['spark_rate']:,.0f} msg/s = {found['speedup']}x; {where}"
        )
    for profile_name in sorted({m.profile for m in report.measurements}):
        per_core = report.per_core(profile_name)
        for runner, figures in per_core.items():
            if isinstance(figures, dict):
                met = figures["per_core_ratio"] >= PER_CORE_TARGET
                verdict = (
                    f"target >= {PER_CORE_TARGET}: {'met' if met else 'missed'}"
                    if profile_name == short(CPU_PROFILE.handler)
                    else "I/O-bound: threads, not cores, set its rate"
                )
                print(
                    f"  {profile_name}: {runner} {figures['per_core']:,.0f} msg/s per core = "
                    f"{figures['per_core_ratio']:.2f}x the pod's {per_core['pod_per_core']:,.0f} ({verdict}); "
                    f"CPU {figures['cpu_us_per_message']:.0f} us/msg against the pod's "
                    f"{per_core['pod_cpu_us_per_message']:.0f}"
                )
    ratios, ceilings = report.hot_key_ratios(), report.hot_key_ceilings()
    for setting, over in report.hot_run_over_chain().items():
        print(
            f"  hot keys, {setting}: the hot run took {over:.2f}x its floor, one hot key's chain of "
            f"{report.hot_chain_seconds:.1f} s (target <= {HOT_RUN_FLOOR_TARGET}): "
            + ("met" if over <= HOT_RUN_FLOOR_TARGET else "missed")
            + (
                f"; {ratios[setting]:.2f}x the uniform-keys throughput, at most {ceilings[setting]:.2f}x here"
                if setting in ratios and setting in ceilings
                else ""
            )
        )
    memory = report.task_memory
    print(
        f"  task memory, {memory['messages']:,} messages of 100 KB: peak RSS {memory['peak_kib'] / 1024:.0f} MiB "
        f"against its budget {memory['budget_mib']} MiB, {memory['growth_kib'] / 1024:.1f} MiB above the worker's "
        f"base against {memory['allowed_growth_kib'] / 1024:.0f} MiB: "
        + ("within" if memory["within_budget"] else "OVER")
    )
    print(f"report: {args.output_dir / 'report.json'}" + (f", plot: {image}" if image else ""))
    violations = sum(m.violations for m in [*report.measurements, *report.hot_keys])
    return 1 if violations else 0
