"""What a hostile pod costs the operator: its peak memory and time for one scaling-report read.

Issue 37 (finding 2) measured a 300 MiB report raising the operator's peak memory from 22 to 922 MiB
and a reply dripping one byte every 1.5 s holding a poll thread for over 40 s. This probe serves
such replies from a real socket in this process and lets ``keyorder_operator.pod_admin.fetch_reports``
read them in a child process (the operator's side alone), which reports its peak RSS before and
after the read and how long the read took:

- ``huge``: ``--huge-mib`` MiB of a JSON list that never closes, without a Content-Length;
- ``drip``: a valid head, then the body one byte every ``--drip-every`` seconds, for at most
  ``--drip-for`` seconds (then the pod hangs up).

``--slow-clients N`` measures the other side, the pod's HTTP server (finding 4): a pod's server
(``keyorder.adapters.http_server.PodHttpServer`` on a stand-in runtime, in a child process) gets N
connections (opened 10 ms apart) that each send a byte every 5 s for ``--slow-seconds``; then it prints the server
process's threads, the slow connections it still holds, and how long a ``/readyz`` probe took.

``--parallel-pods N`` measures what parsing costs (the review of issue 37's fix): N pods (default 32,
``MAX_PARALLEL``) of each of ``--resources R`` resources polled at once (threads, as kopf's) answer a
``--payload``: ``objects``, 1 MiB (``--objects-kib``) of ``[{},{},...]`` (25 MiB parsed, the worst per
byte under the old 1 MiB limit), or ``keyed``, a well-formed report whose ``partitions`` are ``{"<unique key>":1}``, as
many as the current token limit lets through (the costliest report, per byte, that reaches the
parser; refused once parsed, as it has more than ``MAX_REPORT_PARTITIONS``), or ``full``, a report of
5,990 partitions, each with distinct values and blocked (the costliest one the operator keeps for
the poll: it keeps the partitions whose commit is held); it prints the operator's peak RSS.

``--non-readers N`` measures the pod's server under clients that send ``GET /metrics`` (an 8 MiB
scrape here) with a 4 KiB receive buffer and never read: then the operator's authenticated
``PUT /admin/workers`` and an anonymous ``GET /admin/workers``, their status and time.

``--against COMMIT`` runs the same on that commit's ``operator/`` and ``consumer/`` (extracted with
``git archive``) first. ``--real-report`` prints the size of a real scaling report instead
(``keyorder.adapters.scaling_report.build_report``; the report names only the busiest key, so its
size grows with the assigned partitions, not with the keys)::

    .venv/bin/python -m tools.hostile_pod --against a687531
    .venv/bin/python -m tools.hostile_pod --against a687531 --slow-clients 300
    .venv/bin/python -m tools.hostile_pod --real-report
    .venv/bin/python -m tools.hostile_pod --against HEAD~1 --parallel-pods 32 --resources 4 --payload objects
    .venv/bin/python -m tools.hostile_pod --against 5d5147c --non-readers 40
"""

from __future__ import annotations

import argparse
import io
import json
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HEAD = b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n"

CHILD = """
import json, resource, sys, time
sys.path[:0] = [sys.argv[1] + "/operator", sys.argv[1] + "/consumer"]
from keyorder_operator.pod_admin import fetch_reports
def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
before = rss_mib()
started = time.monotonic()
reports, failures = fetch_reports([sys.argv[2]], 0, "t" * 24)
seconds = time.monotonic() - started
print(json.dumps({"rss_before_mib": before, "rss_peak_mib": rss_mib(), "seconds": seconds, "failures": failures}))
"""


PARALLEL_CHILD = """
import json, resource, sys, threading, time
sys.path[:0] = [sys.argv[1] + "/operator", sys.argv[1] + "/consumer"]
from keyorder_operator.pod_admin import fetch_reports
def rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
addresses, resources = json.loads(sys.argv[2]), int(sys.argv[3])
before = rss_mib()
failures = []
def poll():
    failures.extend(fetch_reports(addresses, 0, "t" * 24, timeout=30)[1])
started = time.monotonic()
polls = [threading.Thread(target=poll) for _ in range(resources)]
for thread in polls:
    thread.start()
for thread in polls:
    thread.join()
seconds = time.monotonic() - started
print(json.dumps({"rss_before_mib": before, "rss_peak_mib": rss_mib(), "seconds": seconds, "failures": failures}))
"""


