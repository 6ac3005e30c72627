"""A FAKE kubelet and Deployment/ReplicaSet controllers for the emulator: a Deployment's pods as local processes.

The API emulator stores Deployments but runs nothing. This stand-in (a fake, named as one) does what
the Deployment and ReplicaSet controllers and the kubelet would, where the operator depends on it:

* **Pods from the template.** It keeps ``spec.replicas`` pods of the current pod template: Pod objects
  made from ``spec.template`` (its labels plus ``pod-template-hash``, its spec, bound to a node), shaped as
  a cluster returns them (``cluster_objects``: the API server's defaults, the owner reference to the
  ReplicaSet, ``managedFields``, the kubelet's whole status), each
  running a real ``keyorder run`` process with the Deployment's own ``KEYORDER_*`` environment and its
  own loopback address (127.0.W.N, W one per pytest-xdist worker, so every pod listens on the CR's
  ``httpPort`` as in a cluster and parallel test workers never share an address); ``podIP`` and the
  ``Ready`` condition come from the process's ``/readyz``. With ``processes=False`` the pods are objects
  only, ready at once (for a test of what the operator writes, not of what the pods do).
* **Rollouts.** A changed template replaces the old pods. ``Recreate`` deletes them and starts no new
  pod while any old one is still there, terminating ones included (kubernetes/kubernetes
  ``pkg/controller/deployment/recreate.go``, ``oldPodsRunning``); a rolling update deletes them and starts
  the new ones at once, beside the old ones still terminating (its ``maxSurge``/``maxUnavailable`` pacing
  is not imitated).
* **Terminating pods.** A pod is deleted as the ReplicaSet controller deletes it (no grace period asked:
  the pod's own ``terminationGracePeriodSeconds``), so the emulator marks it terminating; its process gets
  SIGTERM, and once it has exited (or, after the grace period, been killed) the kubelet deletes the Pod with
  period 0 (kubernetes/kubernetes ``pkg/kubelet/status/status_manager.go``). ``hold_terminating`` keeps
  deleted pods terminating until the test clears it, as a slow or lost node does.
* **Status as the controllers compute it.** ``status.replicas`` counts the active pods only, never the
  terminating ones (``pkg/controller/replicaset/replica_set_utils.go`` ``calculateStatus`` over
  ``controller.FilterActivePods``; ``pkg/controller/controller_utils.go`` ``IsPodActive``);
  ``updatedReplicas`` the active pods of the current template, ``readyReplicas``/``availableReplicas``
  the ready ones, ``observedGeneration`` the Deployment's generation
  (``pkg/controller/deployment/sync.go`` ``calculateStatus``); zero counts are left out, as the API's
  ``omitempty`` fields are. ``status.terminatingReplicas`` (the ``DeploymentReplicaSetTerminatingReplicas``
  feature: alpha in Kubernetes 1.33, on by default from 1.35) only with ``terminating_replicas=True``.

What it does not imitate: ReplicaSet objects, images, volumes (the admin token Secret is written to a
file), probes' timing, restarts, ``minReadySeconds``.

The kubelet's steps are also functions (``write_admin_token``, ``create_pod``, ``report_pod_status``)
for a test that runs a pod in-process and plays the kubelet for it by hand.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import datetime
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyorder.devtools.embedded import FAST_GROUP_JOIN
from tests.operator.cluster_objects import as_created, pod_status
from tests.operator.harness import ApiError, KubeHTTP, resource_path

LOOPBACK_NET = 1 + int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
"""The third byte of this test process's pod addresses (127.0.0.0/8 is all loopback on Linux)."""

TEMPLATE_HASH_LABEL = "pod-template-hash"
"""The label the Deployment controller puts on a ReplicaSet's pods: which template they were made from."""
NODE_NAME = "local-node"
"""The node the stand-in binds its pods to (a bound pod is deleted gracefully, an unbound one at once)."""
DEFAULT_GRACE_SECONDS = 30
"""A pod's termination grace period when its template sets none (the API server's default)."""


