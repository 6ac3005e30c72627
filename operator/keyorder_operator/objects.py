"""The objects an OrderedConsumer owns, applied in one place: at create and update, and on every poll.

Server-side apply of each (fields owned by the operator's field manager), so the spec handlers and
the poll's self-repair run the same code: a deleted or edited object comes back within one poll. A
deleted admin Secret comes back with a new token, which the pods re-read from their mounted file (it
is never rotated otherwise: ``Kube.ensure_secret``).

The consumer pods' NetworkPolicy is one of them when the chart turns it on (``builders.NETWORK_POLICY_VARIABLE``);
turned off, the one made before is deleted.

The poll does not write what nobody changed: ``AppliedObjects`` remembers, per object, what was last
applied and the resourceVersion the API server gave it. An object still at that version, whose
desired state is the same, needs only a read; any other change (an edit, a deletion, a new spec, a
status update) gets the apply again. A restarted operator remembers nothing and applies everything
once.

An object the API server refuses (``kube.ApplyRefused``) is remembered too, and skipped by the polls'
repair until ``refusals.REFUSED_RETRY_SECONDS`` have passed (the refusal may come from outside the spec and
go away: an admission policy); the other objects are applied all the same, and the poll goes on with what
exists.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from keyorder_operator.builders import (
    ADMIN_TOKEN_KEY,
    NetworkPolicySettings,
    build_admin_secret,
    build_deployment,
    build_network_policy,
    build_pdb,
    build_service,
    build_service_account,
    cutting_over,
    network_policy_settings,
    selector_labels,
    update_strategy,
)
from keyorder_operator.kube import ApplyRefused, Kube, replicas_of, replicas_to_hand_over
from keyorder_operator.refusals import REFUSED_RETRY_SECONDS, RefusedApply
from keyorder_operator.spec import OrderedConsumerSpec

log = logging.getLogger(__name__)

ObjectKey = tuple[str, str, str]
"""(namespace, owning resource's name, kind): a resource owns one object of each kind."""


class AppliedObjects:
    """What the operator last applied per owned object: (fingerprint of the desired object, the
    resourceVersion the apply returned); and the objects the API server refused (``RefusedApply``), which
    the polls' repair sends again only every ``refused_retry_seconds``. Shared by kopf's handler threads,
    hence the lock."""

    def __init__(
        self,
        refused_retry_seconds: float = REFUSED_RETRY_SECONDS,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.refused_retry_seconds = refused_retry_seconds
        """A refused object is applied again after this long (``refusals.REFUSED_RETRY_SECONDS``)."""
        self._monotonic = monotonic
        self._applied: dict[ObjectKey, tuple[str, str]] = {}
        self._refused: dict[ObjectKey, RefusedApply] = {}
        self._retried: dict[tuple[str, str], float] = {}
        """(namespace, resource's name) -> when its refused objects were last sent again (``retry_due``)."""
        self._lock = threading.Lock()

    def unchanged(self, key: ObjectKey, fingerprint: str, live_version: str | None) -> bool:
        """True when the live object is the one last applied with this very desired state."""
        with self._lock:
            return live_version is not None and self._applied.get(key) == (fingerprint, live_version)

    def record(self, key: ObjectKey, fingerprint: str, version: str) -> None:
        """The object was applied: it is no longer refused."""
        with self._lock:
            self._applied[key] = (fingerprint, version)
            self._refused.pop(key, None)

    def record_refusal(self, key: ObjectKey, fingerprint: str, refused: ApplyRefused) -> None:
        with self._lock:
            self._refused[key] = RefusedApply(fingerprint, refused.refusal, str(refused), self._monotonic())

    def held_back(self, key: ObjectKey, fingerprint: str) -> bool:
        """This very object was refused less than ``refused_retry_seconds`` ago: not worth sending yet."""
        with self._lock:
            refused = self._refused.get(key)
            return refused is not None and refused.holds(fingerprint, self._monotonic(), self.refused_retry_seconds)

    def refusals(self, namespace: str, name: str) -> list[RefusedApply]:
        """The resource's objects refused at their last apply, in the order they are applied."""
        with self._lock:
            return [refused for key, refused in self._refused.items() if key[:2] == (namespace, name)]

    def retry_due(self, namespace: str, name: str) -> bool:
        """Whether to send the resource's refused objects again now: no refusal of them and no such retry
        younger than ``refused_retry_seconds`` (nothing remembered, after a restart, is due at once). A True
        answer counts as the retry, so a retry that fails for another reason waits its period too."""
        now = self._monotonic()
        with self._lock:
            times = [refused.at for key, refused in self._refused.items() if key[:2] == (namespace, name)]
            times.append(self._retried.get((namespace, name), -math.inf))
            if any(now - at < self.refused_retry_seconds for at in times):
                return False
            self._retried[(namespace, name)] = now
            return True

    def forget_object(self, key: ObjectKey) -> None:
        """Drop one object (deleted on purpose): applied again later, it is sent whatever its version."""
        with self._lock:
            self._applied.pop(key, None)
            self._refused.pop(key, None)

    def forget(self, namespace: str, name: str) -> None:
        """Drop a deleted resource's objects (their names may be reused by a new resource)."""
        with self._lock:
            for key in [key for key in self._applied if key[:2] == (namespace, name)]:
                del self._applied[key]
            for key in [key for key in self._refused if key[:2] == (namespace, name)]:
                del self._refused[key]
            self._retried.pop((namespace, name), None)


def fingerprint(desired: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(desired, sort_keys=True, default=str).encode()).hexdigest()


def apply_owned_objects(
    kube: Kube,
    spec: OrderedConsumerSpec,
    meta: Any,
    status: Any,
    applied: AppliedObjects,
    always: bool,
    network: NetworkPolicySettings | Literal["environment"] | None = "environment",
) -> list[str]:
    """Apply the admin Secret, ServiceAccount, Deployment, metrics Service, PodDisruptionBudget and, with
    ``network`` settings, the pods' NetworkPolicy: all of them when ``always`` (a new or changed spec), else
    only those changed since the last apply. Returns the kinds that had to be created because they were missing.

    ``network``: the NetworkPolicy's settings (``builders.build_network_policy``), by default read from the
    operator's environment on each call (``builders.NETWORK_POLICY_VARIABLE``, set by the chart). ``None``: no
    policy, and one the operator made before (the switch turned off) is deleted.

    One owner per field: the Deployment's ``spec.replicas`` belong to the scaler's field manager
    alone. A new (or deleted) Deployment is created with the size last decided (``status.replicas``,
    else the minimum), which the scaler then applies too; every later apply of the object leaves
    replicas out, so the object's manager never writes a stale size over the scaler's, and a
    Deployment from an older release (replicas owned by the object's manager) has them handed to the
    scaler first, at their current value, only while they still have the value read (``Kube.scale``
    with ``expected``); if they moved meanwhile, the Deployment waits for the next call. Replicas
    somebody else owns (an HPA's or ``kubectl scale``'s update took them) are never taken back here:
    the poll decides whether to scale (``poll.Poll.other_autoscaler``). Its update strategy is a
    cut-over while the pods move between an eager and a cooperative assignment strategy
    (``update_strategy``); during one, the group's pods are listed from the API server on every call
    (terminating ones too, which the Deployment's counts leave out): the cut-over ends only when none
    of the old kind is left.

    An object the API server refuses (``kube.ApplyRefused``) is remembered in ``applied`` and the others
    are applied all the same; then the first refusal is raised. Unless ``always``, an object refused as it
    is now less than ``applied.refused_retry_seconds`` ago is skipped (not sent, not raised again).
    """
    namespace, name = meta["namespace"], meta["name"]
    owner = {"metadata": {"name": name, "namespace": namespace, "uid": meta["uid"]}}
    settings = network_policy_settings(os.environ) if network == "environment" else network
    kube.ensure_secret(build_admin_secret(owner, secrets.token_urlsafe(32)), ADMIN_TOKEN_KEY)
    live_deployment = kube.deployment(namespace, name)
    live_replicas = replicas_of(live_deployment)
    pods = kube.pods(namespace, selector_labels(name)) if cutting_over(live_deployment) else None
    creating = live_deployment is None
    if creating:
        decided = (status or {}).get("replicas")
        replicas: int | None = (
            decided
            if isinstance(decided, int)
            else (max(spec.replicas.min, 1) if spec.scaling.enabled or spec.replicas.min else 1)
        )
    else:
        replicas = None
    held = False
    if replicas_to_hand_over(live_deployment) and live_replicas is not None:  # an older release's Deployment
        held = kube.scale(namespace, name, live_replicas, expected=live_replicas) is None
        if held:
            log.info(
                "%s/%s: the replicas moved while being handed to the scaler; the Deployment waits", namespace, name
            )
    missing = []
    refused: list[ApplyRefused] = []
    for desired in (
        build_service_account(owner),
        build_deployment(spec, owner, replicas, update_strategy(spec, live_deployment, pods)),
        build_service(spec, owner),
        build_pdb(owner),
        *([build_network_policy(spec, owner, settings)] if settings is not None else []),
    ):
        kind, object_name = desired["kind"], desired["metadata"]["name"]
        key, wanted = (namespace, name, kind), fingerprint(desired)
        if kind == "Deployment" and held:
            continue  # applied without replicas it could remove them: not before the scaler holds them
        if not always:
            if applied.held_back(key, wanted):
                continue  # refused as it is, a moment ago: sent again once the retry period has passed
            live_version = kube.resource_version(kind, namespace, object_name)
            if applied.unchanged(key, wanted, live_version):
                continue
            if live_version is None:
                missing.append(kind)
        try:
            version = kube.apply(desired)
        except ApplyRefused as error:  # the other objects do not depend on this one: they are applied still
            applied.record_refusal(key, wanted, error)
            refused.append(error)
            continue
        if kind == "Deployment" and replicas is not None:  # the scaler owns them from the start
            version = kube.scale(namespace, name, replicas, expected=replicas) or version
        applied.record(key, wanted, version)
    if settings is None and kube.network_policy_present(namespace, name):
        if kube.delete_network_policy(namespace, name, meta["uid"]):
            log.info("%s/%s: deleted the pods' NetworkPolicy (networkPolicy.consumerPods is off)", namespace, name)
        applied.forget_object((namespace, name, "NetworkPolicy"))
    if refused:
        raise refused[0]
    return missing
