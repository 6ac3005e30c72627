"""The only module that talks to the Kubernetes API (besides kopf itself).

Create-or-patch for the objects the builders return, the scale of a Deployment, the admin-token
Secret, and the addresses of ready consumer pods. Synchronous (the ``kubernetes`` client); kopf
runs sync handlers on its thread pool. Every call the operator makes is listed in
``API_CALLS`` so the RBAC rules can be derived from, and checked against, this module.
"""

from __future__ import annotations

import base64
import logging
from typing import TYPE_CHECKING, Any

import kubernetes
from kubernetes.client.rest import ApiException

if TYPE_CHECKING:
    from kubernetes.client import V1ObjectMeta, V1Pod

log = logging.getLogger(__name__)

API_CALLS = {
    ("apps", "deployments"): {"get", "create", "patch"},
    ("", "services"): {"get", "create", "patch"},
    ("policy", "poddisruptionbudgets"): {"get", "create", "patch"},
    ("", "serviceaccounts"): {"get", "create", "patch"},
    ("", "secrets"): {"get", "create"},
    ("", "pods"): {"list"},
    ("batch", "jobs"): {"get", "create"},
    # Not a call: the owned objects' ownerReferences set blockOwnerDeletion, which clusters enforcing
    # OwnerReferencesPermissionEnforcement (OpenShift) allow only with update on the owner's finalizers.
    ("keyorder.dev", "orderedconsumers/finalizers"): {"update"},
}
"""(API group, resource) -> verbs this module uses; kopf itself also needs the CR, its status and events."""


class JobConflict(RuntimeError):
    """A Job with the wanted name exists but was not created for this purpose."""


def _secret_value(secret: Any, namespace: str, name: str, key: str) -> str:
    if secret.data and key in secret.data:
        return base64.b64decode(secret.data[key]).decode()
    if secret.string_data and key in secret.string_data:
        return secret.string_data[key]
    raise KeyError(f"Secret {namespace}/{name} has no key {key!r}")


def _pod_metadata(pod: V1Pod) -> V1ObjectMeta:
    if pod.metadata is None:  # the API server always sets it on a listed pod
        raise ValueError("the Kubernetes API returned a pod without metadata")
    return pod.metadata


