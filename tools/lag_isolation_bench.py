"""Does one tenant's hostile broker, pod or properties cost the other resources their polls? A measurement (issue 37).

The real kopf operator, in this process, on the API emulator (a FAKE Kubernetes API server, the one the
operator's tests use), with N healthy OrderedConsumers polling every second (their lag source is a stand-in
reading an empty topic, ``tests.operator.test_operator_status_writes.EmptyTopic``) and, depending on the mode,
one more resource whose lag is read by the operator's real reader from a hostile broker
(``tests.unit.hostile_broker``):

- ``none``: no hostile resource (the baseline);
- ``abort``: a broker whose ApiVersions answer aborts librdkafka; read by ``lag_reader.LagReaders``
  (the product's default: the namespace's child process, with its default deadline and back-off);
- ``silent``: a broker that accepts and never answers; the same reader;
- ``in-process``: the ``abort`` broker read the old way, by ``observe.KafkaLagSource`` inside the operator;
- ``huge-report``: a resource of one replica whose ready pod (a Pod object as the kubelet reports it,
  ``tests.operator.kubelet.create_pod``/``report_pod_status``, no process) has a ``podIP:port`` served by
  ``tools.hostile_pod.Pod`` in a process of its own: ``GET /admin/scaling`` answers a JSON list of
  ``HUGE_MIB`` MiB that never closes, without a Content-Length (finding 2);
- ``dripping-report``: the same pod answering a valid head, then one byte every ``DRIP_EVERY`` seconds;
- ``hostile-properties``: a resource whose ``spec.kafka.propertiesSecretRef`` Secret asks for an OIDC token
  endpoint (``sasl.oauthbearer.method=oidc``, the cloud-metadata URL; finding 3).

Each mode runs in a subprocess of its own, so the old way's abort is seen as that subprocess's exit code. For
``--seconds`` after every resource was polled once, the healthy resources' poll starts (the operator's own
``keyorder_operator_last_poll_timestamp_seconds``, read every 50 ms) give the gaps between polls: p50, p95,
max against the 1 s interval; how many readers the hostile resource started, and a live reader's memory
(``silent``: the child is alive between its requests); the polls of the hostile resource itself; the peak
RSS of the mode's process (``ru_maxrss``: the operator, and the API emulator beside it, so compare with
``none``) when the window starts and when it ends; and the hostile resource's condition (``LagUnknown`` for a
broker or properties, ``Ready`` for a pod, whose message carries the failed reads).

    .venv/bin/python -m tools.lag_isolation_bench --resources 20 --seconds 30
    .venv/bin/python -m tools.lag_isolation_bench --resources 3 --seconds 5 --modes huge-report

A figure on a shared 2-core machine: compare the modes of one run, not runs of different days.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "abort", "silent", "in-process", "huge-report", "dripping-report", "hostile-properties")
POD_MODES = {"huge-report": "huge", "dripping-report": "drip"}  # tools.hostile_pod.Pod's modes
HUGE_MIB = 300  # issue 37: a 300 MiB report took the old operator from 22 to 922 MiB
DRIP_EVERY = 1.5  # issue 37: one byte every 1.5 s held a poll thread for over 40 s
REFUSED_PROPERTIES = (  # issue 37 finding 3: the operator's client called the cloud-metadata endpoint for these
    "security.protocol=SASL_PLAINTEXT\n"
    "sasl.mechanism=OAUTHBEARER\n"
    "sasl.oauthbearer.method=oidc\n"
    "sasl.oauthbearer.token.endpoint.url=http://169.254.169.254/metadata/identity/oauth2/token\n"
)
REFUSED_BOOTSTRAP = "127.0.0.1:9"  # the hostile-properties resource's: never dialled, the Secret is refused first

# A hostile pod in a process of its own, so that its sending costs the operator's process no memory or GIL:
# prints its address, serves until its stdin closes.
POD_SERVER = """
import argparse, sys
from tools.hostile_pod import Pod
pod = Pod(sys.argv[1], argparse.Namespace(huge_mib=int(sys.argv[2]), drip_every=float(sys.argv[3]), drip_for=600.0))
print(pod.address, flush=True)
sys.stdin.read()
"""


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(share * len(ordered)), len(ordered) - 1)] if ordered else float("nan")


def reader_kib(source: Any) -> dict[str, int] | None:
    """A live reader child's memory from /proc (kB): RSS, PSS and private dirty pages; None without a child."""
    pid = source.reader.pid
    if pid is None:
        return None
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in rollup.splitlines()[1:])
    return {
        name: int(fields[key].split()[0])
        for name, key in (("rss", "Rss"), ("pss", "Pss"), ("private_dirty", "Private_Dirty"))
    }


