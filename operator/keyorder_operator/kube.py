"""The only module that talks to the Kubernetes API (besides kopf itself).

Server-side apply of the objects the builders return (field manager ``FIELD_MANAGER``, forced: the
operator owns every field it writes, and fields it stops writing are removed by the API server,
list items included, which a client-side merge patch never does), the scale of a Deployment, the
admin-token Secret, and the addresses of ready consumer pods. Fields the operator does not write
(annotations added by other tools, for example) stay with whoever set them. Synchronous (the
``kubernetes`` client); kopf runs sync handlers on its thread pool. Every call the operator makes
is listed in ``API_CALLS`` so the RBAC rules can be derived from, and checked against, this module.
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import kubernetes
from kubernetes.client.rest import ApiException

from keyorder.config import decode_properties
from keyorder_operator.builders import rolled_out
from keyorder_operator.cache import CHECK_PAGE, POD, WATCH_SELECTORS, kept_object, owns_replicas
from keyorder_operator.refusals import Refusal, refusal_of

if TYPE_CHECKING:
    from kubernetes.client import V1ObjectMeta, V1Pod

    from keyorder_operator.cache import OwnedObjectsCache

log = logging.getLogger(__name__)

SECRET_SECONDS = 60.0
"""A Secret read is reused this long: a rotated Kafka password reaches the operator within a minute."""
AUTOSCALERS_SECONDS = 15.0
"""A namespace's list of HorizontalPodAutoscalers is reused this long by the polls that ask while a
conflict lasts (its resources share it; at 500 resources a list per poll was 100 lists a second): a
deleted HPA is seen within this. A poll whose replicas just moved without the operator lists afresh
(``max_age=0``), so an HPA created a moment ago is never missed; such polls are rare."""

FIELD_MANAGER = "keyorder-operator"
"""The field manager of everything the operator applies (``metadata.managedFields`` shows it)."""
SCALE_FIELD_MANAGER = "keyorder-operator-scaler"
"""The autoscaler's own manager: it applies only ``spec.replicas``, so it must not share the object
manager's applied configuration (an apply of one field would remove all the others)."""
APPLY_CONTENT_TYPE = "application/apply-patch+yaml"

API_CALLS = {
    # patch: server-side apply updates; create: an apply that creates the object is also authorised as
    # create (the API server checks both); get: a read the watched cache could not answer; list: the
    # cache's check after kopf listed the kind again (what vanished meanwhile sends no DELETED)
    ("apps", "deployments"): {"get", "list", "patch", "create"},
    ("", "services"): {"get", "list", "patch", "create"},
    ("policy", "poddisruptionbudgets"): {"get", "list", "patch", "create"},
    ("", "serviceaccounts"): {"get", "list", "patch", "create"},
    # delete: the pods' NetworkPolicy goes when the chart's networkPolicy.consumerPods is turned off
    ("networking.k8s.io", "networkpolicies"): {"get", "list", "patch", "create", "delete"},
    ("", "secrets"): {"get", "create"},
    ("", "pods"): {"list"},
    ("batch", "jobs"): {"get", "create"},
    # list: is another autoscaler (an HPA, or KEDA's, which is one) scaling the consumers' Deployment?
    ("autoscaling", "horizontalpodautoscalers"): {"list"},
    # Not a call: the owned objects' ownerReferences set blockOwnerDeletion, which clusters enforcing
    # OwnerReferencesPermissionEnforcement (OpenShift) allow only with update on the owner's finalizers.
    ("keyorder.dev", "orderedconsumers/finalizers"): {"update"},
}
"""(API group, resource) -> verbs this module uses; kopf itself also needs the CR, its status and events."""


class JobConflict(RuntimeError):
    """A Job with the wanted name exists but was not created for this purpose."""


class ApplyRefused(RuntimeError):
    """The API server refused an apply for what the object is (``refusals.refusal_of``: 422 Invalid, or an
    applied configuration that fails typed validation): sending it again would fail again."""

    def __init__(self, refusal: Refusal, message: str) -> None:
        super().__init__(message)
        self.refusal = refusal


def _secret_value(secret: Any, namespace: str, name: str, key: str) -> str:
    if secret.data and key in secret.data:
        return base64.b64decode(secret.data[key]).decode()
    if secret.string_data and key in secret.string_data:
        return secret.string_data[key]
    raise KeyError(f"Secret {namespace}/{name} has no key {key!r}")