def payload(kind: str, objects_kib: int = 1024) -> bytes:
    """A hostile report body: see ``--payload``."""
    if kind == "objects":
        return b"[" + b",".join([b"{}"] * (objects_kib * 1024 // 3 - 100)) + b"]"
    head = (
        b'{"version": 1, "workers": 1, "workersBusy": 0, "handlerCallsTotal": 0, "rebalancesTotal": 0,'
        b' "partitionsAssigned": 1, "inflight": 0, "handlerSecondsTotal": 0, "lanes": {"ready": 0, "queued": 0},'
        b' "partitions": ['
    )
    elements, size = [], len(head) + 2
    for number in range(36 * 1024 // 2 - 20):  # 2 tokens ('{' and ',') each
        element = b'{"%x":1}' % number
        if kind == "full":  # 6 tokens each, every value its own object
            if number == 5990:
                break
            element = b'{"topic":"%x","partition":%d,"lag":%d,"inflight":%d,"minOffsetHeld":"blocked"}' % (
                number,
                number,
                10**9 + number,
                10**5 + number,
            )
        if size + len(element) + 1 > 500 * 1024:
            break
        elements.append(element)
        size += len(element) + 1
    return head + b",".join(elements) + b"]}"


def parallel_pods(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """``--parallel-pods`` hostile pods per resource, ``--resources`` resources polled at once."""
    body = payload(args.payload, args.objects_kib)
    pods = [Pod("payload", args, b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)]
    addresses = [pods[0].address] * args.parallel_pods
    done = subprocess.run(
        [sys.executable, "-c", PARALLEL_CHILD, str(tree), json.dumps(addresses), str(args.resources)],
        capture_output=True,
        text=True,
        check=True,
    )
    pods[0].listener.close()
    figures = dict(json.loads(done.stdout.strip().splitlines()[-1]))
    figures["payload_bytes"] = len(body)
    return figures


NON_READER_POD = """
import sys, threading, tempfile
sys.path[:0] = [sys.argv[1] + "/operator", sys.argv[1] + "/consumer"]
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import CollectorRegistry
from keyorder.adapters.http_server import PodHttpServer
from keyorder.engine.poll_loop import RuntimeSnapshot
class Runtime:
    snapshot = RuntimeSnapshot(broker_reachable=True, assigned_partitions=2)
    started = threading.Event()
    stopping = False
    workers = 2
    def request_resize(self, workers):
        previous, self.workers = self.workers, workers
        return previous
class Large:
    def collect(self):
        family = GaugeMetricFamily("large", "an 8 MiB scrape", labels=["series"])
        family.add_metric(["x" * (8 * 1024 * 1024)], 1)
        yield family
Runtime.started.set()
registry = CollectorRegistry()
registry.register(Large())
server = PodHttpServer(Runtime(), registry, "127.0.0.1", 0, lambda: "t" * 24)
server.start()
print(server.port, flush=True)
sys.stdin.read()
"""


def non_readers(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """N clients that never read a scrape, then the operator's push and an anonymous admin read."""
    child = subprocess.Popen(
        [sys.executable, "-c", NON_READER_POD, str(tree)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    port = int(child.stdout.readline())
    clients = []
    for _ in range(args.non_readers):
        client = socket.socket()
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        client.connect(("127.0.0.1", port))
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: pod\r\n\r\n")
        clients.append(client)
    time.sleep(2.0)  # the scrapes computed and stuck in their sends
    figures: dict[str, Any] = {}
    for name, request in (
        ("push", b"PUT /admin/workers HTTP/1.1\r\nAuthorization: Bearer " + b"t" * 24
         + b"\r\nContent-Length: 14\r\n\r\n{\"workers\": 5}"),
        ("anonymous", b"GET /admin/workers HTTP/1.1\r\n\r\n"),
    ):  # fmt: skip
        started = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as probe:
                probe.sendall(request)
                answer = probe.recv(100).split(b"\r\n", 1)[0].decode()
        except OSError as error:
            answer = f"no answer: {error}"
        figures[name] = f"{answer!r} in {time.monotonic() - started:.3f} s"
    for client in clients:
        client.close()
    child.stdin.close()
    child.wait(10)
    return figures


POD_CHILD = """
import sys, threading, time
sys.path[:0] = [sys.argv[1] + "/operator", sys.argv[1] + "/consumer"]
from prometheus_client.registry import CollectorRegistry
from keyorder.adapters.http_server import PodHttpServer
from keyorder.engine.poll_loop import RuntimeSnapshot
class Runtime:
    snapshot = RuntimeSnapshot(broker_reachable=True, assigned_partitions=2)
    started = threading.Event()
    stopping = False
    workers = 2
Runtime.started.set()
server = PodHttpServer(Runtime(), CollectorRegistry(), "127.0.0.1", 0, None)
server.start()
print(server.port, flush=True)
sys.stdin.read()
"""


def slow_clients(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    """N slow clients against a pod's server from ``tree``: its threads, what it holds, a probe's time."""
    child = subprocess.Popen(
        [sys.executable, "-c", POD_CHILD, str(tree)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,  # the server's own log of what it refused
        text=True,
    )
    assert child.stdout is not None and child.stdin is not None
    port = int(child.stdout.readline())
    clients = []
    for _ in range(args.slow_clients):
        client = socket.create_connection(("127.0.0.1", port), timeout=10)
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: pod\r\nX-Slow: ")
        client.setblocking(False)
        clients.append(client)
        time.sleep(0.01)  # paced, so that the figure is about held threads, not a burst beyond the backlog
    open_clients = set(clients)
    end = time.monotonic() + args.slow_seconds
    while time.monotonic() < end:
        time.sleep(min(5.0, max(0.0, end - time.monotonic())))
        for client in list(open_clients):
            try:
                client.recv(4096)  # a reply (408) or the end: the server let this client go
                open_clients.discard(client)
                continue
            except BlockingIOError:
                pass
            except OSError:
                open_clients.discard(client)
                continue
            try:
                client.send(b"x")
            except OSError:
                open_clients.discard(client)
    threads = next(
        int(line.split()[1]) for line in Path(f"/proc/{child.pid}/status").read_text().splitlines()
        if line.startswith("Threads:")
    )  # fmt: skip
    started = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as probe:
            probe.sendall(b"GET /readyz HTTP/1.1\r\nHost: pod\r\n\r\n")
            answer = probe.recv(100).split(b"\r\n", 1)[0].decode()
    except OSError as error:
        answer = f"no answer: {error}"
    probe_seconds = time.monotonic() - started
    for client in clients:
        client.close()
    child.stdin.close()
    child.wait(10)
    return {"threads": threads, "held": len(open_clients), "probe": answer, "probe_seconds": probe_seconds}


class Pod:
    """Serves one hostile reply per connection on a loopback port (a thread per connection)."""

    def __init__(self, mode: str, args: argparse.Namespace, reply: bytes = b"") -> None:
        self.mode = mode
        self.args = args
        self.reply = reply
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            connection, _ = self.listener.accept()
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            try:
                connection.recv(65536)  # the request (one packet from http.client)
                if self.mode == "payload":
                    connection.sendall(self.reply)
                elif self.mode == "huge":
                    connection.sendall(HEAD + b"[")
                    chunk = b"0," * (512 * 1024)
                    for _ in range(self.args.huge_mib):
                        connection.sendall(chunk)
                else:
                    connection.sendall(HEAD)
                    give_up = time.monotonic() + self.args.drip_for
                    while time.monotonic() < give_up:
                        time.sleep(self.args.drip_every)
                        connection.sendall(b" ")
            except OSError:
                pass  # the operator hung up: a bounded reader does


def read_once(tree: Path, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    pod = Pod(mode, args)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tree), pod.address], capture_output=True, text=True, check=True
    )
    pod.listener.close()
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def real_report_sizes() -> None:
    from keyorder.adapters.scaling_report import build_report
    from keyorder.core.lanes import LaneSummary
    from keyorder.engine.poll_loop import PartitionSnapshot, RuntimeSnapshot

    for partitions, topic in ((1000, "orders"), (1000, "t" * 249), (10000, "orders")):
        parts = tuple(
            PartitionSnapshot(topic, p, 10**12, 10**12 + 5 * 10**6, 10**12 + 1, 3.5, 2000, 2000, True, 10**9)
            for p in range(partitions)
        )
        snapshot = RuntimeSnapshot(partitions=parts, inflight=10**6, assigned_partitions=partitions)
        lanes = LaneSummary(
            ready=100_000,
            queued=10**6,
            longest_backlog=5000,
            active=100_000,  # keys with work: only the busiest one is named, at most 80 characters
            parked_heads=frozenset(),
            longest_lane=b"k" * 1000,
        )
        report = build_report(
            snapshot, lanes, [], ordering="key", executor="thread", workers=64, cpu_cores=8.0,
            cpu_seconds=1e6, worker_processes=0,
        )  # fmt: skip
        size = len(json.dumps(report).encode())
        print(f"{partitions} partitions, topic of {len(topic)} characters, 100,000 keys: {size / 1024:.0f} KiB")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="also measure this commit's operator (before)")
    parser.add_argument("--huge-mib", type=int, default=300)
    parser.add_argument("--drip-every", type=float, default=1.5)
    parser.add_argument("--drip-for", type=float, default=45.0)
    parser.add_argument("--real-report", action="store_true", help="print real report sizes and exit")
    parser.add_argument("--slow-clients", type=int, default=0, help="measure the pod's server under N slow clients")
    parser.add_argument("--slow-seconds", type=float, default=30.0)
    parser.add_argument("--parallel-pods", type=int, default=0, help="measure N hostile pods per resource")
    parser.add_argument("--resources", type=int, default=1, help="resources polled at once (--parallel-pods)")
    parser.add_argument("--non-readers", type=int, default=0, help="measure the pod's server under N non-readers")
    parser.add_argument("--objects-kib", type=int, default=1024, help="size of the objects payload")
    parser.add_argument("--payload", choices=("objects", "keyed", "full"), default="objects")
    args = parser.parse_args(argv)
    if args.real_report:
        real_report_sizes()
        return 0
    trees = []
    with tempfile.TemporaryDirectory() as scratch:
        if args.against:
            archive = subprocess.run(
                ["git", "archive", args.against, "operator", "consumer"], cwd=ROOT, capture_output=True, check=True
            ).stdout
            with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
                tar.extractall(scratch, filter="data")
            trees.append((f"before ({args.against})", Path(scratch)))
        trees.append(("after (working tree)", ROOT))
        for label, tree in trees:
            if args.non_readers:
                figures = non_readers(tree, args)
                print(
                    f"{label:24} {args.non_readers} non-reading scrapes: the operator's PUT /admin/workers "
                    f"{figures['push']}, an anonymous GET /admin/workers {figures['anonymous']}"
                )
                continue
            if args.parallel_pods:
                figures = parallel_pods(tree, args)
                reasons = sorted({failure.split(": ", 1)[1][:90] for failure in figures["failures"]})
                print(
                    f"{label:24} {args.resources} x {args.parallel_pods} pods, {args.payload} "
                    f"({figures['payload_bytes'] / 1024:.0f} KiB): peak RSS {figures['rss_before_mib']:.0f} -> "
                    f"{figures['rss_peak_mib']:.0f} MiB, {figures['seconds']:.1f} s, "
                    f"{len(figures['failures'])} failures: {'; '.join(reasons)}"
                )
                continue
            if args.slow_clients:
                pod = slow_clients(tree, args)
                print(
                    f"{label:24} {args.slow_clients} slow clients after {args.slow_seconds:g} s: {pod['threads']} "
                    f"threads, {pod['held']} held, /readyz {pod['probe']!r} in {pod['probe_seconds']:.3f} s"
                )
                continue
            for mode in ("huge", "drip"):
                figures = read_once(tree, mode, args)
                print(
                    f"{label:24} {mode:5} peak RSS {figures['rss_before_mib']:.0f} -> {figures['rss_peak_mib']:.0f}"
                    " MiB,"
                    f" {figures['seconds']:.1f} s: {'; '.join(figures['failures'])[:110]}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
