"""The pod's one HTTP port: ``/metrics``, ``/healthz``, ``/readyz`` and the admin endpoints.

``/metrics``, ``/healthz``, ``/readyz`` and ``GET /admin/workers`` are open and read-only. Two
endpoints require ``Authorization: Bearer <token>``, with the token from a file only the operator
and the pod can read (a Secret): ``PUT /admin/workers`` (live resize of the key workers) changes
behaviour, and ``GET /admin/scaling`` (the operator's sizing report) names the busiest key.
Without a configured token they are disabled, never open. The token is read from its file on every
admin request (``admin_token``), so a rotated Secret takes effect at once: the old token stops
working the moment the kubelet swaps the mounted file, without waiting for a request with the new
one. The token travels in plain HTTP: what keeps it from other pods is the NetworkPolicy that admits
only the operator to this port (docs/security.md, "The pod's HTTP server").

The port is reachable by anything the network lets in, so it is served by ``bounded_http``: slow or
numerous clients cannot hold its threads, and the probes (``/healthz``, ``/readyz``) are answered
first, even while the connection cap is reached. The operator's admin calls (an ``/admin/`` path
with the current token: ``is_operator``) have their own handler thread and queue places, so clients
filling the queue with ``/metrics`` requests, or not reading their replies, cannot refuse them.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

from keyorder.adapters.bounded_http import (
    BoundedHttpServer,
    BufferedRequestHandler,
    ServerLimits,
    header_value,
    request_target,
)
from keyorder.adapters.scaling_report import scaling_report
from keyorder.config import ConfigError
from keyorder.engine.poll_loop import ConsumerRuntime

log = logging.getLogger(__name__)

STALL_SECONDS = 60.0
"""``/healthz`` fails when the poll loop has not turned for this long (a wedged pod gets restarted)."""
MAX_BODY_BYTES = 4096


PROBE_PATHS = ("/healthz", "/readyz")
"""Answered first, on the server's I/O thread: the kubelet must see a live pod under any load."""


