"""The status a poll compares against: the resource's status as kopf last saw it, with this operator's own
last writes laid over it until the watch shows them. Pure: the poll keeps the ``WrittenStatus`` in its
memory (``context.PollMemory``) and passes the time in, from the monotonic clock (``Poll.monotonic``): a
wall clock set back would hold a lost write for as long, and one set forward would drop every awaited one.

Why: status is written only when something in it changed (``poll.drop_unchanged``), and a condition's
``lastTransitionTime`` moves only when its ``status`` does (``status.set_condition``). Both compare with
the body kopf hands the poll, which is the last watch event kopf has processed. Under load (hundreds of
resources, each poll's write a watch event for kopf's event loop) that body can lag behind the operator's
own last write by more than a poll interval. Compared with it, a poll that decides what it decided before
rewrites its last write (the same decision with the time of the stale body's, conditions with transition
times of the older status), every such write is one more watch event, and the lag grows: at 500
resources the operator wrote status 70 times a second and a poll came every 10 s instead of 5 (issue 35,
``tools/operator_scale_bench.py --scale-to-zero``). The poll is the only writer of the fields and
conditions it writes, so what it last wrote is what the API server holds, until the watch shows it.

A written field is laid over the body until the body shows it, or for at most ``CATCH_UP_SECONDS``: a write
that never shows (it failed, or another writer, a failed-over operator, changed the field since) is then
compared with the body again, and written again if it differs. A replica paused longer than
``restart.memory_lasts`` (kopf's peering) drops its memory, this with it: what it wrote before the pause is
not laid over what its successor wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CATCH_UP_SECONDS = 60.0
"""How long a written field is laid over a body that does not show it (kopf's watch lags under load by
seconds to tens of seconds; past this, the write is taken as lost and compared with the body again)."""


def merge_patched(stored: Any, patch: Any) -> Any:
    """``stored`` after a JSON merge patch (RFC 7386, what kopf sends for ``patch.status``): a map merges
    key by key, ``None`` removes a key, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(stored) if isinstance(stored, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patched(result.get(key), value)
    return result


@dataclass(frozen=True)
class WrittenStatus:
    """What this process wrote to one resource's status that its watched body may not show yet."""

    fields: dict[str, tuple[Any, float]] = field(default_factory=dict)
    """Top-level status field -> (its value as stored after the write, ``None``: removed; when written, on
    the monotonic clock)."""
    conditions: dict[str, tuple[dict[str, Any], float]] = field(default_factory=dict)
    """Condition type -> (the condition as written; when written, on the monotonic clock)."""

    def __bool__(self) -> bool:
        return bool(self.fields or self.conditions)


def _conditions_by_type(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c.get("type")): c for c in status.get("conditions") or [] if isinstance(c, dict)}


def still_awaited(
    status: dict[str, Any], written: WrittenStatus | None, now: float, catch_up_seconds: float = CATCH_UP_SECONDS
) -> WrittenStatus:
    """The part of ``written`` that ``status`` (the watched body's) does not show yet, written less than
    ``catch_up_seconds`` before ``now`` (monotonic, as the times in ``written``)."""
    if not written:
        return WrittenStatus()
    conditions = _conditions_by_type(status)
    return WrittenStatus(
        {
            key: (value, at)
            for key, (value, at) in written.fields.items()
            if status.get(key) != value and now - at < catch_up_seconds
        },
        {
            kind: (condition, at)
            for kind, (condition, at) in written.conditions.items()
            if conditions.get(kind) != condition and now - at < catch_up_seconds
        },
    )


def with_written(status: dict[str, Any], written: WrittenStatus) -> dict[str, Any]:
    """``status`` with the written fields and conditions laid over it: the status as the API server holds
    it after this process's writes (other writers' fields and conditions as ``status`` has them)."""
    if not written:
        return status
    view = dict(status)
    for key, (value, _) in written.fields.items():
        if value is None:
            view.pop(key, None)
        else:
            view[key] = value
    if written.conditions:
        replaced = {kind: condition for kind, (condition, _) in written.conditions.items()}
        conditions = [replaced.pop(str(c.get("type")), c) for c in status.get("conditions") or []]
        view["conditions"] = conditions + list(replaced.values())
    return view


def after_write(
    written: WrittenStatus,
    compared: dict[str, Any],
    status_patch: dict[str, Any],
    conditions: list[dict[str, Any]],
    now: float,
) -> WrittenStatus:
    """``written`` with one more write: ``status_patch`` (the merge patch of the status fields, as sent)
    applied to ``compared`` (the status the poll compared against), and ``conditions`` (those whose write
    was handed to kopf; empty: none), made at ``now`` (monotonic)."""
    fields = dict(written.fields)
    for key, value in status_patch.items():
        fields[key] = (merge_patched(compared.get(key), value) if value is not None else None, now)
    kinds = dict(written.conditions)
    for condition in conditions:
        kinds[str(condition.get("type"))] = (condition, now)
    return WrittenStatus(fields, kinds)


def changed_conditions(
    compared: dict[str, Any], conditions: list[dict[str, Any]], owned: frozenset[str]
) -> list[dict[str, Any]]:
    """The conditions of the ``owned`` types in ``conditions`` that differ from ``compared``'s (a write
    is needed only for these)."""
    stored = _conditions_by_type(compared)
    return [c for c in conditions if c.get("type") in owned and stored.get(str(c.get("type"))) != c]
