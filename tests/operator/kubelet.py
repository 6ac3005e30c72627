"""A FAKE kubelet and Deployment controller for the emulator: a Deployment's pods as local processes.

The API emulator stores Deployments but runs nothing. This stand-in (a fake, named as one) does
what the Deployment controller and the kubelet would: it keeps ``spec.replicas`` real
``keyorder run`` processes running with the Deployment's own ``KEYORDER_*`` environment, gives
each its own loopback address (127.0.W.N, W one per pytest-xdist worker, so every pod listens on
the CR's ``httpPort`` as in a cluster and parallel test workers never share an address), creates
the Pod objects with ``podIP`` and the ``Ready`` condition from the process's ``/readyz``, and
reports the Deployment's ``status`` (replicas, ready, updated). What it does not imitate: images,
volumes (the admin token Secret is written to a file), probes' timing, restarts.

The kubelet's steps are also functions (``write_admin_token``, ``create_pod``, ``report_pod_status``)
for a test that runs a pod in-process and plays the kubelet for it by hand.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyorder.devtools.embedded import FAST_GROUP_JOIN
from tests.operator.harness import ApiError, KubeHTTP

LOOPBACK_NET = 1 + int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
"""The third byte of this test process's pod addresses (127.0.0.0/8 is all loopback on Linux)."""


@dataclass
class LocalProcessPod:
    name: str
    address: str
    process: subprocess.Popen
    log_path: Path
    ready: bool = False


class LocalKubelet:
    """Runs the pods of Deployment ``name`` until ``stop()``; ``peak`` is the most pods it ran at once.

    Used as a context manager, its exit fails the test (AssertionError) when its loop met errors (an API
    call that failed, a pod it could not start): such a kubelet did not do its part, so whatever the test
    saw of the operator is suspect. A test that provokes such errors says so with ``expect_errors=True``
    and reads ``errors`` itself.
    """

    def __init__(
        self,
        kube: KubeHTTP,
        name: str,
        workdir: Path,
        extra_env: dict[str, str] | None = None,
        period: float = 0.2,
        expect_errors: bool = False,
    ) -> None:
        self.kube, self.name, self.workdir = kube, name, workdir
        self.extra_env = dict(extra_env or {})
        self.period = period
        self.expect_errors = expect_errors
        self.pods: list[LocalProcessPod] = []
        self.peak = 0
        self.started = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"local-kubelet-{name}", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> LocalKubelet:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, failure: BaseException | None, traceback: object) -> None:
        self.stop()
        if not self.errors or self.expect_errors:
            return
        report = f"the fake kubelet of {self.name} met {len(self.errors)} errors: {self.errors[:5]}"
        if failure is not None:  # the test failed already: keep its error, add what the kubelet saw
            failure.add_note(report)
            return
        raise AssertionError(report)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)  # hang guard
        for pod in self.pods:
            with contextlib.suppress(ProcessLookupError):
                pod.process.send_signal(signal.SIGTERM)
        for pod in self.pods:
            try:
                pod.process.wait(30)  # hang guard
            except subprocess.TimeoutExpired:
                pod.process.kill()
                pod.process.wait(10)  # hang guard
        self.pods.clear()

    def crashed(self) -> list[str]:
        return [f"{pod.name}: exit {pod.process.returncode}" for pod in self.pods if pod.process.poll() is not None]

    # -- the loop ---------------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self._sync()
            except Exception as error:  # kept going; the exit fails the test with it (see the class)
                self.errors.append(f"{type(error).__name__}: {error}")

    def _sync(self) -> None:
        deployment = self.kube.get("apps/v1/deployments", self.name)
        if deployment is None:
            return
        desired = deployment["spec"].get("replicas") or 0
        while len(self.pods) < desired:
            self.pods.append(self._start(deployment))
        while len(self.pods) > desired:
            self._stop_pod(self.pods.pop())
        self.peak = max(self.peak, len(self.pods))
        for pod in self.pods:
            ready = pod.process.poll() is None and _ready(pod.address, _port(deployment))
            if ready != pod.ready:
                pod.ready = ready
                report_pod_status(self.kube, pod.name, pod.address, ready)
        ready = sum(pod.ready for pod in self.pods)
        status = {"replicas": len(self.pods), "readyReplicas": ready, "updatedReplicas": len(self.pods)}
        if deployment.get("status") != {**(deployment.get("status") or {}), **status}:
            self.kube.patch("apps/v1/deployments", self.name, {"status": status}, subresource="status")

    def _start(self, deployment: dict[str, Any]) -> LocalProcessPod:
        self.started += 1
        name = f"{self.name}-{self.started}"
        address = f"127.0.{LOOPBACK_NET}.{10 + self.started}"
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        env = {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
        token_file = write_admin_token(self.kube, self.name, self.workdir / f"{name}.token")
        env.update(
            {
                "KEYORDER_HTTP_HOST": address,
                "KEYORDER_ADMIN_TOKEN_FILE": str(token_file),
                "KEYORDER_KAFKA_PROPERTY": ",".join(FAST_GROUP_JOIN),
                "KEYORDER_LOG_LEVEL": "WARNING",
                **self.extra_env,
            }
        )
        log_path = self.workdir / f"{name}.log"
        with log_path.open("w") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "keyorder.cli", "run"],
                env={**os.environ, **env},
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        create_pod(
            self.kube, name, deployment["spec"]["selector"]["matchLabels"], container["name"], container["image"]
        )
        return LocalProcessPod(name, address, process, log_path)

    def _stop_pod(self, pod: LocalProcessPod) -> None:
        with contextlib.suppress(ApiError):
            self.kube.delete("v1/pods", pod.name)
        if pod.process.poll() is None:
            pod.process.send_signal(signal.SIGTERM)
            try:
                pod.process.wait(30)  # hang guard
            except subprocess.TimeoutExpired:
                pod.process.kill()
                pod.process.wait(10)  # hang guard


