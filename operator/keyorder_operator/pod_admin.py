"""Talking to a group's pods through their token-protected admin endpoints, all pods at once.

Two calls: ``GET /admin/scaling`` reads each pod's scaling report on every poll (what the policy
needs to know *why* the group drains as it does), ``PUT /admin/workers`` pushes the decided
key-worker count (the pods resize live: no restart, no rebalance) to the pods whose report says
another count, or that did not report (a new pod, one that restarted). Both go to the pods
concurrently, so one slow or dead pod costs one deadline, not one per pod.

A pod runs a tenant's image, so its replies are untrusted input (docs/security.md, "Reading from
pods"): every request has an overall deadline (connect, send, status line, headers and body
together, computed from the injected ``clock``, not a timeout per socket read that a pod dripping
a byte at a time renews forever) and a size limit on everything read (``MAX_REPLY_BYTES``), checked
while reading, so a huge reply is refused at the limit instead of being held in memory. Parsing a
report costs memory per JSON value, up to 25 times its bytes, so before ``json.loads`` a report's
values are counted (``MAX_REPLY_TOKENS``), and every parse in the process shares one budget of bytes
(``PARSE_BUDGET_BYTES``): a group's pods, and the groups polled at once, cannot multiply the cost.

Addresses are ``host`` (the port is the CR's ``httpPort``) or ``host:port`` (local processes in
``keyorder dev``, which share one host).
"""

from __future__ import annotations

import http.client
import io
import json
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

from keyorder_operator.pod_signals import BadPodReport, parse_report

log = logging.getLogger(__name__)

T = TypeVar("T")
ADDRESS = "address"
"""The key ``fetch_reports`` adds to each report: the address it was read from."""
MAX_PARALLEL = 32
TIMEOUT_SECONDS = 2.0
"""The overall deadline of one request to one pod: connecting, sending, and reading the whole reply."""
MAX_REPLY_BYTES = 512 * 1024
"""Most bytes read from one pod for one scaling report (status line, headers and body). A real report
grows with the pod's assigned partitions, not with its keys (it names only the busiest one, cut to 80
characters): each partition takes 91 to 110 bytes plus its topic's name (``python -m tools.hostile_pod
--real-report``: 1,000 partitions take 94 KiB, 332 KiB with 249-character names, Kafka's longest). The
supported maximum is **4,000 partitions per pod with topic names up to 20 characters, or 1,400
partitions of any name** (a group needs that many partitions before one pod reads them); a larger
report is refused."""
MAX_REPLY_TOKENS = 36 * 1024
"""Most ``{``, ``[`` and ``,`` in one report, counted (``bytes.count``) before it is parsed. Parsing
costs memory per value, not per byte: a megabyte of ``[{},{},...]`` takes 25 MiB parsed, ``[[],...]``
22.5 MiB, ``[1e1,...]`` 9.2 MiB. A real report has 6 per partition and at least 91 bytes per
partition, so one within ``MAX_REPLY_BYTES`` has at most some 34,600: this limit never refuses one,
and bounds what the worst payload under it costs parsed to 5 MiB (measured with tracemalloc:
``{"<unique key>":1}`` elements, the costliest value per token)."""
PARSE_BUDGET_BYTES = 1024 * 1024
"""Most reply bytes being parsed (``json.loads`` and the check) at once in the whole operator process,
over every resource and pod: a semaphore of bytes, so that the operator's poll threads (kopf runs
several resources at once, each with up to ``MAX_PARALLEL`` pods) cannot multiply the cost of a parse.
A reply waits for its share until its request's deadline. Two replies of the largest size fit at once;
at 25 times its size parsed (the worst per byte), all parses together take at most some 26 MiB."""
MAX_PUSH_REPLY_BYTES = 64 * 1024
"""Most bytes read from one pod's answer to a worker push (``{"workers": n, "previous": m}``)."""
READ_CHUNK_BYTES = 64 * 1024


class PodReplyRefused(OSError):
    """A pod's reply broke a limit (its size or the request's deadline): nothing more is read from it."""


