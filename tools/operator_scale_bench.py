"""How the operator keeps time with many OrderedConsumers: a benchmark, run as users run the operator.

For each N (``--resources 50,200,500``): the API emulator (a FAKE Kubernetes API server, the one the
operator's tests use, with the chart's RBAC) holds N OrderedConsumers polling every
``--interval`` seconds; 5% of them point at a Kafka that accepts connections and never answers, the
rest at a real Kafka-protocol broker (Tansu). ``keyorder operator`` runs as a separate process
logged in with the operator's ServiceAccount token. After every resource has polled twice and the
first decisions have settled (``--settle``), the benchmark watches for ``--seconds``:

- **poll gaps** of the healthy resources (from the operator's own
  ``keyorder_operator_last_poll_timestamp_seconds``, read every second): p50, p95 and max against the
  configured interval;
- the operator's **CPU** (cores), **RSS** and **threads** (from /proc);
- **API requests per poll** per resource: reads and writes the emulator received from the operator
  (watch streams are counted apart: they are opened once, not per poll);
- **status writes**: write requests to the OrderedConsumers' status a second, how many of them changed
  the stored status and which fields, and the times that moved without a change of what they date (a
  condition's ``lastTransitionTime`` with the same ``status``, ``lastDecision.time`` with the same
  reason; ``tests.operator.status_audit``); and the HorizontalPodAutoscaler lists a second.

    .venv/bin/python -m tools.operator_scale_bench --resources 50,200,500

``--scale-to-zero`` is the steady state of a fleet at rest: the healthy resources read an empty topic
with ``replicas.min: 0``, ``scaling.scaleToZero`` and no scale-down window, so after their first
decisions they sit at zero pods and every poll decides the same (issue 35's scenario):

    .venv/bin/python -m tools.operator_scale_bench --resources 500 --scale-to-zero --by-path

``--pods N`` is the memory scenario (issue 35): every resource runs N pods (``replicas.min`` = ``max`` = N) and
its handler has a 40-variable environment; the pods are objects only (``tests.operator.fleet``), shaped as a
cluster returns them (``managedFields``, the kubelet's status, the owner reference: ``tests.operator.
cluster_objects``), Ready at loopback addresses nothing listens on. The peak RSS is the kernel's high-water
mark of the operator process (``VmHWM``), start-up included; once every pod exists (and ``RELIST_AFTER``
seconds more) the emulator's watch history is expired once, a 410 Gone after which kopf lists every kind
again (the operator's worst moment: a listing of every pod, and the cache's check against its own lists), so
the peak includes a full re-list. ``--operator-pythonpath``
runs the operator from another checkout's ``operator/`` directory (a before/after comparison):

    .venv/bin/python -m tools.operator_scale_bench --resources 500 --pods 3 --seconds 60

Prints a table per N and writes ``operator-scale-bench.json``. One process at a time on the machine:
the figures are about the operator's share of two cores.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from keyorder.devtools.embedded import EmbeddedBroker, free_port
from keyorder.devtools.loadgen import create_topics, produce_keyed
from tests.operator.cluster_objects import long_env
from tests.operator.emulator import Emulator
from tests.operator.fleet import ObjectFleet
from tests.operator.harness import CR, serve_emulator, stop_process, write_kubeconfig
from tests.operator.status_audit import AuditCounts, StatusAudit

TOPIC = "bench-orders"
EMPTY_TOPIC = "bench-empty"
"""The ``--scale-to-zero`` resources' topic: nothing is ever produced to it."""
HPA_LIST = "read GET /apis/autoscaling/v2/namespaces/default/horizontalpodautoscalers"
UNREACHABLE_SHARE = 0.05


NAMES = ("ok-", "dead-")
"""The resources' name prefixes, left out of the paths counted by ``--by-path``."""


