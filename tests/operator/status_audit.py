"""What the OrderedConsumers' status writes changed, as the emulator stored them: the proof that a steady
operator writes nothing, and that a time in status moves only when what it dates changes.

Why a module of its own: the request count alone cannot tell a write that changed a field from one the
API server stored as a no-op, nor a condition whose ``lastTransitionTime`` moved without a transition
(Kubernetes API conventions: it moves only when ``status`` changes; apimachinery's
``meta.SetStatusCondition``, k8s.io/apimachinery ``pkg/api/meta/conditions.go``). ``StatusAudit`` wraps
the emulator's request entry point (every write to ``.../orderedconsumers/NAME/status``, with its HTTP
code) and its store (the status before and after each stored change), class-wide while installed; the
operator-level tests and ``tools/operator_scale_bench.py`` read the same counts.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.operator.emulator import Emulator

PLURAL = "orderedconsumers"


@dataclass
class Moved:
    """A time in status that moved although what it dates did not change."""

    name: str
    what: str
    """``conditions[TYPE].lastTransitionTime`` or ``lastDecision.time``."""
    before: Any
    after: Any


@dataclass
class AuditCounts:
    """What the audited writes did (a ``StatusAudit.counts()`` snapshot, or the difference of two)."""

    requests: Counter[int] = field(default_factory=Counter)
    """Write requests (PATCH, PUT) to an OrderedConsumer's status subresource, by HTTP status code."""
    stored: int = 0
    """Of them, the writes that changed the stored status (the others were no-ops or refused)."""
    by_resource: Counter[str] = field(default_factory=Counter)
    """Stored status changes per OrderedConsumer name."""
    fields: Counter[str] = field(default_factory=Counter)
    """Stored status changes per top-level status field (a condition as ``conditions[TYPE]``)."""
    moved: list[Moved] = field(default_factory=list)
    """Times that moved without a change of what they date."""

    @property
    def write_requests(self) -> int:
        return sum(self.requests.values())

    def __sub__(self, earlier: AuditCounts) -> AuditCounts:
        return AuditCounts(
            self.requests - earlier.requests,
            self.stored - earlier.stored,
            self.by_resource - earlier.by_resource,
            self.fields - earlier.fields,
            self.moved[len(earlier.moved) :],
        )

    def summary(self) -> str:
        moved = "; ".join(f"{m.name}: {m.what} {m.before} -> {m.after}" for m in self.moved[:5])
        return (
            f"{self.write_requests} status write requests (by code: {dict(self.requests)}), {self.stored} stored "
            f"changes (fields: {dict(self.fields.most_common(8))}), {len(self.moved)} times moved without a change"
            + (f" (first: {moved})" if moved else "")
        )


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def status_changes(name: str, before: dict[str, Any], after: dict[str, Any]) -> tuple[list[str], list[Moved]]:
    """The status fields that differ between two stored versions (a condition as ``conditions[TYPE]``), and
    the times among them that moved although what they date did not: a condition's ``lastTransitionTime``
    with the same ``status``, ``lastDecision.time`` with the same ``reason``."""
    keys = sorted((set(before) | set(after)) - {"conditions"})
    changed = [key for key in keys if before.get(key) != after.get(key)]
    moved: list[Moved] = []
    old, new = _conditions(before), _conditions(after)
    for kind in sorted(set(old) | set(new)):
        if old.get(kind) == new.get(kind):
            continue
        changed.append(f"conditions[{kind}]")
        was, now = old.get(kind) or {}, new.get(kind) or {}
        same_status = bool(was and now) and was.get("status") == now.get("status")
        if same_status and was.get("lastTransitionTime") != now.get("lastTransitionTime"):
            what = f"conditions[{kind}].lastTransitionTime"
            moved.append(Moved(name, what, was.get("lastTransitionTime"), now.get("lastTransitionTime")))
    was_decision, now_decision = before.get("lastDecision") or {}, after.get("lastDecision") or {}
    if (
        was_decision
        and now_decision
        and was_decision.get("reason") == now_decision.get("reason")
        and was_decision.get("time") != now_decision.get("time")
    ):
        moved.append(Moved(name, "lastDecision.time", was_decision.get("time"), now_decision.get("time")))
    return changed, moved


class StatusAudit:
    """Counts the OrderedConsumers' status writes (see the module docstring). Thread-safe: the emulator's
    loop records, any thread reads."""

    def __init__(self) -> None:
        self._counts = AuditCounts()
        self._lock = threading.Lock()

    def counts(self) -> AuditCounts:
        with self._lock:
            counts = self._counts
            return AuditCounts(
                Counter(counts.requests),
                counts.stored,
                Counter(counts.by_resource),
                Counter(counts.fields),
                list(counts.moved),
            )

    def _request(self, code: int) -> None:
        with self._lock:
            self._counts.requests[code] += 1

    def _stored(self, name: str, before: dict[str, Any], after: dict[str, Any]) -> None:
        changed, moved = status_changes(name, before, after)
        if not changed:
            return
        with self._lock:
            self._counts.stored += 1
            self._counts.by_resource[name] += 1
            self._counts.fields.update(changed)
            self._counts.moved += moved

    @contextlib.contextmanager
    def installed(self) -> Iterator[StatusAudit]:
        """Audit every ``Emulator`` in this process while inside (the class's methods wrapped, then restored)."""
        handle, store = Emulator._handle, Emulator._store
        audit = self

        async def audited_handle(emulator: Emulator, request: Any) -> Any:
            resource = request.resource
            method = str(getattr(request.method, "value", request.method)).upper()
            watched = resource is not None and getattr(resource, "plural", None) == PLURAL
            status_write = watched and request.subresource == "status" and method in ("PATCH", "PUT")
            try:
                response = await handle(emulator, request)
            except Exception as error:
                if status_write:
                    audit._request(int(getattr(error, "status", 0) or 500))
                raise
            if status_write:
                audit._request(int(getattr(response, "status", 200)))
            return response

        def audited_store(emulator: Emulator, key: Any, obj: Any, raw: dict[str, Any]) -> None:
            if getattr(key[0], "plural", None) == PLURAL:
                before = {} if obj.deleted else (obj.raw.get("status") or {})
                audit._stored(str(key[2]), before, raw.get("status") or {})
            store(emulator, key, obj, raw)

        Emulator._handle = audited_handle  # type: ignore[method-assign]
        Emulator._store = audited_store  # type: ignore[method-assign]
        try:
            yield self
        finally:
            Emulator._handle = handle  # type: ignore[method-assign]
            Emulator._store = store  # type: ignore[method-assign]
