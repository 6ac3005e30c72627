"""``keyorder operator --peering NAME`` as users run it (a separate process, a kubeconfig, the chart's RBAC with
``peering.enabled=true``) against an emulator serving kopf's peering CRDs.

Without the peering object kopf keeps every replica paused and says so only at DEBUG (``keyorder_operator.peering``
explains why): the operator must refuse to start, naming the object, and touch nothing. With it, the operator
works; when it is deleted meanwhile, the operator says so at ERROR and in a metric, and stays alive."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from keyorder.devtools.embedded import free_port
from keyorder_operator.peering import Presence, Reading, peering_objects, probe_api_client, read_peering_object
from tests.operator.authorization import chart_authorizer
from tests.operator.conftest import fail_on_refusals
from tests.operator.emulator import Emulator, register_peering_crds
from tests.operator.harness import (
    CR,
    RunningEmulator,
    api_client,
    serve_emulator,
    stop_process,
    wait_for,
    write_kubeconfig,
)
from tests.operator.test_operator_e2e import consumer_resource

pytestmark = pytest.mark.timeout(150)

PEERINGS = "kopf.dev/v1/clusterkopfpeerings"
NAME = "keyorder-operator"


@pytest.fixture
def kube_with_peering() -> Iterator[RunningEmulator]:
    """The emulator with kopf's peering CRDs (from the chart's ``crds/``) and the chart's RBAC for the
    high-availability install; any request of the operator that RBAC refused fails the test."""

    def setup(emulator: Emulator) -> None:
        register_peering_crds(emulator)
        emulator.authorizer = chart_authorizer(peering=True)

    with serve_emulator(setup) as running:
        yield running
        refused = running.refused()
    fail_on_refusals(refused)


@contextmanager
def operator_process(kube: RunningEmulator, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, int]]:
    """``keyorder operator --peering keyorder-operator`` with its metrics and liveness ports; stopped on exit."""
    kubeconfig = write_kubeconfig(kube.url, tmp_path / "kubeconfig")
    metrics_port, liveness_port = free_port(), free_port()
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUBERNETES_SERVICE_HOST": "", "POD_ID": "operator-a"}
    command = [sys.executable, "-m", "keyorder.cli", "operator", "--peering", NAME, "--tick", "0.5"]
    command += ["--metrics-port", str(metrics_port), "--liveness", f"http://127.0.0.1:{liveness_port}/healthz"]
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        yield process, metrics_port, liveness_port
    finally:
        if process.poll() is None:
            stop_process(process)


def test_without_the_peering_object_the_operator_refuses_to_start_naming_it_and_touches_nothing(
    kube_with_peering: RunningEmulator, tmp_path: Path
) -> None:
    kube = kube_with_peering
    kube.create(CR, consumer_resource("ledger", "127.0.0.1:1", "payments"))
    with operator_process(kube, tmp_path) as (operator, _, _):
        try:
            output, _ = operator.communicate(timeout=60)  # hang guard: it waits 10 s for the object, then stops
        except subprocess.TimeoutExpired:
            output, _ = stop_process(operator)
            pytest.fail(f"the operator kept running without its peering object:\n{output[-3000:]}")
    assert operator.returncode == 2, output[-3000:]
    refusal = output.strip().splitlines()[-1]
    assert refusal.startswith("keyorder operator: --peering: the peering object"), output[-3000:]
    assert 'ClusterKopfPeering "keyorder-operator" (clusterkopfpeerings.kopf.dev) does not exist' in refusal
    assert "peering.create=true" in refusal and "Traceback" not in output
    assert kube.get("apps/v1/deployments", "ledger") is None
    assert not kube.get(CR, "ledger")["metadata"].get("finalizers")  # kopf never took the resource on


def peering_gauge(metrics_port: int) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "keyorder_operator_peering_object_present" and sample.labels == {
                "kind": "ClusterKopfPeering",
                "namespace": "",
                "name": NAME,
            }:
                return sample.value
    return None


def health(liveness_port: int) -> tuple[int, dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{liveness_port}/healthz", timeout=5) as response:
        return response.status, json.loads(response.read())


def test_with_the_peering_object_the_operator_works_and_says_loudly_when_it_is_deleted(
    kube_with_peering: RunningEmulator, tmp_path: Path
) -> None:
    kube = kube_with_peering
    kube.create(PEERINGS, {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": NAME}}, None)
    kube.create(CR, consumer_resource("ledger", "127.0.0.1:1", "payments"))
    failure: AssertionError | None = None
    with operator_process(kube, tmp_path) as (operator, metrics_port, liveness_port):
        try:

            def running(value):
                if operator.poll() is not None:
                    raise AssertionError(f"the operator exited with {operator.returncode}")
                return value

            wait_for(lambda: running(kube.get("apps/v1/deployments", "ledger")), 60, "the operator's Deployment")
            keepalive = wait_for(
                lambda: (kube.get(PEERINGS, NAME, None).get("status") or {}).get("operator-a"), 30, "a keep-alive"
            )
            assert keepalive["lifetime"] == 60
            assert health(liveness_port) == (200, {"peering": {f"ClusterKopfPeering/{NAME}": "present"}})
            assert peering_gauge(metrics_port) == 1

            kube.delete(PEERINGS, NAME, None)
            # kopf runs the probes again once its last results are 10 s old: ask until one does
            wait_for(
                lambda: running(health(liveness_port))[1]["peering"][f"ClusterKopfPeering/{NAME}"] == "absent",
                30,
                "a health probe that sees the object gone",
            )
            status, _ = health(liveness_port)
            assert status == 200  # liveness must not restart a working replica into one that refuses to start
            assert peering_gauge(metrics_port) == 0
        except AssertionError as error:
            failure = error
        finally:
            output, _ = stop_process(operator)
    if failure is not None:
        raise AssertionError(f"{failure}\n--- the operator's output, last 4000 characters ---\n{output[-4000:]}")
    errors = [line for line in output.splitlines() if "ERROR" in line and "peering" in line]
    assert len(errors) == 1, output[-4000:]  # said once, not on every probe
    assert 'ClusterKopfPeering "keyorder-operator" (clusterkopfpeerings.kopf.dev) does not exist' in errors[0]
    assert "none will take over" in errors[0]


def test_a_read_tells_present_absent_unserved_forbidden_and_unreachable_apart_through_the_real_client() -> None:
    """``read_peering_object`` with the kubernetes client's own exceptions: the chart's RBAC without peering (no
    ``get`` on the peering resources: refused before anything is looked up, as the API server's authorization
    filter runs before its handlers), its CRDs not installed, the object there or not, no API server at all."""
    obj = peering_objects(NAME, [])[0]
    with serve_emulator() as bare, api_client(bare.url) as client:
        forbidden = read_peering_object(client, obj)
        assert forbidden.presence is Presence.FORBIDDEN and "cannot get resource" in forbidden.detail, forbidden

    def peering_rbac(emulator: Emulator) -> None:
        emulator.authorizer = chart_authorizer(peering=True)

    def peering_rbac_and_crds(emulator: Emulator) -> None:
        peering_rbac(emulator)
        register_peering_crds(emulator)

    with serve_emulator(peering_rbac) as no_crds, api_client(no_crds.url) as client:
        assert read_peering_object(client, obj).presence is Presence.UNSERVED

    with serve_emulator(peering_rbac_and_crds) as kube, api_client(kube.url) as client:
        assert read_peering_object(client, obj).presence is Presence.ABSENT
        peering = {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": NAME}}
        kube.create(PEERINGS, peering, None)
        assert read_peering_object(client, obj) == Reading(Presence.PRESENT)

    with api_client(f"http://127.0.0.1:{free_port()}") as client:
        unreachable = read_peering_object(client, obj, timeout=2)
        assert unreachable.presence is Presence.UNREADABLE and "MaxRetryError" in unreachable.detail, unreachable


@contextmanager
def hung_api_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """An API server that accepts connections and never answers: its URL, and the connections it accepted."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}", accepted
    finally:
        stop.set()
        thread.join(5)  # hang guard
        for connection in accepted:
            connection.close()
        listener.close()


def test_a_probe_read_of_a_hung_api_server_ends_within_its_timeout() -> None:
    """urllib3 retries a GET that timed out three times, each with the whole timeout again: the probe's reads go
    through ``probe_api_client`` (no retries), so one read sends one request and ends within its timeout, and
    the check's deadline holds against a real client."""
    obj = peering_objects(NAME, [])[0]
    with hung_api_server() as (url, accepted), api_client(url) as client:
        probe = probe_api_client(client)
        try:
            started = time.monotonic()
            reading = read_peering_object(probe, obj, timeout=0.5)
            elapsed = time.monotonic() - started
        finally:
            probe.close()
        assert reading.presence is Presence.UNREADABLE, reading
        # hang guard: generous; the behaviour is the single request below (urllib3's retries sent four)
        assert elapsed < 10, f"a 0.5 s read took {elapsed:.1f} s"
        assert len(accepted) == 1, f"{len(accepted)} requests for one read"
