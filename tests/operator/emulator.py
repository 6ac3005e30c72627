"""A FAKE Kubernetes API server for the tests: kmock's in-memory emulator, made strict where the real one is.

It is not a Kubernetes API server and runs none of its controllers but the garbage collector. Plain
``kmock.KubernetesEmulator`` stores whatever it is sent; this subclass does what the real API server does
to a request, where the operator depends on it:

* **Metadata and concurrency**: ``uid``, ``resourceVersion`` (one counter, as etcd's), ``generation``
  (bumped when anything but ``metadata`` and ``status`` changes), ``creationTimestamp``, ``generateName``;
  409 on a stale ``resourceVersion``; 422 for a failed JSON-patch ``test``; a write that changes nothing
  is a no-op (no new version, no watch event).
* **Custom resources are validated** (``register_crd``, ``crd_validation``): the version's
  ``openAPIV3Schema`` and every ``x-kubernetes-validations`` rule (cel-python), on create, update, patch
  and apply; unknown fields pruned (refused with ``?fieldValidation=Strict``, with 400), ``default``s
  stored; a refusal is a 422 ``Invalid`` naming the field (``spec.x: Invalid value: ...``).
* **CustomResourceDefinitions** (``crd_creation``): a CRD written through the API is checked as the server
  checks it (structural schema, list-map keys, CEL rules that compile, every ``default`` as written against
  its node's schema and rules) and refused with a 422 naming the field; an accepted one is served at once.
* **A Deployment's pod-template labels are validated** as the API server's own Go validation checks them
  (``builtin_validation``): a bad key or value is a 422 ``Invalid`` at ``spec.template.labels``. The rest
  of the built-in kinds' validation is not imitated.
* **Validating admission policies** (``admission_policy``, ``admission_policies``): a test's policy refuses the
  writes of a resource its rule denies, after the kind's own validation, as the API server's
  ValidatingAdmissionPolicy answers (422 ``Invalid`` by default, the policy and binding named).
* **The status subresource**: for a resource that has one, a write to the object ignores ``status`` and a
  write to ``.../status`` ignores everything else (metadata too), for POST, PUT and every PATCH
  (merge, JSON, strategic merge, apply).
* **Deletion**: an object with finalizers gets ``deletionTimestamp`` (a MODIFIED event) and stays until
  its finalizers are gone; no finalizer can be added meanwhile; without finalizers it is removed at once.
  A pod is deleted gracefully: it gets ``deletionTimestamp`` and ``deletionGracePeriodSeconds`` and stays,
  terminating, until its kubelet deletes it again with period 0 (the stand-in kubelet, ``kubelet``); a pod
  no node runs (no ``spec.nodeName``) or that finished is removed at once (``pod_grace_period``).
* **Garbage collection** (background propagation): when an object is removed, every object whose
  ``ownerReferences`` name its uid is deleted too, honouring their own finalizers, and so on down; one
  that still has another live owner only loses the dangling reference. ``propagationPolicy=Orphan``
  removes the references instead. Done at once, in the deleting request (the real collector runs a
  moment later); foreground propagation is treated as background.
* **Watches** deliver ADDED, MODIFIED and DELETED (with the object's last state, under a new
  ``resourceVersion``), and honour ``?resourceVersion=N``; lists and watches honour ``labelSelector``, lists
  ``limit`` and ``continue`` (pages in key order, the later ones from the current state, not a snapshot). A test
  can expire the watch history (``expire_watches``, ``watches_interrupted``): a watch from an older version
  is then answered with an ERROR event, a Status 410 Gone, and the client must list again; what was deleted
  meanwhile sends no DELETED.
* **Server-side apply** (``server_side_apply``): field ownership, 409 conflicts, ``force``,
  ``managedFields``; strategic merge patches with their list semantics. An applied configuration whose
  keyed list repeats a key (a container's env by name...) is refused with the API server's 500 ("failed to
  create typed patch object ...: duplicate entries for key [name=\"A\"]").
* **Ownership taken by updates**: every create, update and patch that is not an apply gives its field
  manager (``?fieldManager=``, else the User-Agent up to its first ``/``) the fields it added or changed, as a
  ``managedFields`` entry with ``operation: Update`` (and ``subresource`` for ``.../status`` and
  ``.../scale``), and takes them from every other manager, appliers included; a later apply that changes
  them without ``force`` is then a 409 conflict naming that manager, and a forced one takes them back.
* **The scale subresource** (``.../scale``) of Deployments and of custom resources whose CRD declares one
  (``subresources.scale``): GET, PUT and PATCH (merge, JSON, strategic) of an ``autoscaling/v1`` Scale,
  its ``resourceVersion`` a precondition; the write is validated as a write of the object. A Deployment's
  scale writer owns ``spec.replicas`` afterwards (an Update entry with ``subresource: scale`` and no
  time); a custom resource's scale write leaves ``managedFields`` as they were, as the API server does.
  Not imitated: server-side apply to ``.../scale``.
* **A watch a moment behind** (``watch_lag``): a test may hold back each watch event of a resource, as a
  busy cluster delivers them to an informer some time after the write.
* **Authentication and RBAC** (``authorization``): a request with ``Authorization: Bearer <token>`` acts
  as the identity ``tokens`` maps the token to (an unknown token: 401), and is authorised by
  ``authorizer`` (403 ``Forbidden`` worded as the API server words it, recorded in ``refused``); a request
  without a token is the test's own, and is allowed everything.
* **A resource nobody serves** (no CRD registered for it): a read or write of it is a 404 that names no
  object, unlike the 404 of a missing object of a served resource (``register_peering_crds`` serves kopf's
  peering resources from the chart's CRDs).

Lookups go by (resource, namespace, name) and a per-resource index, never by scanning every object.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import dataclasses
import datetime
import gzip
import importlib.resources
import json
import logging
import random
import re
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import dicts  # the very merge/JSON-patch logic kmock applies

from tests.operator import admission_policy, authorization, builtin_validation, crd_creation, server_side_apply
from tests.operator.crd_validation import CustomResourceSchema, Invalid, UnknownFields

_WRITES = {kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # as Kubernetes' generateName suffixes
_CLOSE = object()  # put into the buses to end the watch streams
_TERMINATE = object()  # put into the buses to end the open watch streams (``expire_watches``); later ones go on
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
CRD_VERBS = frozenset({"list", "watch", "get", "create", "patch", "update", "delete"})
CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "orderedconsumers.keyorder.dev.yaml"
CRD_RESOURCE = kmock.resource("apiextensions.k8s.io/v1/customresourcedefinitions")
_SERVER_SET = ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "generation")

ObjectKey = tuple[Any, str | None, str]
logger = logging.getLogger(__name__)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _time(moment: datetime.datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> datetime.datetime:
    return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


DEFAULT_TERMINATION_GRACE_SECONDS = 30
"""A pod's ``spec.terminationGracePeriodSeconds`` when it sets none (kubernetes/kubernetes
``pkg/apis/core/v1/defaults.go``, ``SetDefaults_PodSpec``: the emulator does not default built-in kinds, so
the deletion reads it as the defaulted value)."""


def pod_grace_period(pod: Mapping[str, Any], requested: int | None) -> int:
    """The grace period of a pod's first deletion (kubernetes/kubernetes ``pkg/registry/core/pod/strategy.go``,
    ``CheckGracefulDelete``): the one asked for, else the pod's ``terminationGracePeriodSeconds``; 0 for a pod
    no node runs (no ``spec.nodeName``) or one that finished (phase ``Succeeded`` or ``Failed``); at least 1
    when negative."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    period = requested if requested is not None else spec.get("terminationGracePeriodSeconds")
    if period is None:
        period = DEFAULT_TERMINATION_GRACE_SECONDS
    if not spec.get("nodeName") or status.get("phase") in ("Succeeded", "Failed"):
        period = 0
    return 1 if period < 0 else int(period)


def _requested_grace(request: kmock.Request) -> int | None:
    """``gracePeriodSeconds`` of a DELETE: from its body (DeleteOptions) when it has one, else from the query
    (kubernetes/apiserver ``pkg/endpoints/handlers/delete.go``, ``DeleteResource``); negative means 1
    (``BeforeDelete``)."""
    if isinstance(request.data, dict) and request.data:
        value = request.data.get("gracePeriodSeconds")
    else:
        value = request.params.get("gracePeriodSeconds")
    if value is None:
        return None
    try:
        period = int(value)
    except (TypeError, ValueError):
        raise kmock.KubernetesError(
            400, "BadRequest", f"gracePeriodSeconds: invalid value {value!r}: must be an integer", {}
        ) from None
    return 1 if period < 0 else period


