"""kmock's in-memory Kubernetes API, made realistic enough for the real kopf operator.

Plain ``kmock.KubernetesEmulator`` never sets ``resourceVersion``/``uid``/``generation``/``creationTimestamp``,
ignores ``generateName`` and answers a failed JSON-patch ``test`` op with a 500. kopf needs all of these (its
finalizer patch is a JSON-patch that tests ``/metadata/resourceVersion``; its Events use ``generateName``).
It also has no server-side apply: this one answers ``application/apply-patch+yaml`` PATCHes with SSA's merge
semantics (``server_side_apply``: removed fields and list items go, lists of the Kubernetes types merge by
their keys), creating the object when it does not exist, and strategic merge patches with their list
semantics (keyed lists merged, nothing removed), so a test fails when the operator's apply leaves a removed
env var or port behind, as a client-side patch does on a real API server. It keeps no request log (see
``_handle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import datetime
import gzip
import importlib.resources
import random
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp.web
import attrs
import jsonpatch
import jsonpointer
import kmock
import yaml
from kmock._internal import dicts  # the very merge/JSON-patch logic the emulator applies

from tests.operator import server_side_apply

_WRITES = {kmock.action.CREATE, kmock.action.UPDATE, kmock.action.DELETE}
_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # as Kubernetes' generateName suffixes
_CLOSE = object()  # put into the buses to end the watch streams
APPLY_PATCH = "application/apply-patch+yaml"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
CRD_VERBS = frozenset({"list", "watch", "get", "create", "patch", "update", "delete"})


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@attrs.define(kw_only=True)
class Emulator(kmock.KubernetesEmulator):
    """A KubernetesEmulator with metadata bookkeeping, optimistic concurrency (409) and JSON-patch 422s."""

    revision: int = attrs.field(default=0, init=False)  # the last resourceVersion handed out (one counter, as etcd)
    committed: int = attrs.field(default=0, init=False)  # the last one whose write completed (lists report it)
    _write_lock: asyncio.Lock = attrs.field(factory=asyncio.Lock, init=False)
    applied: dict[tuple[Any, str | None, str, str], dict[str, Any]] = attrs.field(factory=dict, init=False)
    owned: dict[tuple[Any, str | None, str, str], set[Any]] = attrs.field(factory=dict, init=False)
    """The fields each field manager owns, per object (``server_side_apply.field_paths``)."""
    """(resource, namespace, name, field manager) -> what that manager last server-side applied."""
    _closing: bool = attrs.field(default=False, init=False)

    async def close_watches(self) -> None:
        """End every watch stream, now and later: aiohttp's shutdown would otherwise wait for them (60 s)."""
        self._closing = True
        for bus in list(self._buses.values()):
            await bus.put(_CLOSE)

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
        if request.resource is None or request.action not in _WRITES:
            return await super()._handle(request)
        async with self._write_lock:  # one write at a time: the checks below and the parent's write are atomic
            try:
                if request.action == kmock.action.UPDATE and self._content_type(request) == APPLY_PATCH:
                    self._server_side_apply(request)
                elif request.action == kmock.action.UPDATE and self._content_type(request) == STRATEGIC_PATCH:
                    self._strategic_merge(request)
                elif request.action == kmock.action.CREATE and isinstance(request.data, dict):
                    meta = request.data.get("metadata") or {}
                    self._forget_applied(request.resource, meta.get("namespace") or request.namespace, meta.get("name"))
                await self._prepare(request)
                response = await super()._handle(request)
                self.committed = self.revision  # everything up to here is stored and on the buses
                return response
            except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException, ValueError) as exc:
                raise kmock.KubernetesError(422, "Invalid", f"{type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _content_type(request: kmock.Request) -> str:
        content_type = {key.lower(): value for key, value in request.headers.items()}.get("content-type", "")
        return content_type.split(";")[0].strip()

    def _strategic_merge(self, request: kmock.Request) -> None:
        """Turn a strategic merge patch, in place, into the merge patch with its result (lists merged by key)."""
        live = self._live(request.resource, request.namespace, request.name)
        if live is None or not isinstance(request.data, dict) or request.subresource is not None:
            return  # a 404, or a status patch (kopf's): plain merge semantics are close enough
        merged = server_side_apply.strategic_merge(live.raw, request.data)
        patch = server_side_apply.merge_patch(live.raw, merged)
        if "resourceVersion" in (request.data.get("metadata") or {}):  # keep the precondition for _prepare
            patch.setdefault("metadata", {})["resourceVersion"] = request.data["metadata"]["resourceVersion"]
        object.__setattr__(request, "data", patch)

    def _forget_applied(self, resource: Any, namespace: str | None, name: str | None) -> None:
        for key in [key for key in self.applied if key[:3] == (resource, namespace, name)]:
            del self.applied[key]
        for key in [key for key in self.owned if key[:3] == (resource, namespace, name)]:
            del self.owned[key]

    def _server_side_apply(self, request: kmock.Request) -> None:
        """Turn the apply, in place, into the CREATE (object missing) or merge-patch UPDATE that has SSA's result.

        In place: kmock finds a request's reactions by the request object's identity, so a copy would match none.
        """
        manager = request.params.get("fieldManager")
        if not manager:
            raise kmock.KubernetesError(422, "Invalid", "fieldManager is required for apply requests")
        body = request.data if isinstance(request.data, dict) else yaml.safe_load(request.text or "")
        if not isinstance(body, dict):
            raise kmock.KubernetesError(400, "BadRequest", "an apply body must be an object")
        meta = body.get("metadata") or {}
        if meta.get("name") not in (None, request.name) or meta.get("namespace") not in (None, request.namespace):
            raise kmock.KubernetesError(400, "BadRequest", "the body's name and namespace must match the URL")
        live = self._live(request.resource, request.namespace, request.name)
        key = (request.resource, request.namespace, request.name, manager)
        paths = server_side_apply.field_paths(body, server_side_apply.Schema.of(body))
        if live is None:
            self._forget_applied(request.resource, request.namespace, request.name)
            self.applied[key], self.owned[key] = copy.deepcopy(body), paths
            created = server_side_apply.apply(None, None, body)
            created.setdefault("metadata", {}).update(name=request.name, namespace=request.namespace)
            created["metadata"]["managedFields"] = self._managed_fields(key[:3], body)
            object.__setattr__(request, "action", kmock.action.CREATE)  # kmock's Request is frozen
            object.__setattr__(request, "data", created)
            return
        others = {other[3]: owned for other, owned in self.owned.items() if other[:3] == key[:3] and other != key}
        conflicts = server_side_apply.conflicts(live.raw, body, others)
        if conflicts and request.params.get("force") != "true":
            raise kmock.KubernetesError(
                409,
                "Conflict",
                f"Apply failed with {len(conflicts)} conflict{'s' if len(conflicts) > 1 else ''}: conflict with "
                + "; ".join(conflicts),
            )
        for owned in others.values():  # forced: the applier takes the fields it changes
            owned -= {
                path
                for path in paths
                if server_side_apply.value_at(live.raw, path) != server_side_apply.value_at(body, path)
            }
        kept = frozenset().union(*others.values()) if others else frozenset()
        desired = server_side_apply.apply(live.raw, self.applied.get(key), body, kept)
        self.applied[key], self.owned[key] = copy.deepcopy(body), paths
        desired.setdefault("metadata", {})["managedFields"] = self._managed_fields(key[:3], body)
        object.__setattr__(request, "data", server_side_apply.merge_patch(live.raw, desired))

    def _managed_fields(self, obj: tuple[Any, str | None, str], body: dict[str, Any]) -> list[dict[str, Any]]:
        owners = {key[3]: owned for key, owned in self.owned.items() if key[:3] == obj and owned}
        return server_side_apply.managed_fields(owners, str(body.get("apiVersion", "")), _now())

    def _next_revision(self) -> str:
        self.revision += 1
        return str(self.revision)

    async def _prepare(self, request: kmock.Request) -> None:
        """Complete the request's body in place before the parent class stores it."""
        data: Any = request.data
        if request.action == kmock.action.CREATE:
            if not isinstance(data, dict):
                raise kmock.KubernetesError(400, "BadRequest", "the body must be a JSON object")
            meta = data.setdefault("metadata", {})
            namespace = meta.setdefault("namespace", request.namespace) if request.namespace else meta.get("namespace")
            while not meta.get("name") and meta.get("generateName"):
                name = meta["generateName"] + "".join(random.choices(_NAME_CHARS, k=5))
                if self._live(request.resource, namespace, name) is None:
                    meta["name"] = name
            if not meta.get("name"):
                raise kmock.KubernetesError(422, "Invalid", "metadata.name or metadata.generateName is required")
            if self._has_status_subresource(request):
                data.pop("status", None)  # as the real API: the status is written only via .../status
            meta.update(
                uid=str(uuid.uuid4()), resourceVersion=self._next_revision(), generation=1, creationTimestamp=_now()
            )
            return
        obj = self._live(request.resource, request.namespace, request.name)
        if obj is None:
            return  # the parent answers 404
        current = copy.deepcopy(obj.raw)
        meta = current.setdefault("metadata", {})
        if request.action == kmock.action.DELETE:
            async with self._lock:
                if meta.get("finalizers") and not meta.get("deletionTimestamp"):  # soft deletion: a visible change
                    obj.patch(
                        {
                            "metadata": {
                                "deletionTimestamp": _now(),
                                "deletionGracePeriodSeconds": 0,
                                "resourceVersion": self._next_revision(),
                            }
                        }
                    )
                    await self._buses[request.resource].put({"type": "MODIFIED", "object": obj.raw})
                elif not meta.get("finalizers"):  # the parent deletes it now: its DELETED event gets a new version
                    obj.patch({"metadata": {"resourceVersion": self._next_revision()}})
            return
        precondition = (data.get("metadata") or {}).get("resourceVersion") if isinstance(data, dict) else None
        if precondition is not None and str(precondition) != str(meta.get("resourceVersion")):  # merge patches
            raise kmock.KubernetesError(
                409,
                "Conflict",
                f"the object has been modified: resourceVersion {precondition} != {meta.get('resourceVersion')}",
            )
        if not isinstance(data, dict | list):
            raise kmock.KubernetesError(400, "BadRequest", "the body must be a JSON object or a JSON-patch list")
        if self._has_status_subresource(request):  # the main resource ignores status; .../status ignores the rest
            to_status = request.subresource == "status"
            if isinstance(data, dict):
                for key in [key for key in data if (key == "status") != to_status and key != "metadata"]:
                    del data[key]
                if to_status:
                    data["metadata"] = {"resourceVersion": precondition} if precondition is not None else {}
            else:
                data[:] = [
                    op
                    for op in data
                    if op.get("op") == "test"
                    or to_status == (op.get("path") == "/status" or str(op.get("path")).startswith("/status/"))
                ]
        preview = dicts.patch_dict(current, data)  # raises JsonPatchTestFailed etc. -> 422, nothing stored
        changes: dict[str, Any] = {"resourceVersion": self._next_revision()}
        if request.subresource is None and preview.get("spec") != current.get("spec"):
            changes["generation"] = int(meta.get("generation") or 0) + 1
        if isinstance(data, dict):
            data["metadata"] = {**(data.get("metadata") or {}), **changes}
        else:
            data.extend({"op": "add", "path": f"/metadata/{key}", "value": val} for key, val in changes.items())

    def _has_status_subresource(self, request: kmock.Request) -> bool:
        return request.resource in self.resources and "status" in self.resources[request.resource].subresources

    def _live(self, resource: Any, namespace: str | None, name: str | None) -> Any:
        key = (resource, namespace, name)
        if name is None or key not in self.objects or self.objects[key].deleted:
            return None
        return self.objects[key]

    async def _serve_list(self, request: kmock.Request) -> Any:
        result = await super()._serve_list(request)
        result["metadata"] = {"resourceVersion": str(self.committed)}
        return result

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """As the parent's, plus: it honours ``?resourceVersion=N`` (only changes after N: kopf lists, then watches
        from the list's version, and a replayed stale object makes its finalizer JSON-patch fail for good); and it
        subscribes to the bus *before* the snapshot, so that a write landing meanwhile is not lost."""
        yield b""  # send the headers now
        if self._closing:
            return
        since = request.params.get("resourceVersion", "")
        since_revision = int(since) if since.isdigit() else 0

        def wanted(namespace: str | None, name: str | None) -> bool:
            return (request.namespace in (None, namespace)) and (request.name in (None, name))

        bus = self._buses[request.resource]
        marker = await bus.mark()
        try:
            async with self._lock:
                snapshot = [
                    (_creation_revision(obj), copy.deepcopy(obj.raw))
                    for (resource, namespace, name), obj in self.objects.items()
                    if resource == request.resource and not obj.deleted and wanted(namespace, name)
                ]
            sent = {(raw["metadata"].get("namespace"), raw["metadata"]["name"]): _revision(raw) for _, raw in snapshot}
            for created, raw in snapshot:
                if _revision(raw) > since_revision:  # NB: objects deleted after N but before now are not reported
                    yield {"type": "ADDED" if created > since_revision else "MODIFIED", "object": raw}
            async for event in bus.stream(since=marker):
                if event is _CLOSE:
                    return
                meta = event.get("object", {}).get("metadata", {})
                key = (meta.get("namespace"), meta.get("name"))
                if not wanted(*key):
                    continue
                if event.get("type") != "DELETED" and _revision(event["object"]) <= max(
                    sent.get(key, -1), since_revision
                ):
                    continue  # already sent in the snapshot, or older than asked for
                yield event
        finally:
            await bus.unmark(marker)


def _creation_revision(obj: kmock.Object) -> int:
    """The resourceVersion at which the object's current life began (its history restarts after a deletion)."""
    created = 0
    for version in reversed(obj.history):
        if version is None:
            break
        created = _revision(version)
    return created


def _revision(raw: Mapping[str, Any]) -> int:
    return int(raw.get("metadata", {}).get("resourceVersion") or 0)


def load_builtin_resources(emulator: kmock.KubernetesEmulator) -> None:
    """``emulator.resources.load_bundled()`` without its DeprecationWarning (importlib.resources.read_binary)."""
    bundled = importlib.resources.files("kmock._internal") / "resources.json.gz"
    emulator.resources.load_data(gzip.decompress(bundled.read_bytes()))


def register_crd(
    emulator: kmock.KubernetesEmulator,
    group: str = "keyorder.dev",
    version: str = "v1alpha1",
    plural: str = "orderedconsumers",
    kind: str = "OrderedConsumer",
    namespaced: bool = True,
) -> str:
    """Declare a custom resource with a status subresource; returns its ``group/version/plural`` key."""
    key = f"{group}/{version}/{plural}"
    emulator.resources[key] = kmock.ResourceInfo(
        kind=kind, singular=kind.lower(), namespaced=namespaced, verbs=set(CRD_VERBS), subresources={"status"}
    )
    return key


__all__ = ["CRD_VERBS", "Emulator", "load_builtin_resources", "register_crd"]
