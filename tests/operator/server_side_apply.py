"""Server-side apply's and strategic merge patch's list semantics, for the API emulator (kmock has neither).

What the real API server does to an apply by a field manager, reduced to what the operator relies on:

* fields the manager applied last time and leaves out now are removed from the object;
* fields it applies are set (maps merged recursively);
* lists of the Kubernetes types are merged by their keys (``x-kubernetes-list-map-keys``, else
  ``x-kubernetes-patch-merge-key``: containers and env by ``name``, container ports by
  ``containerPort`` and ``protocol``, Service ports by ``port`` and ``protocol``, volumeMounts by
  ``mountPath``...), item by item: an item the manager applied last time and leaves out now is
  removed, an item another writer added stays; every other list is atomic (replaced whole);
* fields nobody applied (e.g. annotations another tool added with a patch) stay.

A strategic merge patch (what a plain ``patch`` of the ``kubernetes`` client sends for a dict) merges lists
of the Kubernetes types by the same keys and never removes an item it does not name (``strategic_merge``):
that is why a client-side patch of the whole object leaves removed env vars, ports and volumes behind.

Field ownership, as the API server tracks it (``field_paths``, ``conflicts``, ``changed_fields``): each
applier owns the fields of its last apply; every other write (create, update, patch: ``operation:
Update``) gives its manager the fields it added or changed and takes them from everyone else, appliers
included (structured-merge-diff ``merge/update.go``, ``Updater.Update``). A field another manager also
owns is not removed when one of them leaves it out; applying a value that differs from the live one in a
field another manager owns is a conflict (409 without ``force``; with it, ownership moves to the
applier); ``managed_fields`` renders the ownership as ``metadata.managedFields`` (FieldsV1), one entry
per ``Manager`` (an applier by name, an updater by name, API version and subresource). The list keys
come from the real Kubernetes schemas bundled with kubernetes-validate.

Before any of it, the applied configuration is validated as structured-merge-diff types it
(``typed_errors``, ``typed_patch_refusal``): a keyed list whose items repeat a key is refused (the API
server's 500), though the live object may hold duplicates another writer put there.
"""

from __future__ import annotations

import copy
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

KUBERNETES_VERSION = "1.29.0"
DEFAULT_KEY_VALUES = {"protocol": "TCP"}
"""Key fields the API server defaults before it compares items (a port without a protocol is TCP)."""


@functools.cache
def _definitions() -> dict[str, Any]:
    import kubernetes_validate

    path = (
        Path(kubernetes_validate.__file__).parent
        / "kubernetes-json-schema"
        / f"v{KUBERNETES_VERSION}-local"
        / "_definitions.json"
    )
    return json.loads(path.read_text())["$defs"]


@functools.cache
def _definition_of(api_version: str, kind: str) -> str | None:
    group, _, version = api_version.rpartition("/")
    for name, definition in _definitions().items():
        for gvk in definition.get("x-kubernetes-group-version-kind", []):
            if (gvk.get("group", ""), gvk.get("version"), gvk.get("kind")) == (group, version, kind):
                return name
    return None


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = _definitions()[node["$ref"].rsplit("/", 1)[-1]]
    if "allOf" in node and len(node["allOf"]) == 1:
        return _resolve(node["allOf"][0])
    return node


class Schema:
    """A position in a Kubernetes type's schema (``None``: unknown, every list atomic)."""

    def __init__(self, node: dict[str, Any] | None) -> None:
        self.node = _resolve(node) if node is not None else None

    @classmethod
    def of(cls, obj: dict[str, Any]) -> Schema:
        name = _definition_of(str(obj.get("apiVersion", "")), str(obj.get("kind", "")))
        return cls(_definitions()[name] if name else None)

    def field(self, name: str) -> Schema:
        if self.node is None:
            return Schema(None)
        child = (self.node.get("properties") or {}).get(name)
        if child is None and isinstance(self.node.get("additionalProperties"), dict):
            child = self.node["additionalProperties"]
        return Schema(child)

    def list_keys(self) -> tuple[str, ...] | None:
        """The keys of an associative list, or None for an atomic one."""
        if self.node is None:
            return None
        if self.node.get("x-kubernetes-list-type") == "map":
            return tuple(self.node.get("x-kubernetes-list-map-keys") or ())
        if "x-kubernetes-patch-merge-key" in self.node:
            return (self.node["x-kubernetes-patch-merge-key"],)
        return None

    def items(self) -> Schema:
        return Schema(self.node.get("items") if self.node is not None else None)