class Kube:
    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.client = api_client
        self.apps = kubernetes.client.AppsV1Api(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.policy = kubernetes.client.PolicyV1Api(api_client)
        self.batch = kubernetes.client.BatchV1Api(api_client)

    def _verbs(self, kind: str):
        table = {
            "Deployment": (
                self.apps.read_namespaced_deployment,
                self.apps.create_namespaced_deployment,
                self.apps.patch_namespaced_deployment,
            ),
            "Service": (
                self.core.read_namespaced_service,
                self.core.create_namespaced_service,
                self.core.patch_namespaced_service,
            ),
            "PodDisruptionBudget": (
                self.policy.read_namespaced_pod_disruption_budget,
                self.policy.create_namespaced_pod_disruption_budget,
                self.policy.patch_namespaced_pod_disruption_budget,
            ),
            "ServiceAccount": (
                self.core.read_namespaced_service_account,
                self.core.create_namespaced_service_account,
                self.core.patch_namespaced_service_account,
            ),
        }
        return table[kind]

    def apply(self, desired: dict[str, Any]) -> None:
        """Create ``desired``, or merge-patch it over the existing object."""
        read, create, patch = self._verbs(desired["kind"])
        name, namespace = desired["metadata"]["name"], desired["metadata"]["namespace"]
        try:
            read(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            create(namespace, desired)
            log.info("created %s %s/%s", desired["kind"], namespace, name)
            return
        patch(name, namespace, desired)

    def deployment_replicas(self, namespace: str, name: str) -> int | None:
        try:
            deployment = self.apps.read_namespaced_deployment(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return deployment.spec.replicas

    def scale(self, namespace: str, name: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment(name, namespace, {"spec": {"replicas": replicas}})

    def ensure_secret(self, desired: dict[str, Any], key: str) -> str:
        """Create the Secret if missing (never rotate it here); return the value under ``key``."""
        name, namespace = desired["metadata"]["name"], desired["metadata"]["namespace"]
        try:
            secret = self.core.read_namespaced_secret(name, namespace)
        except ApiException as error:
            if error.status != 404:
                raise
            # The stub names the model type; validate_call also takes the manifest dict and validates it into one.
            self.core.create_namespaced_secret(namespace, desired)  # type: ignore[arg-type]
            return desired["stringData"][key]
        return _secret_value(secret, namespace, name, key)

    def read_secret_key(self, namespace: str, name: str, key: str) -> str:
        return _secret_value(self.core.read_namespaced_secret(name, namespace), namespace, name, key)

    def create_job(self, desired: dict[str, Any], identity_annotation: str) -> None:
        """Create a Job. One that already exists is accepted only if ``identity_annotation`` matches (a
        retried reconcile); otherwise ``JobConflict``: another Job has the name, its outcome is not ours."""
        namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        try:
            # The stub names the model type; validate_call also takes the manifest dict and validates it into one.
            self.batch.create_namespaced_job(namespace, desired)  # type: ignore[arg-type]
        except ApiException as error:
            if error.status != 409:
                raise
            existing = self.job(namespace, name) or {}
            theirs = ((existing.get("metadata") or {}).get("annotations") or {}).get(identity_annotation)
            if theirs != desired["metadata"]["annotations"][identity_annotation]:
                raise JobConflict(f"Job {namespace}/{name} already exists and belongs to another hand-over") from None
            return
        log.info("created Job %s/%s", namespace, name)

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Job as a plain dict (``None`` when it does not exist)."""
        try:
            job = self.batch.read_namespaced_job(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return self.client.sanitize_for_serialization(job)

    def deployment_pods_reported(self, namespace: str, name: str) -> int:
        """``status.replicas`` of a Deployment: pods its ReplicaSets still have (0 when absent)."""
        try:
            deployment = self.apps.read_namespaced_deployment(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return 0
            raise
        return (deployment.status.replicas or 0) if deployment.status else 0

    def pod_count(self, namespace: str, selector: dict[str, str]) -> int:
        """Pods matching ``selector`` that still exist in any phase (terminating ones included)."""
        label_selector = ",".join(f"{key}={value}" for key, value in selector.items())
        pods = self.core.list_namespaced_pod(namespace, label_selector=label_selector).items
        return sum(
            1
            for pod in pods
            if all((_pod_metadata(pod).labels or {}).get(key) == value for key, value in selector.items())
            and (pod.status is None or pod.status.phase not in ("Succeeded", "Failed"))
        )

    def ready_pod_ips(self, namespace: str, selector: dict[str, str]) -> list[str]:
        """IPs of ready pods matching ``selector`` (filtered here too: not every API server filters)."""
        label_selector = ",".join(f"{key}={value}" for key, value in selector.items())
        pods = self.core.list_namespaced_pod(namespace, label_selector=label_selector).items
        addresses = []
        for pod in pods:
            metadata, status = _pod_metadata(pod), pod.status
            labels = metadata.labels or {}
            if any(labels.get(key) != value for key, value in selector.items()):
                continue
            conditions = (status.conditions or []) if status else []
            ready = any(c.type == "Ready" and c.status == "True" for c in conditions)
            if ready and status is not None and status.pod_ip and metadata.deletion_timestamp is None:
                addresses.append(status.pod_ip)
        return addresses

    def deployment_rolled_out(self, namespace: str, name: str) -> bool:
        """All of the Deployment's pods are updated and ready (False while pods start, roll or are missing)."""
        try:
            deployment = self.apps.read_namespaced_deployment(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return False
            raise
        wanted = deployment.spec.replicas or 0
        status = deployment.status
        if status is None:
            return wanted == 0
        ready, updated = status.ready_replicas or 0, status.updated_replicas or 0
        return ready >= wanted and updated >= wanted and (status.replicas or 0) <= wanted
