"""Talking to a group's pods through their token-protected admin endpoints, all pods at once.

Two calls: ``GET /admin/scaling`` reads each pod's scaling report on every poll (what the policy
needs to know *why* the group drains as it does), ``PUT /admin/workers`` pushes the decided
key-worker count (the pods resize live: no restart, no rebalance) to the pods whose report says
another count, or that did not report (a new pod, one that restarted). Both go to the pods
concurrently with a short timeout, so one slow or dead pod costs one timeout, not one per pod.

Addresses are ``host`` (the port is the CR's ``httpPort``) or ``host:port`` (local processes in
``keyorder dev``, which share one host).
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from keyorder_operator.pod_signals import BadPodReport, parse_report

log = logging.getLogger(__name__)

T = TypeVar("T")
ADDRESS = "address"
"""The key ``fetch_reports`` adds to each report: the address it was read from."""
MAX_PARALLEL = 32
TIMEOUT_SECONDS = 2.0


def _url(address: str, port: int, path: str) -> str:
    if address.count(":") == 1:  # host:port (local processes)
        return f"http://{address}{path}"
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}{path}"


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
            except urllib.error.HTTPError as error:
                error.close()  # it holds the response's socket
                failures.append(f"{address}: HTTP {error.code}")
            except (urllib.error.URLError, OSError, ValueError) as error:
                reason = getattr(error, "reason", None) or error
                failures.append(f"{address}: {reason}")
    return results, failures


def needing_push(addresses: Sequence[str], reports: Sequence[dict[str, Any]], workers: int) -> list[str]:
    """The addresses to push ``workers`` to: every one whose report says another count, or that did not
    report this poll (new, restarted, or unreachable: the push is cheap and idempotent)."""
    at_size = {report.get(ADDRESS) for report in reports if report.get("workers") == workers}
    return [address for address in addresses if address not in at_size]


def push_workers(
    addresses: Sequence[str], port: int, token: str, workers: int, timeout: float = TIMEOUT_SECONDS
) -> tuple[int, list[str]]:
    """PUT ``{"workers": n}`` to every pod; returns (pods updated, failures as 'address: reason')."""
    body = json.dumps({"workers": workers}).encode()

    def put(address: str) -> None:
        request = urllib.request.Request(
            _url(address, port, "/admin/workers"),
            data=body,
            method="PUT",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()

    done, failures = _each(addresses, put)
    if failures:
        log.warning("could not push %d workers to %d pods: %s", workers, len(failures), "; ".join(failures))
    return len(done), failures


def fetch_reports(
    addresses: Sequence[str], port: int, token: str, timeout: float = TIMEOUT_SECONDS
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every pod's scaling report, checked, with the address it came from (``ADDRESS``); returns
    (reports, failures as 'address: reason')."""

    def get(address: str) -> dict[str, Any]:
        request = urllib.request.Request(
            _url(address, port, "/admin/scaling"), headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
        try:
            report = parse_report(json.loads(payload))
        except json.JSONDecodeError as error:
            raise BadPodReport(f"not JSON: {error}") from None
        return {**report, ADDRESS: address}

    return _each(addresses, get)