class PodHttpServer:
    """Serves the pod endpoints on a daemon thread."""

    def __init__(
        self,
        runtime: ConsumerRuntime,
        registry: CollectorRegistry,
        host: str,
        port: int,
        admin_token: Callable[[], str | None] | None,
        limits: ServerLimits | None = None,
    ) -> None:
        self.runtime = runtime
        self.registry = registry
        self.admin_token = admin_token
        """Reads the token file (``config.read_admin_token``) on every admin request: the kubelet swaps
        a rotated Secret's file in place, and from then on only the new token may pass. ``None``:
        no token configured, the admin endpoints are disabled."""
        server = self

        class Handler(BufferedRequestHandler):
            def do_GET(self) -> None:
                server._get(self)

            def do_PUT(self) -> None:
                server._put(self)

            def log_message(self, format: str, *args: Any) -> None:
                log.debug("http %s - " + format, self.address_string(), *args)

        try:
            self._httpd = BoundedHttpServer(
                (host, port),
                Handler,
                probe_paths=PROBE_PATHS,
                priority=self.is_operator,
                limits=limits or ServerLimits(),
            )
        except OSError as error:
            raise ConfigError(f"--http-host/--http-port {host}:{port}: cannot listen: {error.strerror}") from None
        self.port = self._httpd.server_address[1]
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="keyorder-http", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        if self._thread.is_alive():
            self._thread.join(5)
        self._httpd.server_close()

    def is_operator(self, request: bytes) -> bool:
        """True for an admin request with the current token: served on its own thread and queue places
        (called on the server's I/O thread with the whole request; reads the token file, as ``_authorized``)."""
        if self.admin_token is None or not request_target(request)[1].startswith("/admin/"):
            return False
        try:
            current = self.admin_token()
        except ConfigError:
            return False  # the handler answers 503 and logs it
        supplied = (header_value(request, "Authorization") or "").encode("latin-1")
        return bool(current) and hmac.compare_digest(supplied, f"Bearer {current}".encode())

    # -- handlers -----------------------------------------------------------------------------
    def _get(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        runtime = self.runtime
        if path == "/metrics":
            _reply(request, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            stalled = runtime.pool.health.crashed is not None or (
                runtime.started.is_set()
                and not runtime.stopping
                and runtime.clock() - runtime.last_iteration > STALL_SECONDS
            )
            _reply_json(request, 503 if stalled else 200, {"status": "stalled" if stalled else "ok"})
        elif path == "/readyz":
            status, body = readiness(runtime)
            _reply_json(request, status, body)
        elif path == "/admin/workers":
            _reply_json(request, 200, {"workers": runtime.workers})
        elif path == "/admin/scaling":
            if self._authorized(request):
                _reply_json(request, 200, scaling_report(runtime, runtime.pool))
        else:
            _reply_json(request, 404, {"error": f"no such endpoint: {path}"})

    def _put(self, request: BaseHTTPRequestHandler) -> None:
        path = request.path.split("?", 1)[0]
        if path != "/admin/workers":
            _reply_json(request, 404, {"error": f"no such endpoint: {path}"})
            return
        if not self._authorized(request):
            return
        try:
            length = int(request.headers.get("Content-Length", "0"))
            if not 0 < length <= MAX_BODY_BYTES:
                raise ValueError(f"body must be 1..{MAX_BODY_BYTES} bytes of JSON")
            body = json.loads(request.rfile.read(length))
            workers = body["workers"] if isinstance(body, dict) else None
            if not isinstance(workers, int) or isinstance(workers, bool):
                raise ValueError('body must be {"workers": <integer>}')
            previous = self.runtime.request_resize(workers)
        except (ValueError, KeyError) as error:
            _reply_json(
                request,
                400,
                {"error": str(error) if not isinstance(error, KeyError) else 'body must be {"workers": <integer>}'},
            )
            return
        log.info("admin: key workers %d -> %d requested", previous, workers)
        _reply_json(request, 200, {"workers": workers, "previous": previous})

    def _authorized(self, request: BaseHTTPRequestHandler) -> bool:
        """True for the current bearer token (read now); otherwise the 403/401/503 reply has been sent."""
        if self.admin_token is None:
            _reply_json(
                request,
                403,
                {
                    "error": "admin endpoint disabled: no admin token configured "
                    "(--admin-token-file / KEYORDER_ADMIN_TOKEN_FILE)"
                },
            )
            return False
        try:
            current = self.admin_token()
        except ConfigError as error:  # mid-update or removed: refuse every token until it reads again
            log.warning("admin token file: %s", error)
            _reply_json(request, 503, {"error": "admin token unavailable: the token file cannot be read; retry"})
            return False
        supplied = request.headers.get("Authorization", "").encode()
        if current and hmac.compare_digest(supplied, f"Bearer {current}".encode()):
            return True
        _reply_json(request, 401, {"error": "missing or wrong bearer token"})
        return False


def readiness(runtime: ConsumerRuntime) -> tuple[int, dict[str, Any]]:
    """``/readyz``: 503 before start, during shutdown and while no broker is reachable; else 200.

    No partition assigned is reported (``"partitions": 0`` and a ``reason``) but stays 200: a pod of a
    group with more pods than partitions is idle by design, and readiness gates what must keep
    working for such pods. A Deployment rollout waits for new pods to be Ready (an idle surplus pod
    that never became Ready would stall it forever), and the operator pushes worker counts only to
    Ready pods (a pod that gets partitions later must already have the right count). An unreachable
    broker is different: the pod can do nothing, and a rollout to a broken address must stop.
    """
    snapshot = runtime.snapshot
    if not runtime.started.is_set():
        return 503, {"status": "not ready", "reason": "not started"}
    if runtime.stopping:
        return 503, {"status": "not ready", "reason": "shutting down"}
    if not snapshot.broker_reachable:
        body: dict[str, Any] = {"status": "not ready", "reason": "no broker reachable"}
        if snapshot.broker_error:
            body["error"] = snapshot.broker_error
        return 503, body
    if snapshot.assigned_partitions == 0:
        return 200, {"status": "ready", "reason": "no partitions assigned", "partitions": 0}
    return 200, {"status": "ready", "partitions": snapshot.assigned_partitions}


def _reply(request: BaseHTTPRequestHandler, status: int, body: bytes, content_type: str) -> None:
    request.send_response(status)
    request.send_header("Content-Type", content_type)
    request.send_header("Content-Length", str(len(body)))
    request.end_headers()
    request.wfile.write(body)


def _reply_json(request: BaseHTTPRequestHandler, status: int, payload: dict[str, Any]) -> None:
    _reply(request, status, json.dumps(payload).encode() + b"\n", "application/json")