def _qualified(resource: Any) -> str:
    return f"{resource.plural}.{resource.group}" if resource.group else str(resource.plural)


def _not_found(resource: Any, name: str | None) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        404,
        "NotFound",
        f'{_qualified(resource)} "{name}" not found',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def _conflict(resource: Any, name: str | None, why: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(resource)} "{name}": {why}',
        {"name": name, "group": resource.group, "kind": resource.plural},
    )


def _invalid(resource: Any, kind: str, name: str | None, causes: list[tuple[str, str]]) -> kmock.KubernetesError:
    """A 422 Invalid; ``causes``: ``(field, message)``."""
    listed = causes[0][1] if len(causes) == 1 else "[" + ", ".join(message for _, message in causes) + "]"
    subject = f'{kind}.{resource.group} "{name}"' if resource.group else f'{kind} "{name}"'
    return kmock.KubernetesError(
        422,
        "Invalid",
        f"{subject} is invalid: {listed}",
        {
            "name": name,
            "group": resource.group,
            "kind": kind,
            "causes": [{"reason": "FieldValueInvalid", "field": path, "message": msg} for path, msg in causes],
        },
    )


def _owner_uids(raw: Mapping[str, Any]) -> set[str]:
    return {
        str(ref["uid"])
        for ref in (raw.get("metadata") or {}).get("ownerReferences") or []
        if isinstance(ref, dict) and ref.get("uid")
    }


_SELECTOR_TERM = re.compile(r"\s*(!?)([\w./-]+)\s*(?:(==|=|!=)\s*([\w./-]*)|\s+(in|notin)\s*\(([^)]*)\))?\s*$")