def _label_selector(selector: dict[str, str]) -> str:
    """``selector`` as the API's ``labelSelector`` (``key=value,...``)."""
    return ",".join(f"{key}={value}" for key, value in selector.items())


def _pod_metadata(pod: V1Pod) -> V1ObjectMeta:
    if pod.metadata is None:  # the API server always sets it on a listed pod
        raise ValueError("the Kubernetes API returned a pod without metadata")
    return pod.metadata


def replicas_of(deployment: dict[str, Any] | None) -> int | None:
    """A Deployment's ``spec.replicas`` (``None`` for a missing Deployment, or one without the field)."""
    return None if deployment is None else (deployment.get("spec") or {}).get("replicas")


def _applied_replicas(deployment: dict[str, Any] | None, manager: str) -> bool:
    """``manager`` owns the Deployment's ``spec.replicas`` by server-side apply (``metadata.managedFields``)."""
    for entry in ((deployment or {}).get("metadata") or {}).get("managedFields") or ():
        if entry.get("manager") == manager and entry.get("operation", "Apply") == "Apply" and owns_replicas(entry):
            return True
    return False


def scaler_owns_replicas(deployment: dict[str, Any] | None) -> bool:
    """The scaler's field manager owns the Deployment's ``spec.replicas`` (``metadata.managedFields``)."""
    return _applied_replicas(deployment, SCALE_FIELD_MANAGER)


def replicas_to_hand_over(deployment: dict[str, Any] | None) -> bool:
    """An older release's Deployment: the objects' manager applied ``spec.replicas`` and the scaler does not own
    them, so the next apply of the object (which leaves them out) would remove them unless they are handed to
    the scaler first. Not so when somebody else took them: an HPA's or ``kubectl scale``'s update makes its
    writer their owner and takes them from every other manager, the objects' one included (server-side apply's
    rule for updates), and then they are that writer's, not the operator's to take back."""
    return _applied_replicas(deployment, FIELD_MANAGER) and not scaler_owns_replicas(deployment)


def ready_addresses(pods: list[dict[str, Any]], selector: dict[str, str]) -> list[str]:
    """IPs of the ready, not terminating pods among ``pods`` that match ``selector`` (filtered here too:
    not every API server filters)."""
    addresses = []
    for pod in pods:
        metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
        labels = metadata.get("labels") or {}
        if any(labels.get(key) != value for key, value in selector.items()):
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if ready and status.get("podIP") and metadata.get("deletionTimestamp") is None:
            addresses.append(status["podIP"])
    return addresses