def _key(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...]:
    if not isinstance(item, dict):
        return (item,)
    return tuple(item.get(key, DEFAULT_KEY_VALUES.get(key)) for key in keys)


FieldPath = tuple[Any, ...]
"""A field's path: map keys, and for an item of a keyed list ``("k", ((key, value), ...))``."""

NOBODY_ELSE: frozenset[FieldPath] = frozenset()


def _item_segment(item: Any, keys: tuple[str, ...]) -> tuple[Any, ...]:
    return ("k", tuple(zip(keys, _key(item, keys), strict=True)))


def field_paths(config: Any, schema: Schema, prefix: FieldPath = ()) -> set[FieldPath]:
    """The leaf fields an applied configuration sets: what its manager owns after the apply."""
    paths: set[FieldPath] = set()
    if not isinstance(config, dict):
        return {prefix} if prefix else paths
    for name, value in config.items():
        child, path = schema.field(name), (*prefix, name)
        keys = child.list_keys()
        if isinstance(value, dict) and value:
            paths |= field_paths(value, child, path)
        elif isinstance(value, list) and keys:
            for item in value:
                segment = (*path, _item_segment(item, keys))
                paths |= field_paths(item, child.items(), segment) if isinstance(item, dict) and item else {segment}
        else:
            paths.add(path)
    return paths


def value_at(obj: Any, path: FieldPath) -> Any:
    """The value at ``path`` (``None`` when absent)."""
    for segment in path:
        if isinstance(segment, tuple) and isinstance(obj, list):
            wanted = dict(segment[1])
            obj = next(
                (
                    item
                    for item in obj
                    if isinstance(item, dict)
                    and all(item.get(k, DEFAULT_KEY_VALUES.get(k)) == v for k, v in wanted.items())
                ),
                None,
            )
        elif isinstance(obj, dict):
            obj = obj.get(segment)
        else:
            return None
    return obj


def conflicts(live: dict[str, Any], applied: dict[str, Any], others: Mapping[Any, set[FieldPath]]) -> list[str]:
    """``"manager": .path`` for every field ``applied`` would change that another manager owns (an updater
    named as apimachinery's ``printManager`` names it: ``"kubectl" with subresource "scale" using apps/v1``)."""
    found = []
    for path in sorted(field_paths(applied, Schema.of(applied)), key=str):
        if value_at(live, path) == value_at(applied, path):
            continue  # the same value: both managers own it, no conflict
        found += [
            f"{_printed(manager)}: {render_path(path)}"
            for manager, owned in sorted(others.items(), key=_order)
            if path in owned
        ]
    return found


@dataclass(frozen=True)
class Manager:
    """Who owns fields, as the API server keys ``managedFields`` entries (k8s.io/apimachinery
    ``pkg/util/managedfields/internal/managedfields.go``, ``BuildManagerIdentifier``, and ``buildmanagerinfo.go``):
    an applier by its name and subresource (not the API version: it stays one manager whatever version it
    applies); an updater (create, update, patch) by its name, the API version it wrote and the subresource.
    So one client that applies and also patches owns fields as two managers."""

    name: str
    operation: str = "Apply"
    api_version: str = ""
    """The updater's API version (``group/version``); empty for an applier."""
    subresource: str = ""

    @classmethod
    def of_entry(cls, entry: Mapping[str, Any]) -> Manager:
        """The manager a ``managedFields`` entry belongs to."""
        operation = str(entry.get("operation") or "Apply")
        return cls(
            str(entry.get("manager") or ""),
            operation,
            "" if operation == "Apply" else str(entry.get("apiVersion") or ""),
            str(entry.get("subresource") or ""),
        )

    def __str__(self) -> str:
        """As a conflict names it (apimachinery ``internal/conflict.go``, ``printManager``)."""
        text = json.dumps(self.name) + (f" with subresource {json.dumps(self.subresource)}" if self.subresource else "")
        return f"{text} using {self.api_version}" if self.operation == "Update" else text


def _printed(manager: Any) -> str:
    return str(manager) if isinstance(manager, Manager) else json.dumps(str(manager))


def _order(item: tuple[Any, Any]) -> str:
    return _printed(item[0])


