"""Pushing the key-worker count to running pods through their token-protected admin endpoint.

The pods resize live (no restart, no rebalance); the push is idempotent, so the operator sends
it on every observation, which also brings newly started pods (which begin at the initial count)
to the current size within one poll interval.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from collections.abc import Sequence

log = logging.getLogger(__name__)


def push_workers(
    addresses: Sequence[str], port: int, token: str, workers: int, timeout: float = 2.0
) -> tuple[int, list[str]]:
    """PUT ``{"workers": n}`` to every pod; returns (pods updated, failures as 'ip: reason')."""
    body = json.dumps({"workers": workers}).encode()
    updated, failures = 0, []
    for address in addresses:
        host = f"[{address}]" if ":" in address else address
        request = urllib.request.Request(
            f"http://{host}:{port}/admin/workers",
            data=body,
            method="PUT",
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                response.read()
            updated += 1
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "code", None) or getattr(error, "reason", None) or error
            failures.append(f"{address}: {reason}")
    if failures:
        log.warning("could not push %d workers to %d pods: %s", workers, len(failures), "; ".join(failures))
    return updated, failures