class RequestCounts:
    """Requests the emulator answered, by kind (read, write, watch) and by kind, method and path (thread-safe:
    the emulator's loop counts)."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def install(self) -> None:
        """Count every request the emulator handles (its class's request entry point, wrapped in this
        process only: the bench owns the one emulator it runs)."""
        handle = Emulator._handle
        counts = self

        async def counted(emulator: Emulator, request: Any) -> Any:
            method = str(getattr(request.method, "value", request.method)).upper()
            watching = str(request.params.get("watch", "")).lower() in ("true", "1")
            kind = "watch" if watching else ("read" if method == "GET" else "write")
            with counts.lock:
                counts.counts[kind] += 1
                path = "/".join(part for part in str(request.url.path).split("/") if not part.startswith(NAMES))
                counts.counts[f"{kind} {method} {path}"] += 1
            return await handle(emulator, request)

        Emulator._handle = counted  # type: ignore[method-assign]

    def snapshot(self) -> Counter[str]:
        with self.lock:
            return Counter(self.counts)


@contextlib.contextmanager
def silent_kafka() -> Iterator[str]:
    """A listener that accepts connections and never answers: a Kafka that hangs every request."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4096)
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def resource(name: str, bootstrap: str, interval: int, scale_to_zero: bool = False, pods: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "kafka": {"bootstrapServers": bootstrap, "topics": [TOPIC], "groupId": f"g-{name}"},
        "handler": {"image": "registry.example/orders:1.0", "handler": "orders.handler:handle"},
        "scaling": {"pollIntervalSeconds": interval},
    }
    if scale_to_zero:
        spec["kafka"]["topics"] = [EMPTY_TOPIC]
        spec["replicas"] = {"min": 0}
        spec["scaling"].update(scaleToZero=True, scaleDownStabilizationSeconds=0)
    if pods:  # the memory scenario: a fixed size, and a handler environment as production ones are
        spec["replicas"] = {"min": pods, "max": pods}
        spec["handler"]["env"] = long_env()
    return {"apiVersion": "keyorder.dev/v1alpha1", "kind": "OrderedConsumer", "metadata": {"name": name}, "spec": spec}


def poll_times(metrics_port: int) -> dict[str, float]:
    """Each resource's last poll start (Unix time), from the operator's metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    times = {}
    for family in text_string_to_metric_families(text):
        if family.name == "keyorder_operator_last_poll_timestamp_seconds":
            for sample in family.samples:
                times[sample.labels["name"]] = sample.value
    return times


def process_usage(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, RSS bytes, threads) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    rss = int(status["VmRSS"].split()[0]) * 1024
    return cpu, rss, int(status["Threads"])


RELIST_AFTER = 20.0
"""Seconds after the last pod of the ``--pods`` scenario exists before the watch history is expired."""


@contextlib.contextmanager
def relisted_once(kube: Any, fleet: ObjectFleet, pods: int, timeout: float = 900.0) -> Iterator[threading.Event]:
    """Expire the emulator's watch history once (``Emulator.expire_watches``: the operator's watches are
    answered 410 Gone and it lists everything again), ``RELIST_AFTER`` seconds after the fleet holds ``pods``
    pods; the event is set once done. Nothing happens for ``pods`` 0."""
    done, stop = threading.Event(), threading.Event()

    def wait_then_expire() -> None:
        deadline = time.monotonic() + timeout  # hang guard
        while fleet.pods < pods and time.monotonic() < deadline:
            if stop.wait(1.0):
                return
        if not stop.wait(RELIST_AFTER):
            kube.expire_watches()
            done.set()

    thread = threading.Thread(target=wait_then_expire, name="relist-once", daemon=True)
    if pods:
        thread.start()
    try:
        yield done
    finally:
        stop.set()
        if thread.is_alive():
            thread.join(30)  # hang guard


def wait_for_relist(
    relisted: threading.Event, fleet: ObjectFleet, pods: int, operator: subprocess.Popen[str], timeout: float = 1200.0
) -> None:
    """Wait until the fleet holds ``pods`` pods and the watch history was expired (``relisted_once``)."""
    deadline = time.monotonic() + timeout  # hang guard
    while not relisted.wait(5.0):
        if operator.poll() is not None:
            raise RuntimeError(f"the operator exited with {operator.returncode} before the re-list")
        if time.monotonic() > deadline:
            raise RuntimeError(f"no re-list within {timeout:.0f} s: the fleet holds {fleet.pods} of {pods} pods")
        print(f"\r  {fleet.pods} of {pods} pods ...", end="", flush=True)
    print(f"\r  {fleet.pods} pods; the watch history expired (410 Gone), kopf lists again", flush=True)


def peak_rss(pid: int) -> int:
    """The most resident memory the process ever had, in bytes (the kernel's ``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no VmHWM line")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def run_one(
    count: int,
    interval: int,
    seconds: float,
    settle: float,
    broker: EmbeddedBroker,
    work: Path,
    scale_to_zero: bool = False,
    pods: int = 0,
    operator_pythonpath: str | None = None,
) -> dict[str, Any]:
    counts = RequestCounts()
    counts.install()
    unreachable = max(round(count * UNREACHABLE_SHARE), 1)
    with (
        silent_kafka() as dead,
        StatusAudit().installed() as audit,
        serve_emulator() as kube,
        ObjectFleet(kube, running=bool(pods)) as fleet,
        relisted_once(kube, fleet, count * pods) as relisted,
    ):
        names = [f"ok-{index:04d}" for index in range(count - unreachable)]
        dead_names = [f"dead-{index:04d}" for index in range(unreachable)]
        for name in names:
            kube.create(CR, resource(name, broker.bootstrap, interval, scale_to_zero, pods))
        for name in dead_names:
            kube.create(CR, resource(name, dead, interval, scale_to_zero, pods))
        metrics_port, liveness_port = free_port(), free_port()
        kubeconfig = write_kubeconfig(kube.url, work / f"kubeconfig-{count}")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": ""}
        if operator_pythonpath:
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [operator_pythonpath, env.get("PYTHONPATH")]))
        command = [sys.executable, "-m", "keyorder.cli", "operator", "--metrics-port", str(metrics_port)]
        command += ["--liveness", f"http://127.0.0.1:{liveness_port}/healthz", "--log-level", "WARNING"]
        log_path = work / f"operator-{count}.log"
        with log_path.open("w") as log:
            operator = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            if pods:  # the measured window comes after every pod exists and the re-list happened
                wait_for_relist(relisted, fleet, count * pods, operator)
            result = measure(count, interval, seconds, settle, names, operator, metrics_port, counts, audit)
            sizes = {item["metadata"]["name"]: (item.get("status") or {}).get("replicas") for item in kube.list(CR)}
            result["healthy_at_zero_replicas"] = sum(1 for name in names if sizes.get(name) == 0)
            result["rss_peak_mb"] = round(peak_rss(operator.pid) / 2**20, 1)
            result["pods"] = fleet.pods
            result["relisted"] = relisted.is_set()
            if fleet.errors:
                print(f"  N={count}: the pods' stand-in met {len(fleet.errors)} errors; the first: {fleet.errors[0]}")
            return result
        finally:
            stop_process(operator)
            errors = [line for line in log_path.read_text().splitlines() if " ERROR " in line]
            if errors:
                print(f"  N={count}: the operator logged {len(errors)} errors; the first: {errors[0][:300]}")