# -- the kubelet's steps ----------------------------------------------------------------------------------
def admin_token(kube: KubeHTTP, instance: str) -> str:
    """The token in the operator's ``<instance>-admin-token`` Secret (empty while there is none)."""
    secret = kube.get("v1/secrets", f"{instance}-admin-token") or {}
    if secret.get("stringData", {}).get("token"):
        return secret["stringData"]["token"]
    return base64.b64decode(secret.get("data", {}).get("token", "")).decode()


def write_admin_token(kube: KubeHTTP, instance: str, path: Path) -> Path:
    """The admin token Secret as the pod's volume would hold it: a file only its owner reads."""
    path.write_text(admin_token(kube, instance))
    path.chmod(0o600)
    return path


def consumer_labels(instance: str) -> dict[str, str]:
    """The labels of the pods of OrderedConsumer ``instance`` (its Deployment's selector)."""
    return {"app.kubernetes.io/name": "keyorder-consumer", "app.kubernetes.io/instance": instance}


def create_pod(kube: KubeHTTP, name: str, labels: dict[str, str], container: str, image: str) -> None:
    """The Pod object of a pod (the selector's labels are what the operator finds it by)."""
    kube.create(
        "v1/pods",
        {
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": container, "image": image}]},
        },
    )


def report_pod_status(kube: KubeHTTP, name: str, address: str, ready: bool) -> None:
    """What the kubelet reports of a running pod: its IP and whether it is ready."""
    condition = {"type": "Ready", "status": "True" if ready else "False"}
    status = {"podIP": address, "phase": "Running", "conditions": [condition]}
    kube.patch("v1/pods", name, {"status": status}, subresource="status")


def _port(deployment: dict[str, Any]) -> int:
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {item["name"]: item.get("value") for item in container.get("env", [])}
    return int(env.get("KEYORDER_HTTP_PORT") or 8080)


def _ready(address: str, port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/readyz", timeout=1) as response:
            return json.loads(response.read()).get("status") == "ready"
    except OSError:
        return False