@dataclass
class LocalProcessPod:
    name: str
    address: str
    process: subprocess.Popen | None
    log_path: Path | None
    template: str = ""
    """The ``pod-template-hash`` of the template it was made from."""
    uid: str = ""
    ready: bool = False
    terminating: bool = False
    deadline: float = 0.0
    """``time.monotonic()`` at which its grace period ends (once terminating)."""


def template_hash(template: dict[str, Any]) -> str:
    """A name for a pod template that changes whenever the template does (the controller's own hash,
    ``controller.ComputeHash``, differs in value, not in use)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


def pod_from_template(template: dict[str, Any], name: str, hashed: str) -> dict[str, Any]:
    """The Pod a ReplicaSet makes from ``template`` (its labels plus ``pod-template-hash``), bound to the node."""
    metadata = template.get("metadata") or {}
    spec = copy.deepcopy(template.get("spec") or {})
    spec["nodeName"] = NODE_NAME
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {**(metadata.get("labels") or {}), TEMPLATE_HASH_LABEL: hashed},
            "annotations": dict(metadata.get("annotations") or {}),
        },
        "spec": spec,
    }


def deployment_status(
    deployment: dict[str, Any], pods: list[LocalProcessPod], terminating_replicas: bool
) -> dict[str, Any]:
    """The Deployment's status as the controllers compute it from these pods (see the module docstring);
    a zero count is None (left out, as the API's ``omitempty``; None removes it in a merge patch)."""
    current = template_hash(deployment["spec"]["template"])
    active = [pod for pod in pods if not pod.terminating]
    ready = sum(pod.ready for pod in active)
    counts: dict[str, Any] = {
        "observedGeneration": (deployment.get("metadata") or {}).get("generation"),
        "replicas": len(active),
        "updatedReplicas": sum(pod.template == current for pod in active),
        "readyReplicas": ready,
        "availableReplicas": ready,
    }
    status = {key: value or None for key, value in counts.items()}
    if terminating_replicas:  # a pointer in the API: 0 is written
        status["terminatingReplicas"] = sum(pod.terminating for pod in pods)
    return status


class LocalKubelet:
    """Runs the pods of Deployment ``name`` until ``stop()``; ``peak`` is the most pods it ran at once
    (terminating ones included).

    Used as a context manager, its exit fails the test (AssertionError) when its loop met errors (an API
    call that failed, a pod it could not start): such a kubelet did not do its part, so whatever the test
    saw of the operator is suspect. A test that provokes such errors says so with ``expect_errors=True``
    and reads ``errors`` itself.
    """

    def __init__(
        self,
        kube: KubeHTTP,
        name: str,
        workdir: Path | None = None,
        extra_env: dict[str, str] | None = None,
        period: float = 0.2,
        expect_errors: bool = False,
        processes: bool = True,
        terminating_replicas: bool = False,
    ) -> None:
        if processes and workdir is None:
            raise ValueError("a LocalKubelet that runs processes needs a workdir (their logs and token files)")
        self.kube, self.name, self.workdir = kube, name, workdir
        self.extra_env = dict(extra_env or {})
        self.period = period
        self.expect_errors = expect_errors
        self.processes = processes
        self.terminating_replicas = terminating_replicas
        self.hold_terminating = threading.Event()
        """Set: a deleted pod stays terminating (the kubelet never deletes it), until the test clears it."""
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
        running = [pod.process for pod in self.pods if pod.process is not None]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        for process in running:
            try:
                process.wait(30)  # hang guard
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)  # hang guard
        self.pods.clear()

    def crashed(self) -> list[str]:
        """The pods whose process exited although nobody deleted them."""
        return [
            f"{pod.name}: exit {pod.process.returncode}"
            for pod in self.pods
            if pod.process is not None and not pod.terminating and pod.process.poll() is not None
        ]

    def terminating(self) -> list[str]:
        """The names of the pods deleted but still there."""
        return [pod.name for pod in self.pods if pod.terminating]

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
        current = template_hash(deployment["spec"]["template"])
        desired = deployment["spec"].get("replicas") or 0
        self._remove_terminated()
        for pod in [pod for pod in self.pods if not pod.terminating and pod.template != current]:
            self._terminate(pod, deployment)  # the old ReplicaSets are scaled to zero
        recreate = (deployment["spec"].get("strategy") or {}).get("type") == "Recreate"
        if not (recreate and any(pod.template != current for pod in self.pods)):  # recreate.go oldPodsRunning
            updated = [pod for pod in self.pods if not pod.terminating]
            while len(updated) < desired:
                started = self._start(deployment, current)
                self.pods.append(started)
                updated.append(started)
            while len(updated) > desired:
                self._terminate(updated.pop(), deployment)
        self.peak = max(self.peak, len(self.pods))
        for pod in self.pods:
            if pod.terminating or pod.process is None:
                continue
            ready = pod.process.poll() is None and _ready(pod.address, _port(deployment))
            if ready != pod.ready:
                pod.ready = ready
                report_pod_status(self.kube, pod.name, pod.address, ready)
        status = deployment_status(deployment, self.pods, self.terminating_replicas)
        stored = deployment.get("status") or {}
        if any(stored.get(key) != value for key, value in status.items()):
            self.kube.patch("apps/v1/deployments", self.name, {"status": status}, subresource="status")

    def _start(self, deployment: dict[str, Any], hashed: str) -> LocalProcessPod:
        self.started += 1
        name = f"{self.name}-{self.started}"
        address = f"127.0.{LOOPBACK_NET}.{10 + self.started}"
        template = deployment["spec"]["template"]
        process, log_path = self._start_process(template, name, address) if self.processes else (None, None)
        made = pod_from_template(template, name, hashed)
        created = self.kube.create("v1/pods", as_created(made, f"{self.name}-{hashed}", _now()))
        pod = LocalProcessPod(name, address, process, log_path, hashed, created["metadata"]["uid"])
        if process is None:  # an object-only pod is ready at once
            pod.ready = True
            report_pod_status(self.kube, name, address, True)
        return pod

    def _start_process(self, template: dict[str, Any], name: str, address: str) -> tuple[subprocess.Popen, Path]:
        assert self.workdir is not None  # checked in __init__
        container = template["spec"]["containers"][0]
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
        return process, log_path

    def _terminate(self, pod: LocalProcessPod, deployment: dict[str, Any]) -> None:
        """Delete the pod as the ReplicaSet controller does (its own grace period) and stop its process."""
        grace = deployment["spec"]["template"].get("spec", {}).get("terminationGracePeriodSeconds")
        pod.terminating = True
        pod.deadline = time.monotonic() + (DEFAULT_GRACE_SECONDS if grace is None else grace)
        with contextlib.suppress(ApiError):  # a pod somebody else deleted already
            self.kube.delete("v1/pods", pod.name)
        if pod.process is not None and pod.process.poll() is None:
            pod.process.send_signal(signal.SIGTERM)

    def _remove_terminated(self) -> None:
        """The kubelet's last step for a terminating pod whose containers stopped (or whose grace period ran
        out: then they are killed): delete it with period 0. Not while ``hold_terminating`` is set."""
        if self.hold_terminating.is_set():
            return
        for pod in [pod for pod in self.pods if pod.terminating]:
            if pod.process is not None and pod.process.poll() is None:
                if time.monotonic() < pod.deadline:
                    continue
                pod.process.kill()
                pod.process.wait(10)  # hang guard
            final = {"gracePeriodSeconds": 0, "preconditions": {"uid": pod.uid}}
            try:
                self.kube.call("DELETE", resource_path("v1/pods", "default", pod.name), final)
            except ApiError as error:
                if error.status not in (404, 409):  # gone, or another pod of that name: not this one
                    raise
            self.pods.remove(pod)


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
    """What the kubelet reports of a running pod: its IP, whether it is ready, and the rest of a real pod's
    status (``cluster_objects.pod_status``: conditions, container statuses, host IPs, start time)."""
    pod = kube.get("v1/pods", name) or {"metadata": {"name": name}, "spec": {}}
    status = pod_status(pod, address, ready=ready, now=_now())
    kube.patch("v1/pods", name, {"status": status}, subresource="status")


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