def measure(
    count: int,
    interval: int,
    seconds: float,
    settle: float,
    healthy: list[str],
    operator: subprocess.Popen[str],
    metrics_port: int,
    counts: RequestCounts,
    audit: StatusAudit,
) -> dict[str, Any]:
    started = time.monotonic()
    seen: dict[str, list[float]] = {}
    warm_deadline = started + max(180.0, 6 * interval)
    print(f"  N={count}: waiting for every resource to poll twice ...", flush=True)
    while True:
        if operator.poll() is not None:
            raise RuntimeError(f"the operator exited with {operator.returncode} before warming up")
        with contextlib.suppress(OSError):
            for name, at in poll_times(metrics_port).items():
                polls = seen.setdefault(name, [])
                if not polls or polls[-1] != at:
                    polls.append(at)
        ready = sum(1 for polls in seen.values() if len(polls) >= 2)
        if ready >= count:
            break
        if time.monotonic() > warm_deadline:
            print(f"  N={count}: only {ready} of {count} resources polled twice; measuring anyway", flush=True)
            break
        time.sleep(1.0)
    print(f"  N={count}: warm after {time.monotonic() - started:.0f} s; settling {settle:.0f} s ...", flush=True)
    time.sleep(settle)  # the first decisions scale the groups: steady polls come after them
    print(f"  N={count}: measuring {seconds:.0f} s ...", flush=True)
    seen = {name: [at] for name, at in poll_times(metrics_port).items()}
    cpu_before, _, _ = process_usage(operator.pid)
    requests_before = counts.snapshot()
    audit_before = audit.counts()
    window_start = time.monotonic()
    rss_peak = threads_peak = 0
    while time.monotonic() - window_start < seconds:
        time.sleep(1.0)
        for name, at in poll_times(metrics_port).items():
            polls = seen.setdefault(name, [])
            if not polls or polls[-1] != at:
                polls.append(at)
        _, rss, threads = process_usage(operator.pid)
        rss_peak, threads_peak = max(rss_peak, rss), max(threads_peak, threads)
        elapsed = time.monotonic() - window_start
        print(f"\r  N={count}: {elapsed:3.0f}/{seconds:.0f} s", end="", flush=True)
    print(flush=True)
    window = time.monotonic() - window_start
    cpu_after, _, _ = process_usage(operator.pid)
    requests = counts.snapshot() - requests_before
    writes: AuditCounts = audit.counts() - audit_before
    gaps = [later - earlier for name in healthy for earlier, later in itertools.pairwise(seen.get(name, []))]
    polls = sum(max(len(polls) - 1, 0) for polls in seen.values())
    return {
        "resources": count,
        "interval_seconds": interval,
        "window_seconds": round(window, 1),
        "polls": polls,
        "gap_p50": round(statistics.median(gaps), 2) if gaps else None,
        "gap_p95": round(percentile(gaps, 0.95), 2) if gaps else None,
        "gap_max": round(max(gaps), 2) if gaps else None,
        "gap_p95_ratio": round(percentile(gaps, 0.95) / interval, 2) if gaps else None,
        "gap_max_ratio": round(max(gaps) / interval, 2) if gaps else None,
        "healthy_never_polled": sum(1 for name in healthy if len(seen.get(name, [])) < 2),
        "cpu_cores": round((cpu_after - cpu_before) / window, 3),
        "rss_mb": round(rss_peak / 2**20, 1),
        "threads": threads_peak,
        "reads_per_poll": round(requests["read"] / polls, 3) if polls else None,
        "writes_per_poll": round(requests["write"] / polls, 3) if polls else None,
        "watch_requests": requests["watch"],
        "status_write_requests_per_second": round(writes.write_requests / window, 2),
        "status_changes_per_second": round(writes.stored / window, 2),
        "status_write_requests_per_resource": round(writes.write_requests / count, 2),
        "status_write_codes": {str(code): number for code, number in writes.requests.items()},
        "status_fields_changed": dict(writes.fields.most_common()),
        "times_moved_without_change": len(writes.moved),
        "times_moved_examples": [vars(moved) for moved in writes.moved[:5]],
        "hpa_lists_per_second": round(requests[HPA_LIST] / window, 2),
        "requests_by_path": {what: number for what, number in requests.items() if " " in what},
    }


