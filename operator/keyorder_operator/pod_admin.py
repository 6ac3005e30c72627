"""Talking to a group's pods through their token-protected admin endpoints, all pods at once.

Two calls per poll: ``GET /admin/scaling`` reads each pod's scaling report (what the policy needs
to know *why* the group drains as it does), ``PUT /admin/workers`` pushes the decided key-worker
count (the pods resize live: no restart, no rebalance). Both go to every ready pod concurrently
with a short timeout, so one slow or dead pod costs one timeout, not one per pod. The push is
idempotent: sent on every poll, it also brings newly started pods to the current size.

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
    """Every pod's scaling report, checked; returns (reports, failures as 'address: reason')."""

    def get(address: str) -> dict[str, Any]:
        request = urllib.request.Request(
            _url(address, port, "/admin/scaling"), headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
        try:
            return parse_report(json.loads(payload))
        except json.JSONDecodeError as error:
            raise BadPodReport(f"not JSON: {error}") from None

    return _each(addresses, get)