STRIPPED: frozenset[FieldPath] = frozenset(
    [("apiVersion",), ("kind",), ("metadata",)]
    + [
        ("metadata", name)
        for name in (
            "name",
            "namespace",
            "creationTimestamp",
            "selfLink",
            "uid",
            "clusterName",
            "generation",
            "managedFields",
            "resourceVersion",
        )
    ]
)
"""Fields nobody owns: the API server strips them from every manager's set (k8s.io/apimachinery
``pkg/util/managedfields/internal/stripmeta.go``)."""


def strip_meta(paths: set[FieldPath]) -> set[FieldPath]:
    """``paths`` without the fields nobody owns (``STRIPPED``)."""
    return {path for path in paths if path not in STRIPPED}


def changed_fields(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> tuple[set[FieldPath], set[FieldPath]]:
    """``(added or modified, removed)`` leaf fields from ``before`` to ``after`` (structured-merge-diff's
    ``TypedValue.Compare``), the fields nobody owns left out: what an update gives its manager, and what it takes
    from every other manager (``merge/update.go``, ``Updater.update``)."""
    schema = Schema.of(dict(after or before or {}))
    old = strip_meta(field_paths(dict(before or {}), schema))
    new = strip_meta(field_paths(dict(after), schema))
    taken = {path for path in new if path not in old or value_at(before, path) != value_at(after, path)}
    return taken, old - new


def update_ownership(
    owners: Mapping[Manager, set[FieldPath]], manager: Manager, taken: set[FieldPath], removed: set[FieldPath]
) -> dict[Manager, set[FieldPath]]:
    """The owners after ``manager`` updated the object (``changed_fields``): every other manager loses what it
    changed or removed, ``manager`` keeps what it owned (but the removed fields) and gains what it changed;
    a manager left with nothing is dropped (structured-merge-diff ``merge/update.go``, ``Updater.Update``)."""
    after = {other: set(fields) - taken - removed for other, fields in owners.items()}
    after[manager] = after.get(manager, set()) | taken
    return {other: fields for other, fields in after.items() if fields}


def render_path(path: FieldPath) -> str:
    parts = []
    for segment in path:
        if isinstance(segment, tuple):
            parts.append("[" + ",".join(f"{k}={v}" for k, v in segment[1]) + "]")
        else:
            parts.append(f".{segment}")
    return "".join(parts)


def managed_fields(
    owners: Mapping[Any, set[FieldPath]],
    api_version: str,
    time: str | None,
    times: Mapping[Manager, str | None] | None = None,
) -> list[dict[str, Any]]:
    """``metadata.managedFields`` for these owners (``Manager``s, or appliers' names), FieldsV1. An applier's
    entry shows ``api_version`` (an updater's its own); each entry's time is ``times[manager]`` when given
    (``None``: no time, as an apply that changed nothing leaves a new co-owner), else ``time``. Sorted as the API
    server sorts them (apimachinery ``internal/managedfields.go``, ``sortEncodedManagedFields``): appliers first,
    then by time, name, API version and subresource."""
    entries = []
    for key, owned in owners.items():
        if not owned:
            continue
        manager = key if isinstance(key, Manager) else Manager(str(key))
        tree: dict[str, Any] = {}
        for path in owned:
            node = tree
            for segment in path:
                name = "k:" + json_text(dict(segment[1])) if isinstance(segment, tuple) else f"f:{segment}"
                node = node.setdefault(name, {})
        entry: dict[str, Any] = {
            "manager": manager.name,
            "operation": manager.operation,
            "apiVersion": manager.api_version or api_version,
        }
        when = times[manager] if times is not None and manager in times else time
        if when is not None:
            entry["time"] = when
        entry.update(fieldsType="FieldsV1", fieldsV1=tree)
        if manager.subresource:
            entry["subresource"] = manager.subresource
        entries.append(entry)
    entries.sort(
        key=lambda e: (e["operation"], e.get("time") or "", e["manager"], e["apiVersion"], e.get("subresource", ""))
    )
    return entries


def json_text(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _remove(
    live: Any,
    previous: Any,
    current: Any,
    schema: Schema,
    kept: frozenset[FieldPath] = NOBODY_ELSE,
    prefix: FieldPath = (),
) -> Any:
    """``live`` without what ``previous`` applied and ``current`` no longer does, except the fields
    another manager owns too (``kept``)."""
    if isinstance(previous, dict) and isinstance(live, dict):
        result = dict(live)
        current_map = current if isinstance(current, dict) else {}
        for name, value in previous.items():
            if name not in result:
                continue
            path, child = (*prefix, name), schema.field(name)
            if name not in current_map:
                if isinstance(value, dict) and isinstance(result[name], dict):
                    result[name] = _remove(result[name], value, {}, child, kept, path)
                elif isinstance(value, list) and isinstance(result[name], list) and child.list_keys():
                    result[name] = _remove(result[name], value, [], child, kept, path)
                elif path not in kept:
                    del result[name]
            else:
                result[name] = _remove(result[name], value, current_map[name], child, kept, path)
        return result
    keys = schema.list_keys()
    if isinstance(previous, list) and isinstance(live, list) and keys:
        current_items = {_key(item, keys): item for item in (current if isinstance(current, list) else [])}
        previous_items = {_key(item, keys): item for item in previous}
        result_list = []
        for item in live:
            key = _key(item, keys)
            segment = (*prefix, _item_segment(item, keys))
            shared = any(path[: len(segment)] == segment for path in kept)
            if key in previous_items and key not in current_items and not shared:
                continue  # the manager dropped this item, and nobody else owns any of it
            if key in previous_items:
                item = _remove(item, previous_items[key], current_items.get(key, {}), schema.items(), kept, segment)
            result_list.append(item)
        return result_list
    return live


def _merge(live: Any, applied: Any, schema: Schema) -> Any:
    if isinstance(live, dict) and isinstance(applied, dict):
        result = dict(live)
        for name, value in applied.items():
            if value is None:  # a patch's null deletes (an apply has none)
                result.pop(name, None)
            else:
                result[name] = _merge(result[name], value, schema.field(name)) if name in result else value
        return result
    keys = schema.list_keys()
    if isinstance(live, list) and isinstance(applied, list) and keys:
        result_list = list(live)
        positions = {_key(item, keys): index for index, item in enumerate(result_list)}
        for item in applied:
            key = _key(item, keys)
            if key in positions:
                result_list[positions[key]] = _merge(result_list[positions[key]], item, schema.items())
            else:
                positions[key] = len(result_list)
                result_list.append(item)
        return result_list
    return copy.deepcopy(applied)


def apply(
    live: dict[str, Any] | None,
    previous: dict[str, Any] | None,
    applied: dict[str, Any],
    others: frozenset[FieldPath] = NOBODY_ELSE,
) -> dict[str, Any]:
    """The object after a manager whose last apply was ``previous`` applies ``applied``; ``others``:
    the fields other managers own (they stay when this manager leaves them out)."""
    schema = Schema.of(applied)
    if live is None:
        return copy.deepcopy(applied)
    base = _remove(copy.deepcopy(live), previous or {}, applied, schema, others)
    return _merge(base, applied, schema)


def strategic_merge(live: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """``live`` after a strategic merge patch (without ``$patch`` directives): keyed lists merge item by item."""
    return _merge(copy.deepcopy(live), patch, Schema.of(live))


def merge_patch(before: Any, after: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``before`` into ``after``."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return after
    patch: dict[str, Any] = {name: None for name in before if name not in after}
    for name, value in after.items():
        if name not in before:
            patch[name] = value
        elif before[name] != value:
            patch[name] = merge_patch(before[name], value) if isinstance(value, dict) else value
    return patch


# ---------------------------------------------------------------- the applied object's typed validation


def _relationship(node: dict[str, Any] | None) -> tuple[str, tuple[str, ...]]:
    """A list's element relationship and keys, as kube-openapi converts a schema for structured-merge-diff
    (``pkg/schemaconv/smd.go``, ``getListElementRelationship``): ``x-kubernetes-list-type`` (``map`` with its
    keys, ``set``), else a ``merge`` patch strategy (with its merge key: a map; without one: a set), else
    atomic."""
    if node is None:
        return "atomic", ()
    list_type = node.get("x-kubernetes-list-type")
    if list_type is not None:
        if list_type == "map":
            return "associative", tuple(node.get("x-kubernetes-list-map-keys") or ())
        return ("associative", ()) if list_type == "set" else ("atomic", ())
    if node.get("x-kubernetes-patch-strategy") in ("merge", "merge,retainKeys"):
        key = node.get("x-kubernetes-patch-merge-key")
        return "associative", (key,) if isinstance(key, str) else ()
    return "atomic", ()


def _go_text(value: Any) -> str:
    """A value as structured-merge-diff's ``value.ToString`` prints it (strings quoted, as Go's ``%q``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ",".join(_go_text(item) for item in value) + "]"
    if isinstance(value, dict):
        return "".join(f"{key}={_go_text(item)}" for key, item in value.items())
    return str(value)


def _item_element(item: Any, keys: tuple[str, ...], item_schema: Schema) -> str:
    """The path element of an associative list's item (structured-merge-diff ``typed/helpers.go``,
    ``keyedAssociativeListItemToPathElement`` / ``setItemToPathElement``, printed by ``fieldpath``'s
    ``PathElement.String``); ``ValueError`` with the library's words when the item cannot have one."""
    if not keys:  # a set of scalars
        if isinstance(item, dict):
            raise ValueError("associative list without keys has an element that's a map type")
        if isinstance(item, list):
            raise ValueError("not supported: associative list with lists as elements")
        if item is None:
            raise ValueError("associative list without keys has an element that's an explicit null")
        return f"[={_go_text(item)}]"
    if item is None:
        raise ValueError("associative list with keys may not have a null element")
    if not isinstance(item, dict):
        raise ValueError("associative list with keys may not have non-map elements")
    fields = {}
    for key in keys:
        default = ((item_schema.node or {}).get("properties") or {}).get(key, {}).get("default")
        value = item.get(key, default if default is not None else DEFAULT_KEY_VALUES.get(key))
        if value is not None:
            fields[key] = value
    if not fields:
        raise ValueError(
            f"associative list with keys has an element that omits all key fields {_go_text(list(keys))} "
            "(and doesn't have default values for any key fields)"
        )
    return "[" + ",".join(f"{key}={_go_text(fields[key])}" for key in sorted(fields)) + "]"


def typed_errors(value: Any, schema: Schema, path: str = "") -> list[str]:
    """What structured-merge-diff's validation of an applied object refuses, as ``<path>: <message>``
    (``typed/validate.go``: ``visitListItems``, ``visitMapItems``): an associative list whose items repeat a
    key ("duplicate entries for key [name=\"A\"]"), an item that cannot have a key. Without the live object:
    the API server validates the applied configuration alone, with duplicates forbidden
    (k8s.io/apimachinery ``pkg/util/managedfields/internal/structuredmerge.go``, ``Apply``: "Don't allow
    duplicates in the applied object"), and the live object with ``typed.AllowDuplicates``."""
    errors: list[str] = []
    if isinstance(value, dict):
        for name, item in value.items():
            errors += typed_errors(item, schema.field(name), f"{path}.{name}")
    elif isinstance(value, list):
        relationship, keys = _relationship(schema.node)
        items = schema.items()
        seen: set[str] = set()
        for index, item in enumerate(value):
            element = f"[{index}]"
            if relationship == "associative":
                try:
                    element = _item_element(item, keys, items)
                except ValueError as error:
                    return [*errors, f"{path}: element {index}: {error}"]  # nothing deeper can be reported
                if element in seen:
                    errors.append(f"{path}: duplicate entries for key {element}")
                seen.add(element)
            errors += typed_errors(item, items, f"{path}{element}")
    return errors


def typed_patch_refusal(applied: dict[str, Any], schema: Schema) -> str | None:
    """The message of the API server's refusal of an apply whose configuration fails typed validation
    (``typed_errors``), or ``None``. The field manager returns a plain error (``structuredmerge.go``:
    ``failed to create typed patch object (%v): %v`` with ``objectGVKNN``), which the API server answers as
    a 500 with no reason (kubernetes/apiserver ``pkg/endpoints/handlers/responsewriters/status.go``,
    ``ErrorToAPIStatus``: an error that is not a Status); several errors are listed as structured-merge-diff's
    ``ValidationErrors.Error`` lists them."""
    errors = typed_errors(applied, schema)
    if not errors:
        return None
    metadata = applied.get("metadata") if isinstance(applied.get("metadata"), dict) else {}
    group, _, version = str(applied.get("apiVersion", "")).rpartition("/")
    kind = f"{group}/{version}, Kind={applied.get('kind')}"  # apimachinery GroupVersionKind.String
    where = f"{metadata.get('namespace') or ''}/{metadata.get('name') or ''}; {kind}"
    listed = errors[0] if len(errors) == 1 else "\n".join(["errors:", *(f"  {error}" for error in errors)])
    return f"failed to create typed patch object ({where}): {listed}"