class Kube:
    """The operator's Kubernetes calls. With a ``cache`` (``cache.OwnedObjectsCache``, fed by watches),
    reads of the owned objects and the consumer pods go through it, and applies write through it."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        cache: OwnedObjectsCache | None = None,
        secret_seconds: float = SECRET_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = api_client
        self.cache = cache
        self.secret_seconds = secret_seconds
        self._monotonic = monotonic
        self._secrets: dict[tuple[str, str], tuple[float, Any]] = {}
        self._autoscalers: dict[str, tuple[float, list[tuple[str, str, str]]]] = {}
        """namespace -> (when listed, its HPAs as (name, target kind, target name))."""
        self.apps = kubernetes.client.AppsV1Api(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.policy = kubernetes.client.PolicyV1Api(api_client)
        self.batch = kubernetes.client.BatchV1Api(api_client)
        self.autoscaling = kubernetes.client.AutoscalingV2Api(api_client)
        self.networking = kubernetes.client.NetworkingV1Api(api_client)

    def _apply_call(self, kind: str) -> Any:
        table = {
            "Deployment": self.apps.patch_namespaced_deployment,
            "Service": self.core.patch_namespaced_service,
            "PodDisruptionBudget": self.policy.patch_namespaced_pod_disruption_budget,
            "ServiceAccount": self.core.patch_namespaced_service_account,
            "NetworkPolicy": self.networking.patch_namespaced_network_policy,
        }
        return table[kind]

    def _read_call(self, kind: str) -> Any:
        table = {
            "Deployment": self.apps.read_namespaced_deployment,
            "Service": self.core.read_namespaced_service,
            "PodDisruptionBudget": self.policy.read_namespaced_pod_disruption_budget,
            "ServiceAccount": self.core.read_namespaced_service_account,
            "NetworkPolicy": self.networking.read_namespaced_network_policy,
        }
        return table[kind]

    def apply(self, desired: dict[str, Any]) -> str:
        """Server-side apply the object ``desired`` (created if missing) by the objects' manager, forcing
        ownership of every field in it; returns the applied object's resourceVersion. ``ApplyRefused`` when the
        API server refuses the object itself (retrying the same object cannot help); any other failure is raised
        as it came."""
        name, namespace = desired["metadata"]["name"], desired["metadata"]["namespace"]
        if desired["kind"] == "Deployment" and desired["spec"].get("strategy", {}).get("type") == "Recreate":
            self._drop_rolling_update(namespace, name)
        try:
            return self._server_side_apply(desired, FIELD_MANAGER)
        except ApiException as error:
            refusal = refusal_of(desired["kind"], int(error.status or 0), error.body)
            if refusal is None:
                raise  # temporary, as far as anyone can tell: retried
            causes = "; ".join(f"{field}: {message}" if field else message for field, message in refusal.causes)
            raise ApplyRefused(
                refusal, f"the API server refused {desired['kind']} {namespace}/{name}: {causes}"
            ) from error

    def _server_side_apply(self, desired: dict[str, Any], field_manager: str) -> str:
        """The apply itself, forced, written through to the cache; API errors raised as they came."""
        applied = self._apply_call(desired["kind"])(
            desired["metadata"]["name"],
            desired["metadata"]["namespace"],
            desired,
            field_manager=field_manager,
            force=True,
            _content_type=APPLY_CONTENT_TYPE,
        )
        if self.cache is not None:  # write-through: the next check sees this version, not a stale event
            self.cache.put(desired["kind"], self.client.sanitize_for_serialization(applied))
        return str(applied.metadata.resource_version)

    def network_policy_present(self, namespace: str, name: str) -> bool:
        """Whether the operator's NetworkPolicy ``name`` exists: from the watched cache when there is one (only
        the operator's labelled objects are in it, and asking the API server on every poll of every resource
        for an object that is normally absent would cost a read each), else from the API server."""
        if self.cache is not None:
            self._verify_cache("NetworkPolicy", namespace)
            return self.cache.holds("NetworkPolicy", namespace, name)
        return self._read(self._read_call("NetworkPolicy"), namespace, name) is not None

    def delete_network_policy(self, namespace: str, name: str, owner_uid: str) -> bool:
        """Delete the NetworkPolicy ``name`` if the resource with ``owner_uid`` owns it (never a policy of the
        same name somebody else made), with its uid as a precondition; True when one was deleted."""
        found = self._read(self._read_call("NetworkPolicy"), namespace, name)
        owners = ((found or {}).get("metadata") or {}).get("ownerReferences") or []
        deleted = False
        if found is not None and any(owner.get("uid") == owner_uid for owner in owners):
            try:
                self.networking.delete_namespaced_network_policy(
                    name,
                    namespace,
                    body=kubernetes.client.V1DeleteOptions(
                        preconditions=kubernetes.client.V1Preconditions(uid=found["metadata"]["uid"])
                    ),
                )
                deleted = True
            except ApiException as error:
                if error.status not in (404, 409):  # gone already, or replaced meanwhile: not ours to delete
                    raise
        if self.cache is not None:
            self.cache.drop("NetworkPolicy", namespace, name)
        return deleted

    def _drop_rolling_update(self, namespace: str, name: str) -> None:
        """Remove ``spec.strategy.rollingUpdate`` before a switch to ``Recreate``, which refuses it. A
        Deployment first applied without a strategy got it by defaulting, owned by no field manager,
        so an apply that leaves it out would keep it; a merge patch's null removes it either way."""
        try:
            self.apps.patch_namespaced_deployment(
                name,
                namespace,
                {"spec": {"strategy": {"type": "Recreate", "rollingUpdate": None}}},
                field_manager=FIELD_MANAGER,
                _content_type="application/merge-patch+json",
            )
        except ApiException as error:
            if error.status != 404:  # a missing Deployment is created by the apply that follows
                raise

    def resource_version(self, kind: str, namespace: str, name: str) -> str | None:
        """The resourceVersion of an object the operator applies (``None``: it does not exist)."""
        found = self.owned(kind, namespace, name)
        return None if found is None else str((found.get("metadata") or {}).get("resourceVersion"))

    def owned(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """An owned object as a plain dict, from the cache or else the API (``None`` when it does not exist).
        With a cache, what it keeps of the object (``cache.kept_object``), hit or miss alike."""
        if self.cache is not None:
            self._verify_cache(kind, namespace)
            cached = self.cache.get(kind, namespace, name)
            if cached is not None:
                return cached
        found = self._read(self._read_call(kind), namespace, name)
        if self.cache is not None:
            if found is None:
                self.cache.drop(kind, namespace, name)
                return None
            self.cache.put(kind, found)
            return kept_object(kind, found)
        return found

    def _verify_cache(self, kind: str, namespace: str) -> None:
        """After kopf listed ``kind`` again (a 410 Gone, a resumed watch), list it in ``namespace`` once and
        drop from the cache what the API server no longer has: kopf sends no DELETED for what vanished while
        it did not watch (``cache.OwnedObjectsCache.verification_due``). A failed list is logged and tried
        again on a later read; the read goes on from the cache meanwhile."""
        assert self.cache is not None
        started = self.cache.verification_due(kind, namespace)
        if started is None:
            return
        try:
            present = self._listed_names(kind, namespace)
        except Exception as error:  # logged; the read goes on from the cache, the check comes again
            self.cache.verification_failed(kind, namespace)
            log.warning("could not list %s in %s to check the cache after a re-list: %s", kind, namespace, error)
            return
        dropped = self.cache.verified(kind, namespace, started, present)
        if dropped:
            log.info("dropped %d %s(s) of %s from the cache: deleted while not watched", dropped, kind, namespace)

    def _listed_names(self, kind: str, namespace: str) -> set[str]:
        """The names of the operator's objects of ``kind`` in ``namespace`` (by the watches' label), listed
        in pages of ``cache.CHECK_PAGE``, each page parsed as plain JSON and only the names kept (not the client's
        models of a page of whole pods)."""
        table: dict[str, Callable[..., Any]] = {
            "Deployment": self.apps.list_namespaced_deployment,
            "Service": self.core.list_namespaced_service,
            "PodDisruptionBudget": self.policy.list_namespaced_pod_disruption_budget,
            "ServiceAccount": self.core.list_namespaced_service_account,
            "NetworkPolicy": self.networking.list_namespaced_network_policy,
            POD: self.core.list_namespaced_pod,
        }
        names: set[str] = set()
        token: str | None = None
        while True:
            response = table[kind](
                namespace,
                label_selector=WATCH_SELECTORS[kind],
                limit=CHECK_PAGE,
                _continue=token,
                _preload_content=False,
            )
            page = json.loads(response.data)
            names.update(str((item.get("metadata") or {}).get("name")) for item in page.get("items") or ())
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                return names

    def _read(self, read: Any, namespace: str, name: str) -> dict[str, Any] | None:
        """An object as a plain dict, through the client's ``read_namespaced_*`` call (``None`` when missing)."""
        try:
            found = read(name, namespace)
        except ApiException as error:
            if error.status == 404:
                return None
            raise
        return self.client.sanitize_for_serialization(found)

    def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The live Deployment as a plain dict (``None`` when it does not exist)."""
        return self.owned("Deployment", namespace, name)

    def deployment_replicas(self, namespace: str, name: str) -> int | None:
        return replicas_of(self.deployment(namespace, name))

    def scale(self, namespace: str, name: str, replicas: int, *, expected: int | None = None) -> str | None:
        """Set a Deployment's replicas (server-side apply of that one field, by the scaler's own manager,
        forced: the replicas are the autoscaler's); returns the resourceVersion.

        With ``expected``, the replicas the caller decided from, only while the Deployment still has them: a
        compare-and-swap. The apply carries the resourceVersion of a read that showed ``expected`` (the cache's,
        else one from the API server), which the API server checks as it checks any update's (409 when the
        object moved on), so a size somebody else wrote meanwhile (an HPA, ``kubectl scale``) is never
        overwritten by a decision that did not see it, however far behind the watch is. A 409 is answered by
        one fresh read: the same replicas (only something else changed: the status, say) are written at its
        version; others mean the decision is stale, and nothing is written (None): the next poll decides from
        the new size."""
        if expected is None:
            return self._apply_replicas(namespace, name, replicas, None)
        deployment = self.deployment(namespace, name)
        for fresh in (False, True):
            if deployment is None or replicas_of(deployment) != expected:
                return None  # gone (the repair recreates it), or the replicas moved: not this decision's to write
            version = (deployment.get("metadata") or {}).get("resourceVersion")
            if version:
                try:
                    return self._apply_replicas(namespace, name, replicas, str(version))
                except ApiException as error:
                    if error.status != 409:
                        raise
                    if fresh:
                        return None  # it moved again between the fresh read and the write
            deployment = self._read(self.apps.read_namespaced_deployment, namespace, name)
            if self.cache is not None:
                if deployment is None:
                    self.cache.drop("Deployment", namespace, name)
                else:
                    self.cache.put("Deployment", deployment)
        return None

    def _apply_replicas(self, namespace: str, name: str, replicas: int, version: str | None) -> str:
        """The scaler's apply of ``spec.replicas``; with ``version``, only onto that resourceVersion. A refusal
        is raised as the API server's error, never as ``ApplyRefused``: what it refuses is the Deployment as it
        stands (an admission policy, a Deployment nobody can update), not a spec field, and the next poll
        tries again."""
        metadata = {"name": name, "namespace": namespace}
        if version is not None:
            metadata["resourceVersion"] = version  # a precondition, as in any update
        return self._server_side_apply(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": {"replicas": replicas}},
            SCALE_FIELD_MANAGER,
        )

    def ensure_secret(self, desired: dict[str, Any], key: str) -> str:
        """Create the Secret if missing (never rotate it here); return the value under ``key``."""
        name, namespace = desired["metadata"]["name"], desired["metadata"]["namespace"]
        try:
            secret = self._secret(namespace, name)
        except ApiException as error:
            if error.status != 404:
                raise
            # The stub names the model type; validate_call also takes the manifest dict and validates it into one.
            self.core.create_namespaced_secret(namespace, desired, field_manager=FIELD_MANAGER)  # type: ignore[arg-type]
            return desired["stringData"][key]
        return _secret_value(secret, namespace, name, key)

    def read_secret(self, namespace: str, name: str) -> dict[str, str]:
        """Every key of a Secret, decoded (values are secrets: never log or report them)."""
        secret = self._secret(namespace, name)
        # decode_properties never fails: UTF-8, else ISO-8859-1 (Java's encoding of properties files)
        data = {key: decode_properties(base64.b64decode(value)) for key, value in (secret.data or {}).items()}
        return {**data, **(secret.string_data or {})}

    def read_secret_key(self, namespace: str, name: str, key: str) -> str:
        return _secret_value(self._secret(namespace, name), namespace, name, key)

    def forget_secret(self, namespace: str, name: str) -> None:
        """Drop a Secret's kept read (its resource was deleted: a new one of the same name gets a new Secret)."""
        self._secrets.pop((namespace, name), None)

    def _secret(self, namespace: str, name: str) -> Any:
        """A Secret as read at most ``secret_seconds`` ago (Secrets are not watched: that would need the
        right to list every Secret of the cluster). A missing one is asked again every time."""
        now = self._monotonic()
        kept = self._secrets.get((namespace, name))
        if kept is not None and now - kept[0] < self.secret_seconds:
            return kept[1]
        secret = self.core.read_namespaced_secret(name, namespace)
        self._secrets[(namespace, name)] = (now, secret)
        return secret

    def create_job(self, desired: dict[str, Any], identity_annotation: str) -> None:
        """Create a Job. One that already exists is accepted only if ``identity_annotation`` matches (a
        retried reconcile); otherwise ``JobConflict``: another Job has the name, its outcome is not ours."""
        namespace, name = desired["metadata"]["namespace"], desired["metadata"]["name"]
        try:
            # The stub names the model type; validate_call also takes the manifest dict and validates it into one.
            self.batch.create_namespaced_job(namespace, desired, field_manager=FIELD_MANAGER)  # type: ignore[arg-type]
        except ApiException as error:
            if error.status != 409:
                raise
            existing = self.job(namespace, name) or {}
            theirs = ((existing.get("metadata") or {}).get("annotations") or {}).get(identity_annotation)
            if theirs != desired["metadata"]["annotations"][identity_annotation]:
                raise JobConflict(f"Job {namespace}/{name} already exists and belongs to another hand-over") from None
            return
        log.info("created Job %s/%s", namespace, name)

    def autoscalers_of(self, namespace: str, deployment: str, max_age: float = AUTOSCALERS_SECONDS) -> list[str]:
        """The HorizontalPodAutoscalers that scale Deployment ``deployment`` (KEDA's ScaledObjects work
        through one each): their names. A cluster without the autoscaling/v2 API has none. The namespace's
        list is shared by its resources and reused while younger than ``max_age`` seconds (0: listed now).
        Lists too old for any poll to reuse are forgotten whenever one is made, so the memory is bounded by
        the namespaces in conflict, not by every namespace that ever was."""
        now = self._monotonic()
        kept = self._autoscalers.get(namespace)
        if kept is None or max_age <= 0 or now - kept[0] >= max_age:
            kept = (now, self._list_autoscalers(namespace))
            self._autoscalers = {
                other: listed for other, listed in self._autoscalers.items() if now - listed[0] < AUTOSCALERS_SECONDS
            }
            self._autoscalers[namespace] = kept
        return sorted(name for name, kind, target in kept[1] if kind == "Deployment" and target == deployment)

    def _list_autoscalers(self, namespace: str) -> list[tuple[str, str, str]]:
        """A namespace's HPAs as (name, target kind, target name), listed from the API server."""
        try:
            listed = self.autoscaling.list_namespaced_horizontal_pod_autoscaler(namespace).items
        except ApiException as error:
            if error.status == 404:
                return []
            raise
        found = []
        for hpa in listed:
            target = hpa.spec.scale_target_ref if hpa.spec is not None else None
            if target is not None:
                found.append((str(hpa.metadata.name) if hpa.metadata is not None else "?", target.kind, target.name))
        return found

    def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Job as a plain dict (``None`` when it does not exist)."""
        return self._read(self.batch.read_namespaced_job, namespace, name)

    def deployment_pods_reported(self, namespace: str, name: str) -> int:
        """``status.replicas`` of a Deployment: pods its ReplicaSets still have (0 when absent)."""
        deployment = self.deployment(namespace, name)
        return int(((deployment or {}).get("status") or {}).get("replicas") or 0)

    def pod_count(self, namespace: str, selector: dict[str, str]) -> int:
        """Pods matching ``selector`` that still exist in any phase (terminating ones included).

        Always a list from the API server, never the watched cache: the hand-over's safety waits use it
        (consumer pods gone before a catch-up Job starts; the Job's driver and Spark executors gone before
        the consumer pods resume), and the cache watches only the consumer pods, which a stale view must not
        declare gone. It runs only during a hand-over, a list or two per poll."""
        return sum(
            1
            for pod in self._listed_pods(namespace, selector)
            if pod.status is None or pod.status.phase not in ("Succeeded", "Failed")
        )

    def pods(self, namespace: str, selector: dict[str, str]) -> list[dict[str, Any]]:
        """Pods matching ``selector`` as plain dicts, whole and listed from the API (never the cache, which
        watches only the consumer pods and keeps little of them): an image pre-flight's pod, for why it waits
        (``ImagePullBackOff``) or how it exited; the consumer pods during a cut-over, whose end depends on
        their environment and on the terminating ones (``builders.cut_over_done``)."""
        return [self.client.sanitize_for_serialization(pod) for pod in self._listed_pods(namespace, selector)]

    def _listed_pods(self, namespace: str, selector: dict[str, str]) -> list[V1Pod]:
        """Pods matching ``selector``, listed from the API server (never the cache), each checked against it."""
        listed = self.core.list_namespaced_pod(namespace, label_selector=_label_selector(selector)).items
        return [
            pod
            for pod in listed
            if all((_pod_metadata(pod).labels or {}).get(key) == value for key, value in selector.items())
        ]

    def ready_pod_ips(self, namespace: str, selector: dict[str, str]) -> list[str]:
        """IPs of ready pods matching ``selector``, from the cache or else the API."""
        if self.cache is not None:
            self._verify_cache(POD, namespace)
        cached = self.cache.pods(namespace, selector) if self.cache is not None else None
        if cached is not None:
            return ready_addresses(cached, selector)
        listed = self.core.list_namespaced_pod(namespace, label_selector=_label_selector(selector)).items
        pods = [self.client.sanitize_for_serialization(pod) for pod in listed]
        if self.cache is not None:
            self.cache.listed_pods(namespace, selector, pods)
        return ready_addresses(pods, selector)

    def deployment_rolled_out(self, namespace: str, name: str) -> bool:
        """``rolled_out`` of the live Deployment (False when it is missing)."""
        return rolled_out(self.deployment(namespace, name))
