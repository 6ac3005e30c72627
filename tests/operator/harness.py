"""Run the real kopf operator against kmock's emulator, each on its own thread and event loop.

Typical use (the ``kube`` fixture in conftest.py does the first step)::

    with serve_emulator() as kube, run_kopf(kube.url, register):
        kube.create("keyorder.dev/v1alpha1/orderedconsumers", {"metadata": {"name": "a"}, "spec": {}})
        wait_for(lambda: kube.get("v1/configmaps", "a"), 10, "the ConfigMap")

Both sides are plain threads, so the test thread can use urllib or the synchronous ``kubernetes``
client freely (never call a synchronous client on the emulator's loop: it deadlocks).

Who is who: the operator under test (``run_kopf``, ``api_client``, ``write_kubeconfig``) presents
``OPERATOR_TOKEN``, the chart's operator ServiceAccount, and the emulator authorises its requests against
the RBAC rules the Helm chart renders (``authorization``): a verb the chart does not grant is a 403, as in
a cluster. The test's own requests (``KubeHTTP``, ``kube.create/get/...``) carry no token: an admin's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import importlib
import json
import logging
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import kmock
import kopf
import kubernetes

from tests.operator.authorization import OPERATOR_TOKEN, chart_authorizer, operator_identity
from tests.operator.emulator import Emulator, load_builtin_resources, register_crd
from tests.support import wait_for as wait_for  # the operator tests import it from here

T = TypeVar("T")
Register = Callable[[kopf.OperatorRegistry], None] | str

CR = "keyorder.dev/v1alpha1/orderedconsumers"
"""The OrderedConsumer resource, in the ``group/version/plural`` notation the helpers below take."""


def write_kubeconfig(url: str, path: Path, token: str = OPERATOR_TOKEN) -> Path:
    """A kubeconfig for the emulator at ``url`` with the operator's token (its ServiceAccount, under the chart's
    RBAC), for an operator run as users run it: a separate process that logs in the way kopf's
    ``login_via_client`` does."""
    path.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: emulator, cluster: {{server: "{url.rstrip("/")}"}}}}]
users: [{{name: tester, user: {{token: {token}}}}}]
contexts: [{{name: emulator, context: {{cluster: emulator, user: tester, namespace: default}}}}]
current-context: emulator
""")
    return path


def stop_process(process: subprocess.Popen[str]) -> tuple[str, str]:
    """SIGTERM, then SIGKILL after 30 s; the process's ``(stdout, stderr)`` (empty where not piped)."""
    process.send_signal(signal.SIGTERM)
    try:
        output, errors = process.communicate(timeout=30)  # hang guard
    except subprocess.TimeoutExpired:
        process.kill()
        output, errors = process.communicate(timeout=10)  # hang guard
    return output or "", errors or ""


class ApiError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body = status, body


_POLL_CLOCKS: list[Callable[[str, str], float | None]] = []
"""The in-process operators' own record of when each resource's last poll started (their metric
``keyorder_operator_last_poll_timestamp_seconds``): status is not written on a poll that changes nothing,
so it cannot tell that a poll happened."""


@contextlib.contextmanager
def polls_of(context: Any) -> Iterator[None]:
    """Let ``last_poll_at`` and ``wait_for_polls`` see the polls of an in-process operator's ``context``."""

    def last(namespace: str, name: str) -> float | None:
        labels = {"namespace": namespace, "name": name}
        return context.metrics.registry.get_sample_value("keyorder_operator_last_poll_timestamp_seconds", labels)

    _POLL_CLOCKS.append(last)
    try:
        yield
    finally:
        _POLL_CLOCKS.remove(last)


def last_poll_at(kube: KubeHTTP, name: str, namespace: str = "default") -> float | None:
    """When the in-process operator last started a poll of OrderedConsumer ``name`` (None: never, or forgotten
    after a delete). ``kube`` is unused: the answer is the operator's, not the API server's."""
    if not _POLL_CLOCKS:
        raise RuntimeError("no in-process operator registered with polls_of(context): its polls cannot be seen")
    times = [at for clock in _POLL_CLOCKS if (at := clock(namespace, name)) is not None]
    return max(times) if times else None


