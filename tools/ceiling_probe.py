"""Where a pod with a fast handler spends its time (the poll-thread issue's measurements), on one machine.

A development probe, not a benchmark: it starts the embedded broker, preloads a topic, and either
reads it with a plain confluent-kafka loop (``plain``: the raw ceiling) or drains it with a real
``keyorder run`` process and a no-op handler (``pod``), reporting the pod's rate over a 5 s window (shorter
if it drains the topic first: at 100,000 msg/s the default 300,000 messages last 3 s) from its own metrics,
its CPU from ``/proc``, and optionally:

* ``--count``: every ``consume`` call the pod makes (how many returned fewer messages than asked,
  and the time spent in those), and its pause/resume calls, by wrapping ``KafkaSource`` in the pod
  process (``tools/ceiling_counting/sitecustomize.py``, loaded through ``PYTHONPATH``);
* ``--profile``: a py-spy sample of every thread of the pod (py-spy from PyPI, a development tool:
  ``.venv/bin/pip install py-spy``), summarised per thread and per innermost frame.

    .venv/bin/python -m tools.ceiling_probe plain
    .venv/bin/python -m tools.ceiling_probe pod --workers 16 --count
    .venv/bin/python -m tools.ceiling_probe pod --workers 16 --profile
    .venv/bin/python -m tools.ceiling_probe pod --workers 16 --batch 100 --profile      # a no-op batch handler
    .venv/bin/python -m tools.ceiling_probe pod --workers 8 --batch 100 --handler sink_batch
    .venv/bin/python -m tools.ceiling_probe pod --workers 1 --batch 100 --pin-pod 1      # the pod on CPU 1 only

``--profile`` samples only the threads holding the GIL (py-spy's ``--gil``): the pod is bound by that one
lock, so what holds it is what costs.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

from confluent_kafka import Consumer

from keyorder.devtools.embedded import FAST_GROUP_JOIN, EmbeddedBroker, free_port
from keyorder.devtools.loadgen import create_topics, produce_keyed

COUNTING = Path(__file__).resolve().parent / "ceiling_counting"
WINDOW = 5.0


def plain(bootstrap: str, messages: int) -> None:
    properties = dict(item.split("=", 1) for item in FAST_GROUP_JOIN)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "plain", "auto.offset.reset": "earliest", **properties}
    )
    consumer.subscribe(["t"])
    handled = short = calls = 0
    short_seconds, start = 0.0, None
    while handled < messages:
        began = time.perf_counter()
        records = consumer.consume(500, 0.1)
        took = time.perf_counter() - began
        if records and start is None:
            start = time.monotonic()
        if start is None:
            continue
        calls += 1
        if len(records) < 500:
            short, short_seconds = short + 1, short_seconds + took
        for record in records:
            if record.error() is None:
                json.loads(record.value() or b"{}")
                handled += 1
    elapsed = time.monotonic() - (start or time.monotonic())
    consumer.close()
    print(
        f"plain consume(500, 0.1) + json.loads: {handled / elapsed:,.0f} msg/s over {elapsed:.1f} s; "
        f"{calls} calls, {short} returned fewer than 500 ({short_seconds:.2f} s in them)"
    )


def pod(
    bootstrap: str,
    workers: int,
    count: bool,
    profile: bool,
    batch: int = 0,
    handler: str = "",
    messages: int = 0,
    pin: int | None = None,
) -> None:
    port, workdir = free_port(), Path(tempfile.mkdtemp(prefix="keyorder-ceiling-"))
    environment = {
        **os.environ,
        "KEYORDER_HANDLER": f"keyorder.devtools.bench_handlers:{handler or ('noop_batch' if batch else 'noop')}",
        "KEYORDER_BATCH_MAX_MESSAGES": str(max(batch, 1)),
        "KEYORDER_TOPICS": "t",
        "KEYORDER_GROUP_ID": "pod",
        "KEYORDER_BOOTSTRAP_SERVERS": bootstrap,
        "KEYORDER_WORKERS": str(workers),
        "KEYORDER_HTTP_PORT": str(port),
        "KEYORDER_HTTP_HOST": "127.0.0.1",
        "KEYORDER_LOG_LEVEL": "WARNING",
        "KEYORDER_KAFKA_PROPERTY": ",".join(FAST_GROUP_JOIN),
    }
    if count:
        environment["PYTHONPATH"] = os.pathsep.join([str(COUNTING), environment.get("PYTHONPATH", "")])
        environment["CEILING_PROBE_COUNTS"] = str(workdir)

    def pinned() -> None:  # every thread of the pod, librdkafka's too, on one CPU; the broker goes where it may
        if pin is not None:
            os.sched_setaffinity(0, {pin})

    process = subprocess.Popen([sys.executable, "-m", "keyorder.cli", "run"], env=environment, preexec_fn=pinned)

    def handled() -> float:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            return 0.0
        prefix = "keyorder_partition_completed_messages_total{"
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))

    def cpu_seconds() -> float:
        fields = Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    try:
        deadline = time.monotonic() + 60
        while handled() == 0 and time.monotonic() < deadline:  # hang guard: the group join
            if process.poll() is not None:
                raise SystemExit(f"the pod exited with {process.returncode} before handling anything")
            time.sleep(0.2)
        began, done_before, cpu_before = time.monotonic(), handled(), cpu_seconds()
        sampler = None
        if profile:
            sampler = subprocess.Popen(
                [str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(process.pid), "-d", str(int(WINDOW)),
                 "-r", "200", "-f", "raw", "-o", str(workdir / "profile.txt"), "--threads", "--gil", "--nonblocking"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip
        # the window ends early once the preloaded topic is drained: an idle pod's seconds are not its rate
        while time.monotonic() - began < WINDOW and handled() < messages:
            time.sleep(0.05)
        elapsed, done, cpu = time.monotonic() - began, handled() - done_before, cpu_seconds() - cpu_before
        if sampler is not None:
            sampler.wait(60)
        print(
            f"keyorder run, {handler or 'no-op'} {f'batch {batch} ' if batch else ''}handler, W={workers}: "
            f"{done / elapsed:,.0f} msg/s over {elapsed:.1f} s; "
            f"pod CPU {cpu / elapsed:.2f} cores, {1e6 * cpu / max(done, 1):.1f} us/msg"
        )
    finally:
        process.terminate()
        process.wait(30)
    if count:
        for path in workdir.glob("counts-*.txt"):
            print("  consume calls, whole run:", ast.literal_eval(path.read_text()))
        for path in workdir.glob("timeline-*.txt"):
            print("  timeline of consume, pause and resume calls:", path)
    if profile:
        summarise(workdir / "profile.txt")
        kept = Path(tempfile.gettempdir()) / "ceiling-probe-profile.txt"
        kept.write_text((workdir / "profile.txt").read_text())
        print(f"  the samples (py-spy's raw format): {kept}")


def summarise(path: Path) -> None:
    """Per thread: the share of samples per innermost frame (py-spy's raw format); then the busy samples
    of the poll thread and the key workers by stage (``STAGES``)."""
    leaves: dict[str, Counter[str]] = defaultdict(Counter)
    stages: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        thread, *located = stack.split(";")
        frames = [frame.split(" (")[0] for frame in located]  # "function (file:line)": the function
        name, samples = thread.split(": ", 1)[-1], int(count)
        group = "key workers" if name.startswith("keyorder-worker") else name
        leaves[group][frames[-1] if frames else ""] += samples
        if frames and frames[-1] not in IDLE_FRAMES and name.startswith(("keyorder-worker", "MainThread")):
            # markers name a function or a module's file ("bench_handlers.py"), so they are looked for in the
            # located frames: the function names alone never held the handler's module, which read as "other"
            stage = next((stage for stage, marker in STAGES if any(marker in frame for frame in located)), "other")
            stages[stage] += samples
    for group, counter in leaves.items():
        total = sum(counter.values())
        top = ", ".join(f"{frame} {share / total:.0%}" for frame, share in counter.most_common(4))
        print(f"  {group}: {top}")
    busy = sum(stages.values())
    if busy:
        print("  busy samples by stage: " + ", ".join(f"{name} {n / busy:.0%}" for name, n in stages.most_common()))


IDLE_FRAMES = {"Condition.wait", "Event.wait", "_PollLikeSelector.select", "Condition.__enter__"}
"""Innermost frames of a thread that waits (a lock, a condition, a socket): not CPU the pod spends."""
STAGES = (
    ("handler", "bench_handlers.py"),
    ("reading (librdkafka consume, Message objects)", "KafkaSource.consume"),
    ("routing and offset tracking", "ConsumerRuntime._dispatch"),
    ("completions", "ConsumerRuntime._collect_completions"),
    ("flow control and commits", "ConsumerRuntime._apply_flow"),
    ("lane scheduler", "LaneScheduler."),
    ("lane scheduler", "._turn"),
    ("thread hand-offs (locks, wake-ups)", "Condition."),
    ("worker bookkeeping", "ThreadWorkerPool._execute"),
)
"""The pod's per-message stages, by the first frame of each that appears in a sample's stack."""


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.ceiling_probe", description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=["plain", "pod"])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--count", action="store_true", help="count the pod's consume and pause/resume calls")
    parser.add_argument("--profile", action="store_true", help="sample the pod with py-spy (threads holding the GIL)")
    parser.add_argument("--batch", type=int, default=0, help="a no-op batch handler of at most this many messages")
    parser.add_argument("--handler", default="", help="another bench_handlers function (sink_batch)")
    parser.add_argument("--pin-pod", type=int, help="run the pod process (all its threads) on this one CPU")
    args = parser.parse_args()
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap, ["t"], 4)
        produce_keyed(broker.bootstrap, "t", args.messages, 10_000)
        if args.mode == "plain":
            plain(broker.bootstrap, args.messages)
        else:
            pod(
                broker.bootstrap,
                args.workers,
                args.count,
                args.profile,
                args.batch,
                args.handler,
                args.messages,
                args.pin_pod,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