def label_selector(text: str) -> Callable[[Mapping[str, Any]], bool]:
    """A ``labelSelector`` (``a=b,c!=d,e in (x,y),f notin (z),g,!h``) as a predicate on an object."""
    terms = []
    for part in re.split(r",(?![^(]*\))", text or ""):
        if not part.strip():
            continue
        match = _SELECTOR_TERM.match(part)
        if not match:
            raise kmock.KubernetesError(400, "BadRequest", f"unable to parse requirement: {part!r}")
        negated, key, operator, value, set_operator, values = match.groups()
        terms.append((negated, key, operator, value, set_operator, {v.strip() for v in (values or "").split(",")}))

    def matches(raw: Mapping[str, Any]) -> bool:
        labels = (raw.get("metadata") or {}).get("labels") or {}
        for negated, key, operator, value, set_operator, values in terms:
            if operator in ("=", "=="):
                ok = labels.get(key) == value
            elif operator == "!=":
                ok = labels.get(key) != value
            elif set_operator == "in":
                ok = labels.get(key) in values
            elif set_operator == "notin":
                ok = labels.get(key) not in values
            else:
                ok = (key in labels) != bool(negated)
            if not ok:
                return False
        return True

    return matches


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """A FAKE API server: kmock's emulator with the real API server's strictness (see the module docstring)."""

    revision: int = attrs.field(default=0, init=False)  # the last resourceVersion handed out (one counter, as etcd)
    committed: int = attrs.field(default=0, init=False)  # the last one whose write completed (lists report it)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    applied: dict[ObjectKey, dict[server_side_apply.Manager, dict[str, Any]]] = attrs.field(factory=dict, init=False)
    """(resource, namespace, name) -> applier -> what that manager last server-side applied."""
    owned: dict[ObjectKey, dict[server_side_apply.Manager, set[Any]]] = attrs.field(factory=dict, init=False)
    """(resource, namespace, name) -> field manager (appliers and updaters) -> the fields it owns
    (``server_side_apply.field_paths``)."""
    watch_lag: dict[Any, float] = attrs.field(factory=dict)
    """Resource -> seconds each of its watch events is held back before it is sent (events queue behind each
    other): the operator's informer a moment behind the API server, as in a busy cluster. Empty: none."""
    admission_policies: list[admission_policy.ValidatingAdmissionPolicy] = attrs.field(factory=list)
    """The cluster's ValidatingAdmissionPolicies (``admission_policy``), in order; a test adds and removes them
    (through ``call_in_loop``)."""
    schemas: dict[Any, CustomResourceSchema] = attrs.field(factory=dict, init=False)
    """Custom resources' schemas (``register_crd``): their objects are validated and defaulted."""
    tokens: dict[str, authorization.Identity] = attrs.field(factory=dict)
    """Bearer token -> who presents it. A request without a token is the test's own (allowed everything)."""
    authorizer: authorization.Authorizer | None = None
    """RBAC for the requests with a token (None: they are allowed everything too)."""
    enforce_rbac: bool = True
    """False: what RBAC refuses is only recorded in ``refused`` and then allowed (an audit: every request a
    chart's rules lack, in one run, instead of the first refusal stopping the operator)."""
    refused: list[dict[str, Any]] = attrs.field(factory=list, init=False)
    """Every request RBAC refused: method, path, verb, resource, namespace, name, user, message."""
    warnings: list[str] = attrs.field(factory=list, init=False)
    """The API warnings sent (unknown fields pruned from a custom resource)."""
    _closing: bool = attrs.field(default=False, init=False)
    expired_through: int = attrs.field(default=0, init=False)
    """A watch from a resourceVersion at or below this one is answered 410 Gone (``expire_watches``)."""
    _watches_connect: asyncio.Event = attrs.field(factory=lambda: _set(asyncio.Event()), init=False)
    """Cleared while ``watches_interrupted``: a new watch request gets no answer until it is set again."""
    _index: dict[Any, dict[tuple[str | None, str], None]] = attrs.field(factory=dict, init=False)
    _created: dict[ObjectKey, int] = attrs.field(factory=dict, init=False)
    _uids: dict[str, ObjectKey] = attrs.field(factory=dict, init=False)
    _dependents: dict[str, set[ObjectKey]] = attrs.field(factory=dict, init=False)

    async def close_watches(self) -> None:
        """End every watch stream, now and later: aiohttp's shutdown would otherwise wait for them (60 s)."""
        self._closing = True
        self._watches_connect.set()
        for bus in list(self._buses.values()):
            await bus.put(_CLOSE)

    async def expire_watches(self) -> None:
        """The watch cache lost its history, as kube-apiserver's does when it re-initialises from etcd or its
        event window moves on (kubernetes/apiserver ``pkg/storage/cacher``): every open watch ends without an
        event (``Cacher.terminateAllWatchers``), and a watch from any resourceVersion handed out so far is
        answered with one ERROR event, a Status 410 ``Expired`` "too old resource version"
        (``watchCacheHistory.GetIntervalLocked``, ``newErrWatcher``), so the client lists again. The revision
        moves on by one (a write elsewhere in the cluster), so the new list's version can be watched from."""
        async with self._write_lock:
            self.expired_through = self.revision
            self._next_revision()
            self.committed = self.revision
        for bus in list(self._buses.values()):
            await bus.put(_TERMINATE)

    @contextlib.asynccontextmanager
    async def watches_interrupted(self) -> AsyncIterator[None]:
        """Inside: the clients' watch connections are down (open watches end, a new watch request waits
        unanswered), while writes go on; what changes meanwhile reaches no watch. On leaving, the history is
        expired (``expire_watches``): the waiting watches are answered 410 Gone and the clients list again, so
        an object deleted inside sends no DELETED to anyone."""
        self._watches_connect.clear()
        try:
            for bus in list(self._buses.values()):
                await bus.put(_TERMINATE)
            yield
        finally:
            await self.expire_watches()
            self._watches_connect.set()

    def field_managers(self, resource: Any, namespace: str | None, name: str) -> list[str]:
        """The field managers that have server-side applied the object."""
        return sorted({manager.name for manager in self.applied.get((kmock.resource(resource), namespace, name), {})})

    # ------------------------------------------------------------ routing

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        """kmock logs every request and routes each one by scanning that log once per reaction, which grew
        to seconds per request in long tests; the tests assert on objects, never on the request log, so a
        request leaves the log once answered (the log holds only the requests in flight)."""
        try:
            return await self._handle_logged(request)
        finally:
            with contextlib.suppress(ValueError):
                self._requests.remove(request)

    async def _handle_logged(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        identity = self._authenticate(request)
        if identity is not None:
            self._authorize(request, identity)
        is_write = request.resource is not None and (
            request.action in _WRITES or (request.method == kmock.method.PUT and request.name is not None)
        )
        if not is_write:
            return await super()._handle(request)  # reads: kmock's routing, to the _serve_* below
        if request.resource not in self.resources:
            raise kmock.KubernetesError(404, "NotFound", "the server could not find the requested resource", {})
        async with self._write_lock:  # one write at a time: each is atomic, as etcd's transactions
            pruned: list[str] = []
            try:
                body, status = await self._write(request, identity, pruned)
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, ValueError) as exc:
                raise kmock.KubernetesError(422, "Invalid", f"{type(exc).__name__}: {exc}") from exc
            finally:
                self.committed = self.revision  # everything up to here is stored and on the buses
        headers = {}
        if pruned:
            warnings = [f'unknown field "{path}"' for path in pruned]
            self.warnings += warnings
            headers["Warning"] = ", ".join(
                '299 - "{}"'.format(warning.replace("\\", "\\\\").replace('"', '\\"')) for warning in warnings
            )
        return aiohttp.web.json_response(body, status=status, headers=headers)

    # ------------------------------------------------------------ authentication and authorization

    def _authenticate(self, request: kmock.Request) -> authorization.Identity | None:
        header = {key.lower(): value for key, value in request.headers.items()}.get("authorization", "")
        if not header:
            return None
        scheme, _, token = header.partition(" ")
        identity = self.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
        if identity is None:
            raise kmock.KubernetesError(401, "Unauthorized", "Unauthorized", {})
        return identity

    def _attributes(self, request: kmock.Request, verb: str | None = None) -> authorization.Attributes:
        resource = request.resource
        attributes = authorization.request_attributes(
            request.method.value,
            request.url.path,
            request.params,
            None if resource is None else resource.group,
            None if resource is None else resource.plural,
            request.namespace,
            request.name,
            request.subresource,
        )
        return attributes if verb is None else dataclasses.replace(attributes, verb=verb)

    def _authorize(self, request: kmock.Request, identity: authorization.Identity, verb: str | None = None) -> None:
        if self.authorizer is None:
            return
        attributes = self._attributes(request, verb)
        if self.authorizer.allows(identity, attributes):
            return
        message = authorization.forbidden_message(identity, attributes)
        self.refused.append(
            {
                "method": request.method.value,
                "path": request.url.path,
                "query": dict(request.params),
                "verb": attributes.verb,
                "group": attributes.api_group,
                "resource": attributes.resource + (f"/{attributes.subresource}" if attributes.subresource else ""),
                "namespace": attributes.namespace,
                "name": attributes.name,
                "user": identity.user,
                "message": message,
            }
        )
        logger.warning("RBAC refused %s %s: %s", request.method.value, request.url, message)
        if not self.enforce_rbac:
            return
        raise kmock.KubernetesError(
            403,
            "Forbidden",
            message,
            {"name": attributes.name, "group": attributes.api_group, "kind": attributes.resource},
        )

    # ------------------------------------------------------------ writes

    @staticmethod
    def _content_type(request: kmock.Request) -> str:
        content_type = {key.lower(): value for key, value in request.headers.items()}.get("content-type", "")
        return content_type.split(";")[0].strip()

    async def _write(
        self, request: kmock.Request, identity: authorization.Identity | None, pruned: list[str]
    ) -> tuple[Any, int]:
        strict = request.params.get("fieldValidation") == "Strict"
        if request.subresource == "scale" and request.action != kmock.action.DELETE:
            return await self._write_scale(request, pruned, strict)
        updater = self._updater(request)
        if request.method == kmock.method.PUT:
            return await self._update(request, request.data, pruned, strict, replace=True, manager=updater)
        if request.action == kmock.action.CREATE:
            return await self._create(request, request.data, pruned, strict, manager=updater)
        if request.action == kmock.action.DELETE:
            return await self._delete(request)
        if self._content_type(request) == APPLY_PATCH:
            if identity is not None and self._live(request.resource, request.namespace, request.name) is None:
                self._authorize(request, identity, "create")  # an apply that creates is authorised as a create
            refusal = self._typed_apply_refusal(request)
            if refusal is not None:
                return refusal, 500
            kind, body, commit = self._server_side_apply(request)
            result = (
                await self._create(request, body, pruned, strict)
                if kind == "create"
                else await self._update(request, body, pruned, strict, preview=True)
            )
            commit()  # the managers' fields, once the write is stored
            return result
        if self._content_type(request) == STRATEGIC_PATCH and isinstance(request.data, dict):
            live = self._live(request.resource, request.namespace, request.name)
            if live is None:
                raise _not_found(request.resource, request.name)
            merged = server_side_apply.strategic_merge(live.raw, request.data)
            return await self._update(request, merged, pruned, strict, preview=True, manager=updater)
        return await self._update(request, request.data, pruned, strict, manager=updater)

    def _updater(self, request: kmock.Request) -> server_side_apply.Manager:
        """The field manager of a create, update or patch: ``?fieldManager=``, else the User-Agent up to its
        first ``/`` (kubernetes/apiserver ``pkg/endpoints/handlers/create.go``, ``managerOrUserAgent``,
        ``prefixFromUserAgent``), else ``unknown`` (apimachinery ``internal/buildmanagerinfo.go``); keyed by
        the API version it writes and the subresource."""
        resource = request.resource
        user_agent = {key.lower(): value for key, value in request.headers.items()}.get("user-agent", "")
        name = request.params.get("fieldManager") or _user_agent_prefix(user_agent) or "unknown"
        api_version = f"{resource.group}/{resource.version}".lstrip("/")
        return server_side_apply.Manager(name, "Update", api_version, request.subresource or "")

    def _record_update(
        self, key: ObjectKey, before: dict[str, Any] | None, after: dict[str, Any], manager: server_side_apply.Manager
    ) -> None:
        """An update's ownership, written into ``after``'s ``managedFields``: ``manager`` takes the fields it added
        or changed from everyone (structured-merge-diff ``merge/update.go``, ``Updater.Update``), and its entry's
        time moves when it took any (apimachinery ``internal/managedfieldsupdater.go``); the other entries keep
        theirs. An entry written through a Deployment's ``.../scale`` has no time: the scale handler carries
        over the times of the parent's entries (apimachinery ``pkg/util/managedfields/scalehandler.go``,
        ``ToParent``), and the parent never has one under the Scale's API version."""
        taken, removed = server_side_apply.changed_fields(before, after)
        owners = server_side_apply.update_ownership(self.owned.get(key, {}), manager, taken, removed)
        times = _entry_times(before)
        if taken:
            times[manager] = None if manager.subresource == "scale" else _now()
        self.owned[key] = owners
        meta = after.setdefault("metadata", {})
        api_version = str(after.get("apiVersion") or f"{key[0].group}/{key[0].version}".lstrip("/"))
        entries = server_side_apply.managed_fields(owners, api_version, None, times)
        if entries:
            meta["managedFields"] = entries
        else:
            meta.pop("managedFields", None)

    def _schema(self, resource: Any) -> CustomResourceSchema | None:
        return self.schemas.get(resource)

    def _has_status_subresource(self, resource: Any) -> bool:
        return resource in self.resources and "status" in self.resources[resource].subresources

    def _kind(self, resource: Any) -> str:
        schema = self._schema(resource)
        if schema is not None:
            return schema.kind
        info = self.resources[resource] if resource in self.resources else None  # noqa: SIM401 (.get() adds it)
        return (info.kind if info is not None else None) or str(resource.plural).capitalize()

    def _admit(
        self,
        request: kmock.Request,
        obj: dict[str, Any],
        old: dict[str, Any] | None,
        pruned: list[str],
        strict: bool,
    ) -> dict[str, Any]:
        if request.resource == CRD_RESOURCE:  # a definition: the API server's creation checks (crd_creation)
            try:
                crd_creation.check_crd(obj)
            except Invalid as invalid:
                name = (obj.get("metadata") or {}).get("name")
                causes = [(error.path, str(error)) for error in invalid.errors]
                raise _invalid(request.resource, "CustomResourceDefinition", name, causes) from None
            return obj
        resource = request.resource
        validate = builtin_validation.VALIDATORS.get((resource.group, resource.version, resource.plural))
        if validate is not None and request.subresource is None:  # a built-in kind's own validation
            errors = validate(obj)
            if errors:
                name = (obj.get("metadata") or {}).get("name")
                causes = [(error.path, str(error)) for error in errors]
                raise _invalid(resource, self._kind(resource), name, causes)
        schema = self._schema(request.resource)
        if schema is None:
            return self._admission_policies(request, obj, old)
        try:
            admitted = schema.admit(obj, old, strict=strict, pruned=pruned)
        except UnknownFields as unknown:
            raise kmock.KubernetesError(
                400,
                "BadRequest",
                f"{schema.kind} in version {schema.version!r} cannot be handled as a {schema.kind}: {unknown}",
                {},
            ) from None
        except Invalid as invalid:
            name = (obj.get("metadata") or {}).get("name")
            causes = [(error.path, str(error)) for error in invalid.errors]
            raise _invalid(request.resource, schema.kind, name, causes) from None
        return self._admission_policies(request, admitted, old)

    def _admission_policies(
        self, request: kmock.Request, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Validating admission, after the kind's own validation (``admission_policy``): the first policy that
        matches the write and denies it refuses it."""
        for policy in self.admission_policies:
            if policy.matches(request.resource, request.subresource):
                policy.admit(request.resource, obj, old)
        return obj

    async def _create(
        self,
        request: kmock.Request,
        data: Any,
        pruned: list[str],
        strict: bool,
        status: int = 201,
        manager: server_side_apply.Manager | None = None,
    ) -> tuple[dict[str, Any], int]:
        """A POST (``manager``: who owns what it sets), or the object an apply creates (its fields already owned)."""
        resource = request.resource
        if not isinstance(data, dict):
            raise kmock.KubernetesError(400, "BadRequest", "the body must be a JSON object", {})
        body = copy.deepcopy(data)
        meta = body.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise kmock.KubernetesError(400, "BadRequest", "metadata must be an object", {})
        if request.namespace:
            if meta.get("namespace") not in (None, request.namespace):
                raise kmock.KubernetesError(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                    {},
                )
            meta["namespace"] = request.namespace
        namespace = meta.get("namespace")
        while not meta.get("name") and meta.get("generateName"):
            name = meta["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
            if self._live(resource, namespace, name) is None:
                meta["name"] = name
        if not meta.get("name"):
            raise _invalid(
                resource,
                self._kind(resource),
                "",
                [("metadata.name", "metadata.name: Required value: name or generateName is required")],
            )
        key: ObjectKey = (resource, namespace, meta["name"])
        if self._live(*key) is not None:
            raise kmock.KubernetesError(
                409,
                "AlreadyExists",
                f'{_qualified(resource)} "{meta["name"]}" already exists',
                {"name": meta["name"], "group": resource.group, "kind": resource.plural},
            )
        for field in (*_SERVER_SET, "resourceVersion"):
            meta.pop(field, None)
        if manager is not None:
            meta.pop("managedFields", None)  # a create's own fields are what its manager owns
        if self._has_status_subresource(resource):
            body.pop("status", None)  # the status is written only through .../status
        body = self._admit(request, body, None, pruned, strict)
        meta = body["metadata"]
        meta.update(
            uid=str(uuid.uuid4()), resourceVersion=self._next_revision(), generation=1, creationTimestamp=_now()
        )
        if manager is not None:
            self.owned.pop(key, None)
            self._record_update(key, None, body, manager)
        self.objects[key] = body
        if resource == CRD_RESOURCE:
            register_crd(self, body)  # created through the API: served from now on, as the server does
        self._index.setdefault(resource, {})[(namespace, meta["name"])] = None
        self._created[key] = int(meta["resourceVersion"])
        self._uids[meta["uid"]] = key
        self._track_owners(key, None, body)
        await self._buses[resource].put({"type": "ADDED", "object": body})  # stored objects are never mutated
        return body, status

    async def _update(
        self,
        request: kmock.Request,
        data: Any,
        pruned: list[str],
        strict: bool,
        replace: bool = False,
        preview: bool = False,
        manager: server_side_apply.Manager | None = None,
    ) -> tuple[dict[str, Any], int]:
        """A PUT (``replace``), a merge or JSON patch of ``data``, or (``preview``) the object as it should be;
        ``manager``: the updater who takes the fields it changes (None: an apply, which tracks its own, or a
        custom resource's scale write, which changes no owner)."""
        resource, name, subresource = request.resource, request.name, request.subresource
        key: ObjectKey = (resource, request.namespace, str(name))
        live = self._live(*key)
        has_status = self._has_status_subresource(resource)
        if (
            subresource not in (None, "status", "scale")
            or (subresource == "status" and not has_status)
            or (subresource == "scale" and self._scale_paths(resource) is None)
        ):
            raise kmock.KubernetesError(404, "NotFound", "the server could not find the requested resource", {})
        if live is None:
            raise _not_found(resource, name)
        current = copy.deepcopy(live.raw)
        if replace or preview:
            if not isinstance(data, dict):
                raise kmock.KubernetesError(400, "BadRequest", "the body must be a JSON object", {})
            wanted = copy.deepcopy(data)
        elif isinstance(data, dict | list):
            wanted = dicts.patch_dict(current, data)  # raises JsonPatchTestFailed etc. -> 422, nothing stored
        else:
            raise kmock.KubernetesError(400, "BadRequest", "the body must be a JSON object or a JSON-patch list", {})
        old_meta = current.setdefault("metadata", {})
        meta = wanted.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise kmock.KubernetesError(400, "BadRequest", "metadata must be an object", {})
        precondition = meta.get("resourceVersion")
        if replace and precondition is None and self._schema(resource) is not None:
            raise _invalid(
                resource,
                self._kind(resource),
                name,
                [
                    (
                        "metadata.resourceVersion",
                        "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                    )
                ],
            )
        if precondition is not None and str(precondition) != str(old_meta.get("resourceVersion")):
            raise _conflict(
                resource,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            )
        for field, url_value in (("name", name), ("namespace", request.namespace)):
            if meta.get(field) not in (None, url_value):
                raise kmock.KubernetesError(
                    400,
                    "BadRequest",
                    f"the {field} of the object ({meta.get(field)}) does not match the {field} on the URL "
                    f"({url_value})",
                    {},
                )
        if has_status and subresource == "status":  # only the status changes; metadata as it was
            final = copy.deepcopy(current)
            if "status" in wanted:
                final["status"] = wanted["status"]
            else:
                final.pop("status", None)
            if "managedFields" in meta:
                final["metadata"]["managedFields"] = meta["managedFields"]
        else:
            final = wanted
            if has_status:  # the object's writes leave the status as it was
                if "status" in current:
                    final["status"] = current["status"]
                else:
                    final.pop("status", None)
            for field in ("name", "namespace", *_SERVER_SET, "resourceVersion"):
                if field in old_meta:
                    meta[field] = old_meta[field]
                else:
                    meta.pop(field, None)
            added = set(meta.get("finalizers") or []) - set(old_meta.get("finalizers") or [])
            if old_meta.get("deletionTimestamp") and added:
                raise _invalid(
                    resource,
                    self._kind(resource),
                    name,
                    [
                        (
                            "metadata.finalizers",
                            "metadata.finalizers: Forbidden: no new finalizers can be added if "
                            f"the object is being deleted, found new finalizers {sorted(added)}",
                        )
                    ],
                )
        if manager is not None:  # an update's managedFields are the server's (a client's own are not taken)
            if "managedFields" in old_meta:
                final.setdefault("metadata", {})["managedFields"] = old_meta["managedFields"]
            else:
                final.setdefault("metadata", {}).pop("managedFields", None)
        final = self._admit(request, final, current, pruned, strict)
        if final == current:
            return current, 200  # a no-op: no new version, no event (as the API server)
        if manager is not None:
            self._record_update(key, current, final, manager)
        new_meta = final.setdefault("metadata", {})
        changed = {k for k in set(final) | set(current) if k not in ("metadata", "status")}
        if any(final.get(k) != current.get(k) for k in changed):
            new_meta["generation"] = int(old_meta.get("generation") or 0) + 1
        new_meta["resourceVersion"] = self._next_revision()
        self._store(key, live, final)
        if resource == CRD_RESOURCE:
            register_crd(self, final)
        self._track_owners(key, current, final)
        await self._buses[resource].put({"type": "MODIFIED", "object": final})
        if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
            await self._remove(key)  # the last finalizer went: the object goes
        return final, 200

    async def _delete(self, request: kmock.Request) -> tuple[dict[str, Any], int]:
        resource, name = request.resource, request.name
        key: ObjectKey = (resource, request.namespace, str(name))
        live = self._live(*key)
        if live is None:
            raise _not_found(resource, name)
        options = request.data if isinstance(request.data, dict) else {}
        current = copy.deepcopy(live.raw)
        meta = current.setdefault("metadata", {})
        for field, wanted in (options.get("preconditions") or {}).items():
            if field in ("uid", "resourceVersion") and str(wanted) != str(meta.get(field)):
                raise _conflict(
                    resource,
                    name,
                    f"Precondition failed: {field} in precondition: {wanted}, {field} in object "
                    f"meta: {meta.get(field)}",
                )
        policy = request.params.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        if policy == "Orphan" or options.get("orphanDependents") is True:
            await self._orphan_dependents(str(meta.get("uid")))
        if (resource.group, resource.plural) == ("", "pods"):  # the one built-in kind deleted gracefully
            return await self._delete_pod(key, live, current, _requested_grace(request))
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):  # soft deletion: a visible change
                meta.update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
                meta["resourceVersion"] = self._next_revision()
                self._store(key, live, current)
                await self._buses[resource].put({"type": "MODIFIED", "object": current})
            return current, 200
        return await self._remove(key), 200

    async def _delete_pod(
        self, key: ObjectKey, live: kmock.KubernetesEmulator.Object, current: dict[str, Any], requested: int | None
    ) -> tuple[dict[str, Any], int]:
        """A pod's graceful deletion (kubernetes/apiserver ``pkg/registry/rest/delete.go`` ``BeforeDelete``,
        ``pkg/registry/generic/registry/store.go`` ``Store.Delete``; the period from kubernetes/kubernetes
        ``pkg/registry/core/pod/strategy.go`` ``CheckGracefulDelete``, ``pod_grace_period``). The pod gets
        ``deletionTimestamp`` (now + the period) and ``deletionGracePeriodSeconds``, and, with a period above
        zero, stays: terminating, until its kubelet deletes it with period 0 (the API server never removes it by
        itself). A later deletion may only shorten the period. With period 0 (an unscheduled or finished pod, or
        asked for) the mark is written (a MODIFIED event) and the pod removed in the same request."""
        meta = current["metadata"]
        if meta.get("deletionTimestamp"):
            granted = meta.get("deletionGracePeriodSeconds")
            if granted:  # a graceful deletion is pending
                if requested is None or requested >= granted:
                    return current, 200  # only a shorter period changes it
                deadline = _parse_time(meta["deletionTimestamp"]) - datetime.timedelta(seconds=granted - requested)
                period, now = requested, datetime.datetime.now(tz=datetime.UTC)
                if deadline < now:  # never into the past; a graceful request stays graceful
                    deadline, period = now, (1 if requested else 0)
                meta.update(deletionTimestamp=_time(deadline), deletionGracePeriodSeconds=period)
            elif meta.get("finalizers"):
                return current, 200  # marked with period 0: its finalizers hold it
            else:
                return await self._remove(key), 200
        else:
            period = pod_grace_period(current, requested)
            deadline = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=period)
            meta.update(deletionTimestamp=_time(deadline), deletionGracePeriodSeconds=period)
            if meta.get("generation"):  # the first graceful deletion bumps the generation
                meta["generation"] = int(meta["generation"]) + 1
        meta["resourceVersion"] = self._next_revision()
        self._store(key, live, current)
        await self._buses[key[0]].put({"type": "MODIFIED", "object": current})
        if period > 0 or meta.get("finalizers"):
            return current, 200
        return await self._remove(key), 200

    def _store(self, key: ObjectKey, obj: kmock.KubernetesEmulator.Object, raw: dict[str, Any]) -> None:
        """Make ``raw`` the object's state; only the current version is kept (kmock keeps every version)."""
        obj.history = [raw]

    async def _remove(self, key: ObjectKey) -> dict[str, Any]:
        """Remove the object now: a DELETED event with its last state, then collect what it owned."""
        obj = self.objects[key]
        last = copy.deepcopy(obj.raw)
        last.setdefault("metadata", {})["resourceVersion"] = self._next_revision()
        self._store(key, obj, last)
        obj.delete()
        self.applied.pop(key, None)
        self.owned.pop(key, None)
        self._track_owners(key, last, None)
        uid = str(last["metadata"].get("uid"))
        if self._uids.get(uid) == key:
            del self._uids[uid]
        await self._buses[key[0]].put({"type": "DELETED", "object": last})
        for dependent in sorted(self._dependents.pop(uid, set()), key=str):
            await self._collect(dependent, uid)
        return last

    def _track_owners(self, key: ObjectKey, before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> None:
        """Keep the owner uid -> dependents index in step with the object's ``ownerReferences``."""
        old, new = _owner_uids(before or {}), _owner_uids(after or {})
        for uid in old - new:
            dependents = self._dependents.get(uid)
            if dependents is not None:
                dependents.discard(key)
                if not dependents:
                    del self._dependents[uid]
        for uid in new - old:
            self._dependents.setdefault(uid, set()).add(key)

    async def _collect(self, key: ObjectKey, owner_uid: str) -> None:
        """The garbage collector, for one dependent of a removed owner (background propagation)."""
        obj = self._live(*key)
        if obj is None or owner_uid not in _owner_uids(obj.raw):
            return
        current = copy.deepcopy(obj.raw)
        meta = current.setdefault("metadata", {})
        references = meta.get("ownerReferences") or []
        alive = [ref for ref in references if str(ref.get("uid")) in self._uids]
        if alive:  # another owner lives: only the dangling references go
            before = obj.raw
            meta["ownerReferences"] = alive
            meta["resourceVersion"] = self._next_revision()
            self._store(key, obj, current)
            self._track_owners(key, before, current)
            await self._buses[key[0]].put({"type": "MODIFIED", "object": current})
            return
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta.update(deletionTimestamp=_now(), deletionGracePeriodSeconds=0)
                meta["resourceVersion"] = self._next_revision()
                self._store(key, obj, current)
                await self._buses[key[0]].put({"type": "MODIFIED", "object": current})
            return
        await self._remove(key)

    async def _orphan_dependents(self, uid: str) -> None:
        """``propagationPolicy=Orphan``: the dependents lose their reference to ``uid`` and stay."""
        for key in sorted(self._dependents.pop(uid, set()), key=str):
            obj = self._live(*key)
            if obj is None:
                continue
            before = obj.raw
            current = copy.deepcopy(before)
            meta = current.setdefault("metadata", {})
            meta["ownerReferences"] = [ref for ref in meta.get("ownerReferences") or [] if str(ref.get("uid")) != uid]
            if not meta["ownerReferences"]:
                del meta["ownerReferences"]
            meta["resourceVersion"] = self._next_revision()
            self._store(key, obj, current)
            self._track_owners(key, before, current)
            await self._buses[key[0]].put({"type": "MODIFIED", "object": current})

    def _typed_apply_refusal(self, request: kmock.Request) -> dict[str, Any] | None:
        """The Status of a 500 when the applied configuration fails structured-merge-diff's typed validation
        (``server_side_apply.typed_patch_refusal``: a keyed list with a repeated key...), else ``None``. A
        custom resource is typed by its CRD's schema, as the API server's type converter for it is."""
        body = request.data if isinstance(request.data, dict) else yaml.safe_load(request.text or "")
        if not request.params.get("fieldManager") or not isinstance(body, dict):
            return None  # refused as such by _server_side_apply
        crd = self._schema(request.resource)
        schema = server_side_apply.Schema(crd.schema) if crd is not None else server_side_apply.Schema.of(body)
        message = server_side_apply.typed_patch_refusal(body, schema)
        if message is None:
            return None
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "code": 500,
        }

    def _server_side_apply(self, request: kmock.Request) -> tuple[str, dict[str, Any], Callable[[], None]]:
        """The apply as ``("create", object)`` (the object is missing) or ``("update", the object as it should
        be)``, and the function that records the managers' fields once the write is stored."""
        name = request.params.get("fieldManager")
        if not name:
            raise kmock.KubernetesError(422, "Invalid", "fieldManager is required for apply requests", {})
        manager = server_side_apply.Manager(name, "Apply", "", request.subresource or "")
        body = request.data if isinstance(request.data, dict) else yaml.safe_load(request.text or "")
        if not isinstance(body, dict):
            raise kmock.KubernetesError(400, "BadRequest", "an apply body must be an object", {})
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, request.name) or meta.get("namespace") not in (None, request.namespace):
            raise kmock.KubernetesError(400, "BadRequest", "the body's name and namespace must match the URL", {})
        obj: ObjectKey = (request.resource, request.namespace, str(request.name))
        live = self._live(*obj)
        paths = server_side_apply.strip_meta(server_side_apply.field_paths(body, server_side_apply.Schema.of(body)))
        api_version = str(body.get("apiVersion", ""))
        if live is None:
            owners, applied = {manager: paths}, {manager: copy.deepcopy(body)}
            created = server_side_apply.apply(None, None, body)
            created.setdefault("metadata", {})["name"] = request.name
            if request.namespace:
                created["metadata"]["namespace"] = request.namespace
            created["metadata"]["managedFields"] = server_side_apply.managed_fields(owners, api_version, _now())

            def commit_created() -> None:
                self.applied[obj], self.owned[obj] = applied, owners

            return "create", created, commit_created
        owners = {other: set(fields) for other, fields in self.owned.get(obj, {}).items()}
        applied = dict(self.applied.get(obj, {}))
        others = {other: fields for other, fields in owners.items() if other != manager}
        conflicts = server_side_apply.conflicts(live.raw, body, others)
        if conflicts and request.params.get("force") != "true":
            raise kmock.KubernetesError(
                409,
                "Conflict",
                f"Apply failed with {len(conflicts)} conflict{'s' if len(conflicts) > 1 else ''}: conflict with "
                + "; ".join(conflicts),
                {},
            )
        for fields in others.values():  # forced: the applier takes the fields it changes
            fields -= {
                path
                for path in paths
                if server_side_apply.value_at(live.raw, path) != server_side_apply.value_at(body, path)
            }
        kept = frozenset().union(*others.values()) if others else frozenset()
        desired = server_side_apply.apply(live.raw, applied.get(manager), body, kept)
        applied[manager], owners[manager] = copy.deepcopy(body), paths
        live_owners = {other: fields for other, fields in owners.items() if fields}
        # the applier's entry is dated when its apply changed the object; a no-op apply leaves the times as they
        # were, a new co-owner's without one (apimachinery internal/managedfieldsupdater.go, Apply)
        times = _entry_times(live.raw)
        if _content(desired) != _content(live.raw):
            times[manager] = _now()
        entries = server_side_apply.managed_fields(live_owners, api_version, None, times)
        desired.setdefault("metadata", {})["managedFields"] = entries

        def commit_updated() -> None:
            self.applied[obj], self.owned[obj] = applied, owners

        return "update", desired, commit_updated

    def _next_revision(self) -> str:
        self.revision += 1
        return str(self.revision)

    def _live(self, resource: Any, namespace: str | None, name: str | None) -> Any:
        key = (resource, namespace, name)
        if name is None or key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key]

    # ------------------------------------------------------------ the scale subresource

    def _scale_paths(self, resource: Any) -> ScalePaths | None:
        """Where a resource's ``.../scale`` reads and writes (None: it has no scale subresource)."""
        schema = self._schema(resource)
        if schema is not None:
            scale = schema.subresources.get("scale")
            if not isinstance(scale, dict):
                return None
            selector = scale.get("labelSelectorPath")
            return ScalePaths(
                _json_path(scale["specReplicasPath"]),
                _json_path(scale["statusReplicasPath"]),
                _json_path(selector) if selector else None,
                custom=True,
            )
        if (resource.group, resource.plural) == ("apps", "deployments"):
            return DEPLOYMENT_SCALE
        return None

    def _read_scale(self, request: kmock.Request) -> dict[str, Any]:
        """GET ``.../scale``: the object as an ``autoscaling/v1`` Scale (``ScalePaths.scale_of``); a custom
        resource without the spec replicas field is a 500, as ``ScaleREST.Get`` answers."""
        paths = self._scale_paths(request.resource)
        if paths is None:
            raise kmock.KubernetesError(404, "NotFound", "the server could not find the requested resource", {})
        live = self._live(request.resource, request.namespace, request.name)
        if live is None:
            raise _not_found(request.resource, request.name)
        if paths.custom and _nested(live.raw, paths.spec_replicas) is None:
            raise kmock.KubernetesError(
                500,
                "InternalError",
                f'Internal error occurred: the spec replicas field "{_dotted(paths.spec_replicas)}" does not exist',
                {},
            )
        return paths.scale_of(live.raw)

    async def _write_scale(self, request: kmock.Request, pruned: list[str], strict: bool) -> tuple[Any, int]:
        """PUT or PATCH ``.../scale``: the request changes the object's Scale (a PUT replaces it, a patch is
        applied to it), and the new ``spec.replicas`` goes to the object's replicas field, which is then written
        as any update of the object is (validated, a new generation; the Scale's ``resourceVersion``, when set,
        a precondition). kubernetes/apiextensions-apiserver ``pkg/registry/customresource/etcd.go``
        (``ScaleREST.Update``, ``scaleUpdatedObjectInfo``) and kubernetes/kubernetes
        ``pkg/registry/apps/deployment/storage/storage.go`` (the same for a Deployment, with ``ValidateScale``:
        replicas >= 0, and a ``uid`` precondition). The answer is the Scale after the write."""
        resource, name = request.resource, request.name
        paths = self._scale_paths(resource)
        if paths is None:
            raise kmock.KubernetesError(404, "NotFound", "the server could not find the requested resource", {})
        if self._content_type(request) == APPLY_PATCH:
            raise kmock.KubernetesError(
                415, "UnsupportedMediaType", "the emulator does not imitate server-side apply to .../scale", {}
            )
        live = self._live(resource, request.namespace, name)
        if live is None:
            raise _not_found(resource, name)
        replicas_missing = paths.custom and _nested(live.raw, paths.spec_replicas) is None
        old_scale = paths.scale_of(live.raw)
        if request.method == kmock.method.PUT:
            if not isinstance(request.data, dict):
                raise kmock.KubernetesError(400, "BadRequest", "the body must be a JSON object", {})
            scale = copy.deepcopy(request.data)
        elif isinstance(request.data, dict | list):
            scale = dicts.patch_dict(copy.deepcopy(old_scale), request.data)  # JsonPatchTestFailed etc. -> 422
        else:
            raise kmock.KubernetesError(400, "BadRequest", "the body must be a JSON object or a JSON-patch list", {})
        spec = scale.get("spec") if isinstance(scale.get("spec"), dict) else {}
        replicas = spec.get("replicas", 0)  # autoscaling/v1 ScaleSpec.replicas is omitempty: absent is 0
        if isinstance(replicas, bool) or not isinstance(replicas, int):
            raise kmock.KubernetesError(
                400, "BadRequest", f"Scale.spec.replicas: expected an integer, got {replicas!r}", {}
            )
        if replicas_missing and "replicas" not in spec:
            raise kmock.KubernetesError(
                400,
                "BadRequest",
                f'the spec replicas field "{_dotted(paths.spec_replicas)}" cannot be empty',
                {},
            )
        scale_meta = scale.get("metadata") if isinstance(scale.get("metadata"), dict) else {}
        if not paths.custom:
            if replicas < 0:
                message = f"spec.replicas: Invalid value: {replicas}: must be greater than or equal to 0"
                raise kmock.KubernetesError(
                    422,
                    "Invalid",
                    f'Scale.autoscaling "{name}" is invalid: {message}',
                    {
                        "name": name,
                        "group": "autoscaling",
                        "kind": "Scale",
                        "causes": [{"reason": "FieldValueInvalid", "field": "spec.replicas", "message": message}],
                    },
                )
            uid = scale_meta.get("uid")
            if uid and uid != live.raw["metadata"].get("uid"):
                raise _conflict(
                    resource,
                    name,
                    f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                    f"{live.raw['metadata'].get('uid')}",
                )
        parent = copy.deepcopy(live.raw)
        _set_nested(parent, paths.spec_replicas, replicas)
        precondition = scale_meta.get("resourceVersion")
        parent["metadata"]["resourceVersion"] = str(precondition or live.raw["metadata"]["resourceVersion"])
        # a custom resource's scale write changes no owner: its scale scope's field manager has no schema for
        # autoscaling/v1 Scale (the CRD's models plus apiextensions' static spec: customresource_handler.go,
        # buildOpenAPIModelsForApply), so FieldManager.UpdateNoErrors keeps the live managedFields
        # (apimachinery internal/fieldmanager.go; kubernetes/kubernetes issues #116311, #131892)
        manager = None if paths.custom else self._updater(request)
        stored, status = await self._update(request, parent, pruned, strict, preview=True, manager=manager)
        return paths.scale_of(stored), status

    # ------------------------------------------------------------ reads

    def _get_resources(self) -> list[Any]:
        return list(set(kmock.KubernetesScaffold._get_resources(self)) | set(self._index))

    async def _serve_fetch(self, request: kmock.Request) -> Any:
        if request.resource not in self.resources and request.resource not in self._index:  # no CRD serves it
            raise kmock.KubernetesError(404, "NotFound", "the server could not find the requested resource", {})
        if request.subresource == "scale":
            return self._read_scale(request)
        if request.subresource not in (None, "status") or (
            request.subresource == "status" and not self._has_status_subresource(request.resource)
        ):
            raise kmock.KubernetesError(404, "NotFound", "the server could not find the requested resource", {})
        obj = self._live(request.resource, request.namespace, request.name)
        if obj is None:
            raise _not_found(request.resource, request.name)
        return obj.raw

    def _keys(self, request: kmock.Request) -> list[ObjectKey]:
        """The live objects a list or watch request covers (namespace, name, labelSelector)."""
        selector = label_selector(request.params.get("labelSelector", ""))
        keys: list[ObjectKey] = []
        for namespace, name in self._index.get(request.resource, {}):
            if request.namespace not in (None, namespace) or request.name not in (None, name):
                continue
            obj = self._live(request.resource, namespace, name)
            if obj is not None and selector(obj.raw):
                keys.append((request.resource, namespace, name))
        return keys

    async def _serve_list(self, request: kmock.Request) -> Any:
        """The objects in key order (namespace, name), in pages when asked (``limit``, ``continue``): a page ends
        with ``metadata.continue`` (kubernetes/apiserver ``pkg/storage/continue.go``: base64 of ``{"v", "rv",
        "start"}``, the start key just after the page's last) and, without a selector, ``remainingItemCount``
        (``PrepareContinueToken``); every page reports the first page's resourceVersion. A token from before
        ``expire_watches`` is a 410 Expired (``pkg/storage/etcd3/errors.go``). Unlike the real server, which
        serves the later pages from the first one's snapshot, they show the objects as they are now."""
        if request.resource not in self.resources and request.resource not in self._index:
            raise kmock.KubernetesError(404, "NotFound", "the server could not find the requested resource", {})
        limit_text = request.params.get("limit", "")
        limit = int(limit_text) if limit_text.isdigit() and int(limit_text) > 0 else None
        start, revision = _decode_continue(request.params.get("continue", ""))
        if revision is not None and revision <= self.expired_through:
            raise kmock.KubernetesError(410, "Expired", _CONTINUE_EXPIRED, {})
        async with self._lock:
            keyed = sorted((_list_key(request.namespace, key), key) for key in self._keys(request))
            listed = [(text, key) for text, key in keyed if start is None or text >= start]
            page = listed[:limit] if limit is not None else listed
            items = [self.objects[key].raw for _, key in page]
        metadata: dict[str, Any] = {"resourceVersion": str(revision if revision is not None else self.committed)}
        if len(page) < len(listed):
            metadata["continue"] = _continue_token(int(metadata["resourceVersion"]), page[-1][0] + "\x00")
            if not request.params.get("labelSelector") and not request.params.get("fieldSelector"):
                metadata["remainingItemCount"] = len(listed) - len(page)
        return {
            "apiVersion": f"{request.resource.group}/{request.resource.version}".lstrip("/"),
            "kind": f"{self._kind(request.resource)}List",
            "metadata": metadata,
            "items": items,
        }

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """Every change after ``?resourceVersion=N`` (all objects as ADDED, without it), then every change as it
        happens: ADDED, MODIFIED, and DELETED with the object's last state. It subscribes to the bus *before*
        the snapshot, so that a write landing meanwhile is not lost, and never replays an older state (kopf lists,
        then watches from the list's version: a replayed stale object makes its finalizer JSON-patch fail)."""
        if not self._watches_connect.is_set() and not self._closing:
            await self._watches_connect.wait()  # an interrupted connection: no answer, not even the headers
        yield b""  # send the headers now
        if self._closing:
            return
        since = request.params.get("resourceVersion", "")
        since_revision = int(since) if since.isdigit() else 0
        if since_revision and since_revision <= self.expired_through:
            yield {"type": "ERROR", "object": _too_old(since_revision, self.expired_through + 1)}
            return
        selector = label_selector(request.params.get("labelSelector", ""))

        def wanted(namespace: str | None, name: str | None) -> bool:
            return (request.namespace in (None, namespace)) and (request.name in (None, name))

        bus = self._buses[request.resource]
        marker = await bus.mark()
        try:
            async with self._lock:
                snapshot = [(self._created.get(key, 0), self.objects[key].raw) for key in self._keys(request)]
            sent = {(raw["metadata"].get("namespace"), raw["metadata"]["name"]): _revision(raw) for _, raw in snapshot}
            for created, raw in snapshot:
                if _revision(raw) > since_revision:  # NB: objects deleted after N but before now are not reported
                    yield {"type": "ADDED" if created > since_revision else "MODIFIED", "object": raw}
            async for event in bus.stream(since=marker):
                if event is _CLOSE or event is _TERMINATE:
                    return
                raw = event.get("object", {})
                meta = raw.get("metadata", {})
                key = (meta.get("namespace"), meta.get("name"))
                if not wanted(*key) or not selector(raw):
                    continue
                if _revision(raw) <= max(sent.get(key, -1), since_revision):
                    continue  # already sent in the snapshot, or older than asked for
                lag = self.watch_lag.get(request.resource)
                if lag:
                    await asyncio.sleep(lag)  # a watch a moment behind (``watch_lag``)
                yield event
        finally:
            await bus.unmark(marker)