def peak_rss_mib() -> float:
    """This process's peak resident memory so far (``ru_maxrss``, KiB on Linux), in MiB."""
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


@contextlib.contextmanager
def hostile_pod(mode: str) -> Iterator[str | None]:
    """The ``host:port`` of a pod serving ``mode``'s hostile report from a child process (None: not a pod mode)."""
    if mode not in POD_MODES:
        yield None
        return
    command = [sys.executable, "-c", POD_SERVER, POD_MODES[mode], str(HUGE_MIB), str(DRIP_EVERY)]
    server = subprocess.Popen(command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdin is not None
        address = server.stdout.readline().strip()
        if not address:
            raise RuntimeError(f"the hostile pod's server did not start (exit code {server.wait(10)})")
        yield address
    finally:
        if server.stdin is not None:
            server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def run_mode(mode: str, resources: int, seconds: float) -> dict[str, Any]:
    """One mode, in this process: the operator, the resources, the measurement."""
    from keyorder_operator.lag_reader import IsolatedLagSource, LagReaderProcess, LagReaders
    from keyorder_operator.observe import KafkaLagSource, LagSource
    from tests.operator.harness import CR, last_poll_at, serve_emulator, wait_for
    from tests.operator.kubelet import consumer_labels, create_pod, report_pod_status
    from tests.operator.test_operator_deployable import condition, operator, resource, secret
    from tests.operator.test_operator_status_writes import EmptyTopic, at_rest
    from tests.unit.hostile_broker import hostile_broker

    behaviour = {"abort": "abort", "silent": "silent", "in-process": "abort"}.get(mode, "silent")
    hostile_readers: list[IsolatedLagSource] = []
    reader_starts: list[float] = []  # wall clock, as the poll times

    def start_reader(memory_bytes: int) -> LagReaderProcess:
        reader_starts.append(time.time())
        return LagReaderProcess(memory_bytes)

    readers = LagReaders(start_reader=start_reader)

    with hostile_broker(behaviour) as address, hostile_pod(mode) as pod_address, serve_emulator() as kube:

        def lag_source_for(properties: dict[str, str]) -> LagSource:
            hostile = (address, REFUSED_BOOTSTRAP) if mode == "hostile-properties" else (address,)
            if properties.get("bootstrap.servers") not in hostile:
                return EmptyTopic(properties)
            if mode == "in-process":
                return KafkaLagSource(properties)
            reader = readers.source("hostile-tenant", properties)  # the hook gets no namespace: one of its own
            hostile_readers.append(reader)
            return reader

        healthy = [f"steady-{index}" for index in range(resources)]
        with operator(kube.url, lag_source_for=lag_source_for):
            if pod_address is not None:  # one replica (the pods are read only then), its pod ready at the server
                kafka = {"bootstrapServers": "127.0.0.1:9092", "topics": ["orders"], "groupId": "hostile"}  # EmptyTopic
                kube.create(CR, resource("hostile", kafka=kafka, replicas={"min": 1}))
                create_pod(kube, "hostile-pod", consumer_labels("hostile"), "consumer", "registry.example/orders:1.0")
                report_pod_status(kube, "hostile-pod", pod_address, ready=True)
            elif mode == "hostile-properties":
                kube.create("v1/secrets", secret("hostile-kafka", **{"client.properties": REFUSED_PROPERTIES}))
                kafka = {"bootstrapServers": REFUSED_BOOTSTRAP, "topics": ["orders"], "groupId": "hostile"}
                kube.create(CR, resource("hostile", kafka=kafka | {"propertiesSecretRef": {"name": "hostile-kafka"}}))
            elif mode != "none":
                kube.create(CR, at_rest("hostile", address))
            for name in healthy:
                kube.create(CR, at_rest(name))
            wait_for(lambda: all(last_poll_at(kube, name) is not None for name in healthy), 120, "first polls")
            rss_at_start = peak_rss_mib()
            watched = healthy + ([] if mode == "none" else ["hostile"])
            starts: dict[str, set[float]] = {name: set() for name in watched}
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for name in watched:
                    at = last_poll_at(kube, name)
                    if at is not None:
                        starts[name].add(at)
                time.sleep(0.05)
            kind = "Ready" if pod_address is not None else "LagUnknown"
            hostile_condition = condition(kube, "hostile", kind) if mode != "none" else {}
            reader_memory = [reader_kib(reader) for reader in hostile_readers]
            rss_at_end = peak_rss_mib()
    spans = [(a, b) for name in healthy for a, b in zip(sorted(starts[name]), sorted(starts[name])[1:], strict=False)]
    gaps = [b - a for a, b in spans]
    hostile_starts = sorted(starts.get("hostile", ()))
    hostile_gaps = [b - a for a, b in pairwise(hostile_starts)]
    # a gap "at a reader start" spans one (or began within a second after it)
    near = [b - a for a, b in spans if any(a - 1.0 <= at <= b for at in reader_starts)]
    elsewhere = [b - a for a, b in spans if not any(a - 1.0 <= at <= b for at in reader_starts)]
    return {
        "mode": mode,
        "resources": resources,
        "seconds": seconds,
        "polls": sum(len(times) for times in starts.values()),
        "gap_p50": round(statistics.median(gaps), 3) if gaps else None,
        "gap_p95": round(percentile(gaps, 0.95), 3) if gaps else None,
        "gap_max": round(max(gaps), 3) if gaps else None,
        "hostile_readers_started": len(reader_starts),
        "gap_max_at_reader_start": round(max(near), 3) if near else None,
        "gap_max_elsewhere": round(max(elsewhere), 3) if elsewhere else None,
        "reader_memory_kib": next((memory for memory in reader_memory if memory), None),
        "hostile_polls": len(starts.get("hostile", ())),
        "hostile_gap_max": round(max(hostile_gaps), 3) if hostile_gaps else None,
        "rss_peak_mib_at_start": rss_at_start,
        "rss_peak_mib": rss_at_end,
        "hostile_condition": (
            f"{hostile_condition.get('type', '')}={hostile_condition.get('status', '')} "
            f"{hostile_condition.get('reason', '')}: {hostile_condition.get('message', '')}"
        )[:200]
        if hostile_condition
        else "",
        "exit_code": 0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--resources", type=int, default=20, help="healthy resources beside the hostile one")
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window per mode")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a subprocess runs one mode and prints JSON
    arguments = parser.parse_args(argv)
    if arguments.one:
        print(json.dumps(run_mode(arguments.one, arguments.resources, arguments.seconds)))
        return 0
    rows = []
    for mode in arguments.modes.split(","):
        if mode not in MODES:
            parser.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
        command = [sys.executable, "-m", "tools.lag_isolation_bench", "--one", mode]
        command += ["--resources", str(arguments.resources), "--seconds", str(arguments.seconds)]
        run = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=arguments.seconds + 300)
        lines = [line for line in run.stdout.splitlines() if line.startswith("{")]
        if run.returncode == 0 and lines:
            rows.append(json.loads(lines[-1]))
        else:
            last = (run.stderr.strip().splitlines() or [""])[-1][:120]
            rows.append({"mode": mode, "exit_code": run.returncode, "hostile_condition": f"process ended: {last}"})
    print(
        f"{'mode':<18} {'exit':>4} {'polls':>6} {'gap p50':>8} {'gap p95':>8} {'gap max':>8} {'readers':>8} "
        f"{'h.polls':>7} {'h.gap max':>9} {'RSS MiB':>13}"
    )
    for row in rows:
        rss = f"{row['rss_peak_mib_at_start']}->{row['rss_peak_mib']}" if "rss_peak_mib" in row else "-"
        print(
            f"{row['mode']:<18} {row['exit_code']:>4} {row.get('polls', '-')!s:>6} {row.get('gap_p50', '-')!s:>8} "
            f"{row.get('gap_p95', '-')!s:>8} {row.get('gap_max', '-')!s:>8} "
            f"{row.get('hostile_readers_started', '-')!s:>8} {row.get('hostile_polls', '-')!s:>7} "
            f"{row.get('hostile_gap_max', '-')!s:>9} {rss:>13}"
        )
    print("the hostile resource's condition at the end of the window:")
    for row in rows:
        print(f"  {row['mode']}: {row.get('hostile_condition') or '-'}")
    for row in rows:
        if row.get("gap_max_at_reader_start") is not None:
            print(
                f"{row['mode']}: longest gap spanning a reader start {row['gap_max_at_reader_start']} s, "
                f"elsewhere {row['gap_max_elsewhere']} s"
            )
        if row.get("reader_memory_kib"):
            print(f"{row['mode']}: a live reader process, kB: {row['reader_memory_kib']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