def first_polls(kube: KubeHTTP, names: list[str], timeout: float, what: str) -> dict[str, float]:
    """Wait until the in-process operator has polled each OrderedConsumer of ``names``, and return when each
    was first polled (``last_poll_at`` watched closely, so the first one seen is the first one made)."""
    polled: dict[str, float] = {}

    def all_polled() -> bool:
        for name in names:
            if name not in polled and (at := last_poll_at(kube, name)) is not None:
                polled[name] = at
        return len(polled) == len(names)

    wait_for(all_polled, timeout, what, interval=0.05)
    return polled


def wait_for_polls(
    kube: KubeHTTP, name: str, count: int, namespace: str = "default", timeout_per_poll: float = 20.0
) -> float:
    """Wait until the operator has finished ``count`` more polls of OrderedConsumer ``name``, their status
    written, and return when the last poll seen started.

    The proof a "nothing happened" check needs: the thing that could have acted did act. A poll start is
    seen when it begins (``last_poll_at``), and kopf writes a poll's status before the next one starts,
    so ``count`` + 1 starts are waited for; the first may come from a poll already running at the call,
    so ``count`` >= 2 guarantees a whole poll that started after it. ``timeout_per_poll`` is a hang guard
    (a poll that never comes), not a time bound.
    """
    last = last_poll_at(kube, name, namespace)
    for seen in range(1, count + 2):
        before = last
        last = wait_for(
            lambda before=before: (at := last_poll_at(kube, name, namespace)) is not None and at != before and at,
            timeout_per_poll,
            f"poll {seen} of {count + 1} starts of {namespace}/{name} (the last started at {before})",
        )
    assert last is not None
    return last


class TimerRuns(logging.Handler):
    """Counts the finished runs of one kopf timer per resource, from kopf's own per-object log line
    (``Timer 'register.<locals>.autoscale' succeeded.``): proof that the operator ticked on a resource
    whose poll writes nothing (an invalid spec is not polled, so its ``status.lastPollAt`` never moves).

    Use it as a context manager around ``run_kopf``: it listens on kopf's ``kopf.objects`` logger, at
    INFO for the while (the level kopf logs a timer's success at)."""

    def __init__(self, handler_id: str = "autoscale") -> None:
        super().__init__(logging.INFO)
        # kopf names a handler by its function's qualified name: 'register.<locals>.autoscale'
        self.message = re.compile(rf"Timer '(?:[\w<>]+\.)*{re.escape(handler_id)}' succeeded\.")
        self._runs: Counter[tuple[str, str]] = Counter()
        self._counting = threading.Lock()
        self._logger = logging.getLogger("kopf.objects")
        self._level = self._logger.level

    def emit(self, record: logging.LogRecord) -> None:
        reference = getattr(record, "k8s_ref", None)
        if reference and self.message.fullmatch(record.getMessage()):
            with self._counting:
                self._runs[(str(reference.get("namespace")), str(reference.get("name")))] += 1

    def runs(self, name: str, namespace: str = "default") -> int:
        with self._counting:
            return self._runs[(namespace, name)]

    def wait_for_runs(self, name: str, count: int, namespace: str = "default", timeout_per_run: float = 20.0) -> int:
        """Wait until the timer has run ``count`` more times on ``namespace/name`` (the first may have started
        before the call: ``count`` >= 2 guarantees one that started after it); the total. ``timeout_per_run``
        is a hang guard."""
        wanted = self.runs(name, namespace) + count
        return wait_for(
            lambda: (total := self.runs(name, namespace)) >= wanted and total,
            timeout_per_run * count,
            f"{count} more successful runs of the kopf timer ({self.message.pattern}) on {namespace}/{name}",
        )

    def __enter__(self) -> TimerRuns:
        self._level = self._logger.level
        if not self._logger.isEnabledFor(logging.INFO):
            self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._logger.removeHandler(self)
        self._logger.setLevel(self._level)


