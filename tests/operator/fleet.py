"""A FAKE Deployment/ReplicaSet controller and kubelet for a whole fleet of Deployments: object-only pods.

``kubelet.LocalKubelet`` runs one Deployment's pods as processes, a thread each: right for a test of what
the pods do, too heavy for a benchmark of hundreds of resources. ``ObjectFleet`` keeps, for every Deployment
of a namespace, ``spec.replicas`` Pod objects of its current template, shaped as a cluster returns them
(``cluster_objects``: the API server's defaults, the owner reference, ``managedFields``, the kubelet's whole
status), Ready at a loopback address nothing listens on (a report fetch or a worker push is refused at once),
and writes the Deployment's status with the controller's conditions. Removed pods are deleted with grace
period 0 (no process has to stop). One thread, one list of the Deployments every ``period`` seconds.

What it does not imitate: rollouts' pacing, terminating pods, readiness that changes (see ``kubelet`` for
those).
"""

from __future__ import annotations

import datetime
import threading
from typing import Any

from tests.operator.cluster_objects import as_created, deployment_conditions, with_status
from tests.operator.harness import ApiError, KubeHTTP, resource_path
from tests.operator.kubelet import pod_from_template, template_hash

NAMESPACE = "default"


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class ObjectFleet:
    """Keeps every Deployment's pods in ``namespace`` as objects until ``stop()`` (a context manager).
    ``errors`` collects what its loop met (an API call that failed); ``pods`` counts the pods it keeps."""

    def __init__(self, kube: KubeHTTP, period: float = 2.0, namespace: str = NAMESPACE, running: bool = True) -> None:
        """``running`` False: the context manager does nothing (a benchmark run without pods)."""
        self.kube, self.period, self.namespace, self.running = kube, period, namespace, running
        self._pods: dict[str, dict[str, str]] = {}
        """Deployment -> pod name -> the template hash it was made from."""
        self._addresses = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="object-fleet", daemon=True)
        self.errors: list[str] = []

    @property
    def pods(self) -> int:
        return sum(len(pods) for pods in self._pods.values())

    def __enter__(self) -> ObjectFleet:
        if self.running:
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(60)  # hang guard

    def sync(self) -> None:
        """One round: every Deployment gets its pods and its status."""
        for deployment in self.kube.list("apps/v1/deployments", self.namespace):
            if self._stop.is_set():
                return
            self._sync(deployment)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as error:  # kept going; the benchmark reports them
                self.errors.append(f"{type(error).__name__}: {error}")
            self._stop.wait(self.period)

    def _sync(self, deployment: dict[str, Any]) -> None:
        name = deployment["metadata"]["name"]
        template = deployment["spec"]["template"]
        hashed = template_hash(template)
        pods = self._pods.setdefault(name, {})
        for pod_name in [pod for pod, made_from in pods.items() if made_from != hashed]:
            self._delete(pods, pod_name)
        desired = deployment["spec"].get("replicas") or 0
        while len(pods) < desired:
            self._addresses += 1
            pod_name = f"{name}-{hashed[:5]}-{self._addresses:05d}"
            address = f"127.0.{200 + self._addresses // 250}.{1 + self._addresses % 250}"
            now = _now()
            created = as_created(pod_from_template(template, pod_name, hashed), f"{name}-{hashed}", now)
            self.kube.create("v1/pods", created, self.namespace)
            status = with_status(created, address, ready=True, now=now)["status"]
            self.kube.patch("v1/pods", pod_name, {"status": status}, subresource="status", namespace=self.namespace)
            pods[pod_name] = hashed
        while len(pods) > desired:
            self._delete(pods, next(iter(pods)))
        counts = {
            "observedGeneration": deployment["metadata"].get("generation"),
            "replicas": len(pods) or None,
            "updatedReplicas": len(pods) or None,
            "readyReplicas": len(pods) or None,
            "availableReplicas": len(pods) or None,
        }
        stored = deployment.get("status") or {}
        if any(stored.get(key) != value for key, value in counts.items()):
            available = len(pods) >= desired
            status = {**counts, "conditions": deployment_conditions(available, f"{name}-{hashed}", _now())}
            self.kube.patch(
                "apps/v1/deployments", name, {"status": status}, subresource="status", namespace=self.namespace
            )

    def _delete(self, pods: dict[str, str], pod_name: str) -> None:
        try:
            self.kube.call("DELETE", resource_path("v1/pods", self.namespace, pod_name), {"gracePeriodSeconds": 0})
        except ApiError as error:
            if error.status != 404:
                raise
        del pods[pod_name]


__all__ = ["ObjectFleet"]