class ParseBudget:
    """A semaphore of bytes: ``hold(n)`` waits until ``n`` bytes of the capacity are free and holds them.

    Shared by every parse of a pod's reply in the process (``PARSE_BUDGET``). A share larger than the
    capacity takes the whole capacity (it waits for every other parse to end)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._free = capacity
        self._changed = threading.Condition()

    @contextmanager
    def hold(self, size: int, seconds: float) -> Iterator[None]:
        """Hold ``size`` bytes (at most the capacity) while the block runs; ``PodReplyRefused`` when they
        are not free within ``seconds``."""
        share = min(size, self.capacity)
        with self._changed:
            if not self._changed.wait_for(lambda: self._free >= share, timeout=max(0.0, seconds)):
                raise PodReplyRefused(
                    f"no room to parse {size} bytes within the request's deadline: the operator is parsing "
                    f"{self.capacity - self._free} bytes of other pods' replies (PARSE_BUDGET_BYTES {self.capacity})"
                )
            self._free -= share
        try:
            yield
        finally:
            with self._changed:
                self._free += share
                self._changed.notify_all()

    @property
    def held(self) -> int:
        """Bytes being parsed now."""
        with self._changed:
            return self.capacity - self._free


PARSE_BUDGET = ParseBudget(PARSE_BUDGET_BYTES)


def check_before_parsing(payload: bytes, max_tokens: int = MAX_REPLY_TOKENS) -> None:
    """Refuse (``BadPodReport``) a report with more values than a real one can have: ``{``, ``[`` and
    ``,`` counted without parsing (inside strings too: a real report's strings have few)."""
    tokens = payload.count(b"{") + payload.count(b"[") + payload.count(b",")
    if tokens > max_tokens:
        raise BadPodReport(
            f"not a report: {tokens} JSON objects, lists and commas in {len(payload)} bytes, over the limit of "
            f"{max_tokens} (a real report has 6 per partition): refused unparsed"
        )


class _Budget:
    """What one request may still spend: time until its deadline (on ``clock``) and bytes to read."""

    def __init__(self, timeout: float, max_bytes: int, clock: Callable[[], float]) -> None:
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.clock = clock
        self.deadline = clock() + timeout
        self.read = 0

    def seconds_left(self) -> float:
        left = self.deadline - self.clock()
        if left <= 0:
            raise PodReplyRefused(f"no complete reply within the deadline of {self.timeout:g} s per request")
        return left

    def count(self, received: int) -> None:
        self.read += received
        if self.read > self.max_bytes:
            raise PodReplyRefused(f"reply larger than the limit of {self.max_bytes} bytes: refused")


class _BudgetedReader(io.RawIOBase):
    """The socket's bytes under the request's budget: each read may wait only until the deadline and
    may not take the total past the byte limit."""

    def __init__(self, sock: socket.socket, budget: _Budget) -> None:
        super().__init__()
        self._sock = sock
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        self._sock.settimeout(self._budget.seconds_left())
        try:
            received = self._sock.recv_into(buffer)
        except TimeoutError:
            self._budget.seconds_left()  # past the deadline now: raises the refusal naming it
            raise
        self._budget.count(received)
        return received


class _BudgetedSocket:
    """What ``http.client`` uses of a socket (``sendall``, ``makefile``, ``close``), under the budget."""

    def __init__(self, sock: socket.socket, budget: _Budget) -> None:
        self._sock = sock
        self._budget = budget

    def sendall(self, data: bytes) -> None:
        self._sock.settimeout(self._budget.seconds_left())  # since 3.5 the timeout bounds the whole sendall
        self._sock.sendall(data)

    def makefile(self, mode: str, *args: Any, **kwargs: Any) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"only reading is budgeted, not mode {mode!r}")
        return io.BufferedReader(_BudgetedReader(self._sock, self._budget))

    def close(self) -> None:
        """Nothing: ``http.client`` closes the connection of an HTTP/1.0 reply before its body is read
        (a real socket stays open while its file is); ``_BudgetedConnection.release`` closes it."""


class _BudgetedConnection(http.client.HTTPConnection):
    """An HTTP connection whose every step (connect, send, read) spends one ``_Budget``."""

    def __init__(self, host: str, port: int, budget: _Budget) -> None:
        super().__init__(host, port, timeout=budget.seconds_left())
        self._budget = budget
        self._socket: socket.socket | None = None

    def connect(self) -> None:
        self.timeout = self._budget.seconds_left()
        super().connect()
        self._socket = self.sock
        self.sock = _BudgetedSocket(self.sock, self._budget)

    def release(self) -> None:
        """Close the connection and its socket (whatever was read of the reply)."""
        self.close()
        if self._socket is not None:
            self._socket.close()


def _target(address: str, port: int) -> tuple[str, int]:
    """(host, port) of a pod address: ``host:port`` for local processes, else ``host`` and the CR's port."""
    if address.count(":") == 1:  # host:port (local processes); IPv6 addresses have more colons
        host, _, given = address.partition(":")
        return host, int(given)
    return address.strip("[]"), port


def request(
    address: str,
    port: int,
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes | None = None,
    *,
    timeout: float = TIMEOUT_SECONDS,
    max_bytes: int = MAX_REPLY_BYTES,
    clock: Callable[[], float] = time.monotonic,
) -> bytes:
    """One request to one pod; returns the body of a 2xx reply. Raises ``PodReplyRefused`` past the
    deadline (``timeout`` seconds on ``clock`` from now, for the whole exchange) or past ``max_bytes``
    read, ``OSError`` when the pod cannot be reached, and ``ValueError("HTTP <status>")`` for another
    status."""
    budget = _Budget(timeout, max_bytes, clock)
    host, port = _target(address, port)
    connection = _BudgetedConnection(host, port, budget)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        if not 200 <= response.status < 300:
            raise ValueError(f"HTTP {response.status}")
        declared = response.getheader("Content-Length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            raise PodReplyRefused(f"reply of {declared} bytes, over the limit of {max_bytes} bytes: refused unread")
        payload = bytearray()
        while chunk := response.read(READ_CHUNK_BYTES):
            payload += chunk
        return bytes(payload)
    except http.client.HTTPException as error:  # a reply that is not HTTP (or ends early)
        raise ValueError(f"not an HTTP reply: {type(error).__name__} {error}".rstrip()) from None
    finally:
        connection.release()


def _each(addresses: Sequence[str], call: Callable[[str], T]) -> tuple[list[T], list[str]]:
    """Run ``call`` for every address concurrently: (results, failures as 'address: reason')."""
    results: list[T] = []
    failures: list[str] = []
    if not addresses:
        return results, failures
    with ThreadPoolExecutor(max_workers=min(len(addresses), MAX_PARALLEL)) as executor:
        futures = [(address, executor.submit(call, address)) for address in addresses]
        for address, future in futures:
            try:
                results.append(future.result())
            except (OSError, ValueError) as error:
                failures.append(f"{address}: {error or type(error).__name__}")
    return results, failures


def needing_push(
    addresses: Sequence[str], reports: Sequence[dict[str, Any]], workers: int, *, lower: bool = True
) -> list[str]:
    """The addresses to push ``workers`` to: every one whose report says another count, or that did not
    report this poll (new, restarted, or unreachable: the push is cheap and idempotent). With ``lower``
    False (``policy.Decision.hold_workers``: a scale step has not settled), not those that report more
    workers: a pod running more keeps them until the step settles. A pod that did not report is still
    pushed (a new pod runs ``spec.workers.initial`` until the push, and may run more than the count)."""
    counts = {report.get(ADDRESS): report.get("workers") for report in reports}
    at_size = {address for address, count in counts.items() if count == workers}
    if not lower:
        at_size |= {address for address, count in counts.items() if isinstance(count, int) and count > workers}
    return [address for address in addresses if address not in at_size]


def push_workers(
    addresses: Sequence[str],
    port: int,
    token: str,
    workers: int,
    timeout: float = TIMEOUT_SECONDS,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[int, list[str]]:
    """PUT ``{"workers": n}`` to every pod; returns (pods updated, failures as 'address: reason')."""
    body = json.dumps({"workers": workers}).encode()
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}

    def put(address: str) -> None:
        request(
            address,
            port,
            "PUT",
            "/admin/workers",
            headers,
            body,
            timeout=timeout,
            max_bytes=MAX_PUSH_REPLY_BYTES,
            clock=clock,
        )

    done, failures = _each(addresses, put)
    if failures:
        log.warning("could not push %d workers to %d pods: %s", workers, len(failures), "; ".join(failures))
    return len(done), failures


def _parse(payload: bytes) -> dict[str, Any]:
    """The report in ``payload``, checked and cut to what the operator reads (``parse_report``), or
    ``BadPodReport``. Raised after the ``except`` blocks end: an exception raised inside one keeps the
    failing one as its context, whose traceback keeps the whole parsed JSON alive (in the poll's
    futures, for every pod at once) long after the parse budget was given back."""
    try:
        return parse_report(json.loads(payload))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        reason = f"not JSON: {error}"
    except RecursionError:  # e.g. a megabyte of '[': the parser gives up, the poll must not
        reason = "not a report: JSON nested too deeply"
    except ValueError as error:  # BadPodReport, and an integer of more than 4,300 digits
        reason = str(error)
    raise BadPodReport(reason)


def fetch_reports(
    addresses: Sequence[str],
    port: int,
    token: str,
    timeout: float = TIMEOUT_SECONDS,
    *,
    max_bytes: int = MAX_REPLY_BYTES,
    clock: Callable[[], float] = time.monotonic,
    parse_budget: ParseBudget = PARSE_BUDGET,
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every pod's scaling report, checked, with the address it came from (``ADDRESS``); returns
    (reports, failures as 'address: reason'). Each pod's request ends at its deadline and at
    ``max_bytes``; its reply is parsed only if it has no more values than a real report
    (``MAX_REPLY_TOKENS``), and only while ``parse_budget`` has room for it (see the module docstring)."""
    headers = {"Authorization": f"Bearer {token}"}

    def get(address: str) -> dict[str, Any]:
        deadline = clock() + timeout
        payload = request(
            address, port, "GET", "/admin/scaling", headers, timeout=timeout, max_bytes=max_bytes, clock=clock
        )
        check_before_parsing(payload)
        with parse_budget.hold(len(payload), deadline - clock()):
            report = _parse(payload)
        return {**report, ADDRESS: address}

    return _each(addresses, get)