_CONTINUE_EXPIRED = (
    "The provided continue parameter is too old to display a consistent list result. You can start a new list "
    "without the continue parameter."
)


def _list_key(namespace: str | None, key: ObjectKey) -> str:
    """An object's key under a list's prefix, as etcd orders it: ``name`` in a namespace, ``namespace/name``
    across the cluster."""
    return key[2] if namespace is not None or key[1] is None else f"{key[1]}/{key[2]}"


def _continue_token(revision: int, start: str) -> str:
    """``storage.EncodeContinue``: unpadded URL-safe base64 of ``{"v": "meta.k8s.io/v1", "rv", "start"}``."""
    text = json.dumps({"v": "meta.k8s.io/v1", "rv": revision, "start": start}, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode_continue(token: str) -> tuple[str | None, int | None]:
    """``storage.DecodeContinue``: (start key, resourceVersion), or (None, None) without a token; 400 for one
    that is not valid."""
    if not token:
        return None, None
    try:
        decoded = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        revision, start = int(decoded["rv"]), str(decoded["start"])
    except (ValueError, KeyError, TypeError) as error:
        raise kmock.KubernetesError(400, "BadRequest", f"continue key is not valid: {error}", {}) from None
    if decoded.get("v") != "meta.k8s.io/v1" or revision == 0 or not start:
        raise kmock.KubernetesError(400, "BadRequest", "continue key is not valid", {})
    return start, revision


def _set(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


def _too_old(since: int, oldest_watchable: int) -> dict[str, Any]:
    """The Status of a watch from an expired resourceVersion: apimachinery's ``errors.NewResourceExpired`` with
    the cacher's message (``pkg/storage/cacher/watch_cache_history.go``)."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f"too old resource version: {since} ({oldest_watchable})",
        "reason": "Expired",
        "code": 410,
    }


def _revision(raw: Mapping[str, Any]) -> int:
    return int(raw.get("metadata", {}).get("resourceVersion") or 0)


def _user_agent_prefix(user_agent: str) -> str:
    """A User-Agent as a field manager: the part before its first ``/``, printable characters only, at most 128
    bytes (kubernetes/apiserver ``pkg/endpoints/handlers/create.go``, ``prefixFromUserAgent``)."""
    prefix = ""
    for char in user_agent.split("/")[0]:
        if not char.isprintable():
            continue
        if len((prefix + char).encode()) > 128:  # validation.FieldManagerMaxLength
            break
        prefix += char
    return prefix


def _entry_times(raw: Mapping[str, Any] | None) -> dict[server_side_apply.Manager, str | None]:
    """Each ``managedFields`` entry's time (None: it has none), by manager."""
    entries = ((raw or {}).get("metadata") or {}).get("managedFields") or []
    return {server_side_apply.Manager.of_entry(entry): entry.get("time") for entry in entries}


def _content(raw: Mapping[str, Any]) -> dict[str, Any]:
    """An object without what a write does not change by itself (``managedFields``, ``resourceVersion``)."""
    meta = {k: v for k, v in (raw.get("metadata") or {}).items() if k not in ("managedFields", "resourceVersion")}
    return {**raw, "metadata": meta}


@dataclasses.dataclass(frozen=True)
class ScalePaths:
    """Where a scalable resource keeps what its ``autoscaling/v1`` Scale shows."""

    spec_replicas: tuple[str, ...]
    status_replicas: tuple[str, ...]
    selector: tuple[str, ...] | None
    """A custom resource's ``labelSelectorPath`` (a string field), or None."""
    custom: bool
    """A custom resource (the CRD's ``subresources.scale``); else a Deployment, whose ``status.selector`` is its
    ``spec.selector`` as text."""

    def scale_of(self, raw: Mapping[str, Any]) -> dict[str, Any]:
        """The object's Scale, as ``scaleFromCustomResource`` (kubernetes/apiextensions-apiserver
        ``pkg/registry/customresource/etcd.go``) and ``scaleFromDeployment`` (kubernetes/kubernetes
        ``pkg/registry/apps/deployment/storage/storage.go``) build it; ``spec.replicas`` 0 and an empty selector
        are left out (``omitempty``)."""
        meta = raw.get("metadata") or {}
        replicas = _nested(raw, self.spec_replicas)
        if replicas is None:  # a custom resource without the field: 0; a Deployment's defaulted 1
            replicas = 0 if self.custom else 1
        status_replicas = _nested(raw, self.status_replicas)
        if self.custom:
            selector = _nested(raw, self.selector) if self.selector else None
        else:
            selector = selector_text((raw.get("spec") or {}).get("selector"))
        scale: dict[str, Any] = {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                field: meta[field]
                for field in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp")
                if meta.get(field) is not None
            },
            "spec": {"replicas": replicas} if replicas else {},
            "status": {"replicas": status_replicas if isinstance(status_replicas, int) else 0},
        }
        if selector:
            scale["status"]["selector"] = str(selector)
        return scale


DEPLOYMENT_SCALE = ScalePaths(("spec", "replicas"), ("status", "replicas"), None, custom=False)


def _json_path(text: str) -> tuple[str, ...]:
    """A CRD's replicas path (``.spec.replicas``) as keys (``splitReplicasPath``: the leading dot dropped)."""
    return tuple(text.removeprefix(".").split("."))


def _dotted(path: tuple[str, ...]) -> str:
    return "." + ".".join(path)


def _nested(raw: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(raw, Mapping):
            return None
        raw = raw.get(key)
    return raw


def _set_nested(raw: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        child = raw.get(key)
        if not isinstance(child, dict):
            child = raw[key] = {}
        raw = child
    raw[path[-1]] = value


def selector_text(selector: Mapping[str, Any] | None) -> str:
    """A LabelSelector as the API server writes it in ``Scale.status.selector`` (apimachinery
    ``metav1.LabelSelectorAsSelector(...).String()``: requirements sorted by key, ``k=v``, ``k in (a,b)``,
    ``k notin (a,b)``, ``k``, ``!k``, joined by commas)."""
    requirements: list[tuple[str, str]] = []
    for key, value in ((selector or {}).get("matchLabels") or {}).items():
        requirements.append((key, f"{key}={value}"))
    for expression in (selector or {}).get("matchExpressions") or []:
        key, operator = expression.get("key", ""), expression.get("operator", "")
        values = ",".join(sorted(expression.get("values") or []))
        text = {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key}.get(
            operator, f"!{key}"
        )
        requirements.append((key, text))
    return ",".join(text for _, text in sorted(requirements))


def load_builtin_resources(emulator: kmock.KubernetesEmulator) -> None:
    """``emulator.resources.load_bundled()`` without its DeprecationWarning (importlib.resources.read_binary)."""
    bundled = importlib.resources.files("kmock._internal") / "resources.json.gz"
    emulator.resources.load_data(gzip.decompress(bundled.read_bytes()))


def register_crd(emulator: Emulator, manifest: dict[str, Any] | Path = CRD_FILE) -> str:
    """Serve a CustomResourceDefinition's (first served) version, validated by its schema: by default the
    OrderedConsumer CRD (crds/). Returns its ``group/version/plural`` key."""
    crd = yaml.safe_load(manifest.read_text()) if isinstance(manifest, Path) else manifest
    schema = CustomResourceSchema.of(crd)
    names = crd["spec"]["names"]
    key = f"{schema.group}/{schema.version}/{schema.plural}"
    emulator.resources[key] = kmock.ResourceInfo(
        kind=schema.kind,
        singular=names.get("singular") or schema.kind.lower(),
        namespaced=crd["spec"].get("scope", "Namespaced") == "Namespaced",
        verbs=set(CRD_VERBS),
        shortnames=set(names.get("shortNames") or ()),
        categories=set(names.get("categories") or ()),
        subresources={name for name in ("status", "scale") if name in schema.subresources},
    )
    emulator.schemas[kmock.resource(key)] = schema
    return key


PEERING_CRDS_FILE = Path(__file__).resolve().parents[2] / "charts" / "keyorder-operator" / "crds" / "kopf-peerings.yaml"


def register_peering_crds(emulator: Emulator) -> list[str]:
    """Serve kopf's peering resources (ClusterKopfPeering, KopfPeering, group kopf.dev) from the chart's CRDs, as
    a cluster with them installed does. Returns their ``group/version/plural`` keys."""
    return [register_crd(emulator, crd) for crd in yaml.safe_load_all(PEERING_CRDS_FILE.read_text()) if crd]


def older_crd(manifest: Path = CRD_FILE) -> dict[str, Any]:
    """The CRD without its CEL rules, its ``pattern``s, its list-map keys and its ``metadata.name`` constraints (as
    an older release could have shipped it): what lets a spec that only the operator refuses reach the operator,
    whose own checks are then the last line."""
    crd = yaml.safe_load(manifest.read_text())

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            node.pop("x-kubernetes-validations", None)
            if isinstance(node.get("pattern"), str):
                del node["pattern"]
            if node.get("x-kubernetes-list-type") == "map":  # an older release's lists took duplicates
                del node["x-kubernetes-list-type"], node["x-kubernetes-list-map-keys"]
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    for version in crd["spec"]["versions"]:
        schema = version["schema"]["openAPIV3Schema"]
        strip(schema)
        schema["properties"]["metadata"] = {"type": "object"}
    return crd


__all__ = [
    "CRD_FILE",
    "CRD_VERBS",
    "PEERING_CRDS_FILE",
    "Emulator",
    "label_selector",
    "load_builtin_resources",
    "older_crd",
    "pod_grace_period",
    "register_crd",
    "register_peering_crds",
]