def render(results: list[dict[str, Any]]) -> str:
    header = (
        "| resources | poll gap p50 / p95 / max (s) | p95 / interval | max / interval | CPU (cores) | RSS, peak (MB) "
        "| threads | reads / poll | writes / poll | status writes / s (stored) | times moved | HPA lists / s |"
    )
    lines = [header, "|" + "---|" * 12]
    for row in results:
        lines.append(
            f"| {row['resources']} | {row['gap_p50']} / {row['gap_p95']} / {row['gap_max']} | "
            f"{row['gap_p95_ratio']}x | {row['gap_max_ratio']}x | {row['cpu_cores']} | "
            f"{row['rss_mb']} (peak {row.get('rss_peak_mb')}) | "
            f"{row['threads']} | {row['reads_per_poll']} | {row['writes_per_poll']} | "
            f"{row['status_write_requests_per_second']} ({row['status_changes_per_second']}) | "
            f"{row['times_moved_without_change']} | {row['hpa_lists_per_second']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resources", default="50,200,500", help="comma-separated resource counts")
    parser.add_argument("--interval", type=int, default=5, help="each resource's pollIntervalSeconds")
    parser.add_argument("--seconds", type=float, default=60.0, help="measured window per count")
    parser.add_argument(
        "--settle", type=float, default=30.0, help="seconds after every resource polled twice, before measuring"
    )
    parser.add_argument("--output", type=Path, default=Path("operator-scale-bench.json"))
    parser.add_argument("--by-path", action="store_true", help="also print the requests by method and path")
    parser.add_argument(
        "--scale-to-zero",
        action="store_true",
        help="the healthy resources read an empty topic and rest at zero pods (replicas.min 0, scaleToZero)",
    )
    parser.add_argument(
        "--pods",
        type=int,
        default=0,
        help="every resource runs this many pods, objects shaped as a cluster returns them (the memory scenario)",
    )
    parser.add_argument(
        "--operator-pythonpath",
        help="run the operator from this directory (another checkout's operator/): a before/after comparison",
    )
    args = parser.parse_args(argv)
    if args.pods < 0:
        parser.error(f"--pods must be 0 or more, got {args.pods}")
    if args.pods and args.scale_to_zero:
        parser.error("--pods fixes every resource's size; --scale-to-zero rests them at zero: choose one")
    try:
        sizes = [int(part) for part in args.resources.split(",") if part.strip()]
    except ValueError:
        parser.error(f"--resources must be comma-separated whole numbers, got {args.resources!r}")
    if not sizes or min(sizes) < 1:
        parser.error(f"--resources needs at least one count above 0, got {args.resources!r}")
    results = []
    with EmbeddedBroker() as broker, tempfile.TemporaryDirectory(prefix="operator-bench-") as work:
        create_topics(broker.bootstrap, [TOPIC, EMPTY_TOPIC], 4)
        produce_keyed(broker.bootstrap, TOPIC, 2_000, 50, extra_config={"batch.num.messages": 1})
        for size in sizes:
            results.append(
                run_one(
                    size,
                    args.interval,
                    args.seconds,
                    args.settle,
                    broker,
                    Path(work),
                    args.scale_to_zero,
                    args.pods,
                    args.operator_pythonpath,
                )
            )
            print(render(results[-1:]), flush=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    if args.by_path:
        for row in results:
            print(f"N={row['resources']}: requests in the window, by kind and path (names left out):")
            for what, number in sorted(row["requests_by_path"].items(), key=lambda item: -item[1]):
                print(f"  {number:8d}  {what}")
            print(f"  status fields changed: {row['status_fields_changed']}")
            print(f"  status write codes: {row['status_write_codes']}")
            for moved in row["times_moved_examples"]:
                print(f"  moved without a change: {moved}")
    print(render(results))
    print(f"written to {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