def resource_path(
    resource: str, namespace: str | None = None, name: str | None = None, subresource: str | None = None
) -> str:
    """``'v1/configmaps'`` or ``'group/version/plural'`` -> the API path (namespaced if ``namespace``)."""
    parts = resource.strip("/").split("/")
    if len(parts) == 2:
        prefix, plural = f"/api/{parts[0]}", parts[1]
    elif len(parts) == 3:
        prefix, plural = f"/apis/{parts[0]}/{parts[1]}", parts[2]
    else:
        raise ValueError(f"expected 'version/plural' or 'group/version/plural', got {resource!r}")
    path = prefix + (f"/namespaces/{namespace}" if namespace else "") + f"/{plural}"
    return path + (f"/{name}" if name else "") + (f"/{subresource}" if subresource else "")


class KubeHTTP:
    """A tiny synchronous JSON client (urllib) for the emulator; usable from any thread but the emulator's.

    Without a ``token`` it is the test's own admin client; with one, it acts as that token's identity."""

    def __init__(self, url: str, timeout: float = 10.0, token: str | None = None) -> None:
        self.url, self.timeout, self.token = url.rstrip("/"), timeout, token

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            with error:
                raw = error.read()
            try:
                payload: Any = json.loads(raw)
            except ValueError:
                payload = raw.decode(errors="replace")
            raise ApiError(error.code, payload) from None
        return json.loads(raw) if raw else None

    def create(self, resource: str, body: dict[str, Any], namespace: str | None = "default") -> dict[str, Any]:
        return self.call("POST", resource_path(resource, namespace), body)

    def get(self, resource: str, name: str, namespace: str | None = "default") -> dict[str, Any] | None:
        """The object, or None if it does not exist."""
        try:
            return self.call("GET", resource_path(resource, namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    def list(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        return self.call("GET", resource_path(resource, namespace))["items"]

    def patch(
        self,
        resource: str,
        name: str,
        patch: dict[str, Any] | list[dict[str, Any]],
        namespace: str | None = "default",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """A merge-patch (dict) or a JSON-patch (list of ops)."""
        kind = "application/json-patch+json" if isinstance(patch, list) else "application/merge-patch+json"
        return self.call("PATCH", resource_path(resource, namespace, name, subresource), patch, kind)

    def delete(self, resource: str, name: str, namespace: str | None = "default") -> dict[str, Any]:
        return self.call("DELETE", resource_path(resource, namespace, name))


@contextlib.contextmanager
def api_client(url: str, token: str | None = OPERATOR_TOKEN) -> Iterator[kubernetes.client.ApiClient]:
    """A synchronous ``kubernetes`` ApiClient for the emulator, closed (with its sockets) on exit. By default it
    is the operator's (its ServiceAccount's token, under the chart's RBAC); ``token=None``: an admin's."""
    configuration = kubernetes.client.Configuration(host=url.rstrip("/"))
    if token:
        configuration.api_key = {"BearerToken": token}
        configuration.api_key_prefix = {"BearerToken": "Bearer"}
    client = kubernetes.client.ApiClient(configuration)
    try:
        yield client
    finally:
        client.close()
        client.rest_client.pool_manager.clear()


class RunningEmulator(KubeHTTP):
    """The emulator served over HTTP on 127.0.0.1:<free port> from a thread with its own event loop.

    With ``rbac`` (the default), ``OPERATOR_TOKEN`` is the chart's operator ServiceAccount and its requests
    are authorised by the chart's RBAC rules (rendered once per test process); ``refused()`` lists what was
    refused."""

    def __init__(
        self,
        setup: Callable[[Emulator], None] | None = None,
        start_timeout: float = 10.0,
        stop_timeout: float = 10.0,
        rbac: bool = True,
    ) -> None:
        super().__init__("http://unstarted")
        self.setup, self.start_timeout, self.stop_timeout, self.rbac = setup, start_timeout, stop_timeout, rbac
        self.emulator: Emulator | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="kmock-emulator", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as error:  # reported to the starting thread
            self._error = error
        finally:
            self._started.set()

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        emulator = Emulator()
        load_builtin_resources(emulator)
        register_crd(emulator)
        if self.rbac:
            emulator.tokens[OPERATOR_TOKEN] = operator_identity()
            emulator.authorizer = chart_authorizer()
        if self.setup is not None:
            self.setup(emulator)
        async with emulator, kmock.Server(emulator) as server:
            self.emulator, self.url = emulator, str(server.url).rstrip("/")
            self._started.set()
            await self._stop.wait()
            await emulator.close_watches()

    def call_in_loop(self, fn: Callable[[], T], timeout: float = 10.0) -> T:
        """Run ``fn`` on the emulator's loop (e.g. to read ``emulator.objects`` consistently)."""
        assert self._loop is not None

        async def run() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(timeout)

    def expire_watches(self, timeout: float = 10.0) -> None:
        """``Emulator.expire_watches`` from the test thread: open watches end, and re-watching from an older
        version is answered 410 Gone (the client lists again)."""
        assert self._loop is not None and self.emulator is not None
        asyncio.run_coroutine_threadsafe(self.emulator.expire_watches(), self._loop).result(timeout)

    @contextlib.contextmanager
    def watches_interrupted(self, timeout: float = 10.0) -> Iterator[None]:
        """``Emulator.watches_interrupted`` from the test thread: inside, no watch connects and what changes
        reaches no client; on leaving, the clients' watches are answered 410 Gone and they list again."""
        assert self._loop is not None and self.emulator is not None
        interrupted = self.emulator.watches_interrupted()
        asyncio.run_coroutine_threadsafe(interrupted.__aenter__(), self._loop).result(timeout)
        try:
            yield
        finally:
            asyncio.run_coroutine_threadsafe(interrupted.__aexit__(None, None, None), self._loop).result(timeout)

    def refused(self) -> list[dict[str, Any]]:
        """The requests RBAC refused so far (method, path, verb, resource, namespace, name, user, message)."""
        assert self.emulator is not None
        emulator = self.emulator
        return self.call_in_loop(lambda: list(emulator.refused))

    def __enter__(self) -> RunningEmulator:
        self._thread.start()
        if not self._started.wait(self.start_timeout):  # hang guard
            raise RuntimeError(f"the emulator did not start within {self.start_timeout}s")
        if self._error is not None:
            raise RuntimeError("the emulator failed to start") from self._error
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(self.stop_timeout)  # hang guard
        if self._thread.is_alive():
            raise RuntimeError(f"the emulator did not stop within {self.stop_timeout}s")
        if self._error is not None:
            raise RuntimeError("the emulator failed") from self._error


def serve_emulator(setup: Callable[[Emulator], None] | None = None, rbac: bool = True) -> RunningEmulator:
    """Context manager: the emulator (built-in resources + the OrderedConsumer CRD, the chart's RBAC for
    ``OPERATOR_TOKEN``) on a free port.

    Its HTTP server's access log (aiohttp's, a line per request) is off: no test reads it, and a line
    logged from the server thread after a test's captured stream was closed printed a "Logging error"
    traceback into the run's output."""
    logging.getLogger("aiohttp.access").disabled = True
    return RunningEmulator(setup, rbac=rbac)


def fast_settings(settings: kopf.OperatorSettings) -> None:
    """Settings that keep start-up, retries and shutdown short against a local emulator."""
    settings.process.ultimate_exiting_timeout = None  # else kopf may SIGKILL "its thread" = the whole pytest
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 5
    settings.networking.error_backoffs = [0.1, 0.2, 0.5, 1.0]
    settings.watching.connect_timeout = 5
    settings.watching.reconnect_backoff = 0.1
    settings.queueing.exit_timeout = 0.5
    settings.persistence.consistency_timeout = 1.0
    settings.posting.level = logging.INFO
    settings.execution.default_backoff = 0.5  # a failing handler is retried in 0.5 s, not 60 s
    settings.execution.executor.shutdown(wait=False)  # never used: replaced by a pool with recognisable threads
    settings.execution.executor = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="kopf-handler")


def _apply_registration(registry: kopf.OperatorRegistry, register: Register) -> None:
    """A callable gets the registry; ``'pkg.mod:fn'`` is imported and called with it; ``'pkg.mod'`` is
    (re)imported while ``registry`` is kopf's default registry, so its bare ``@kopf.on...`` decorators land there."""
    if callable(register):
        register(registry)
        return
    module_name, _, attribute = register.partition(":")
    if attribute:
        getattr(importlib.import_module(module_name), attribute)(registry)
        return
    previous = kopf.get_default_registry()
    kopf.set_default_registry(registry)
    try:
        if module_name in sys.modules:
            importlib.reload(sys.modules[module_name])
        else:
            importlib.import_module(module_name)
    finally:
        kopf.set_default_registry(previous)


class KopfRun:
    """The handle of a running operator (yielded by :func:`run_kopf`)."""

    def __init__(self, registry: kopf.OperatorRegistry, settings: kopf.OperatorSettings, memo: kopf.Memo) -> None:
        self.registry, self.settings, self.memo = registry, settings, memo
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stop_flag: asyncio.Event | None = None
        self.loop_ready = threading.Event()

    @property
    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()


@contextlib.contextmanager
def run_kopf(
    server_url: str,
    register_handlers: Register,
    *,
    settings: Callable[[kopf.OperatorSettings], None] | None = None,
    memo: kopf.Memo | None = None,
    start_timeout: float = 20.0,
    stop_timeout: float = 20.0,
    token: str | None = OPERATOR_TOKEN,
) -> Iterator[KopfRun]:
    """Run ``kopf.operator(clusterwide=True, standalone=True)`` against ``server_url`` in its own thread.

    A fresh registry gets a login handler for ``server_url`` (with ``token``: by default the operator's
    ServiceAccount, under the chart's RBAC; None: an admin) plus whatever ``register_handlers`` adds (see
    ``_apply_registration``). ``settings`` may tweak the (already fast) settings. Handlers get ``memo``;
    by default a ``kopf.Memo(server_url=...)``. On exit, the stop flag is raised and the thread joined;
    if the operator died with an error, it is re-raised here.
    """
    registry = kopf.OperatorRegistry()
    operator_settings = kopf.OperatorSettings()
    fast_settings(operator_settings)
    if settings is not None:
        settings(operator_settings)
    memo = memo if memo is not None else kopf.Memo(server_url=server_url)

    @kopf.on.login(registry=registry)
    def _login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=server_url.rstrip("/"), token=token)

    _apply_registration(registry, register_handlers)
    run = KopfRun(registry, operator_settings, memo)

    async def main() -> None:
        run.loop, run.stop_flag = asyncio.get_running_loop(), asyncio.Event()
        run.loop_ready.set()
        await kopf.operator(
            clusterwide=True,
            standalone=True,
            registry=registry,
            settings=operator_settings,
            memo=memo,
            stop_flag=run.stop_flag,
            ready_flag=run.ready,
        )

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as error:  # re-raised in the test thread
            run.error = error
        finally:
            run.loop_ready.set()

    run.thread = threading.Thread(target=target, name="kopf-operator", daemon=True)
    run.thread.start()
    try:
        deadline = time.monotonic() + start_timeout  # hang guard
        while not run.ready.wait(0.02):
            if not run.thread.is_alive():
                raise RuntimeError("kopf exited before it was ready") from run.error
            if time.monotonic() > deadline:
                raise RuntimeError(f"kopf was not ready within {start_timeout}s")
        try:
            yield run
        except BaseException as failure:  # e.g. a wait_for timeout: say if the operator had died meanwhile
            if run.error is not None:
                failure.add_note(f"the kopf operator had died meanwhile: {run.error!r}")
            raise
    finally:
        run.loop_ready.wait(stop_timeout)  # hang guard
        if run.loop is not None and run.stop_flag is not None and run.thread.is_alive():
            with contextlib.suppress(RuntimeError):  # the loop closed in the meantime
                run.loop.call_soon_threadsafe(run.stop_flag.set)
        run.thread.join(stop_timeout)  # hang guard
        if run.thread.is_alive():
            raise RuntimeError(f"kopf did not stop within {stop_timeout}s")
        # A timer still running at shutdown is orphaned by kopf with its aiohttp session unclosed; collect
        # those here, where they belong, instead of letting their ResourceWarnings fail a later test.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        # kopf never shuts down the thread pool of its sync handlers: do it here, bounded (a handler may hang).
        closer = threading.Thread(
            target=operator_settings.execution.executor.shutdown,
            kwargs={"wait": True, "cancel_futures": True},
            name="kopf-executor-shutdown",
        )
        closer.start()
        closer.join(stop_timeout)  # hang guard
        if closer.is_alive():
            raise RuntimeError(f"a sync kopf handler was still running {stop_timeout}s after the stop")
    if run.error is not None:
        raise RuntimeError("kopf failed") from run.error
