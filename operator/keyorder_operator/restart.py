"""What survives an operator restart: the autoscaler's memory kept in ``status.autoscaler`` at a bounded
write rate, and each resource's first poll after a start, spread over its interval.

Between polls the autoscaler's memory lives in the operator's process (``context.PollMemory``), because
status is written only when something in it changed: a steady poll writes nothing. A restarted operator,
or the replica that takes over in a failover, has only status. So the part of the memory that decisions
depend on beyond the next poll or two, the *record*, is kept in ``status.autoscaler``:

- the stabilization windows' recommendations (only those a window can still use: ``policy.window_memory``);
- the replica changes the rate limits count, the scale step under way and the measured step costs;
- what was learned: the efficiency and drain-rate samples, the rate and its source, the workload they
  belong to, the CPU bound on workers per pod;
- the limit in force (kept while the pods' view is hidden) and the polls it has been gone;
- the last intervals' arrival rates and when the newest was measured (``arrivalsAt``): a rise counts once
  it lasted ``policy.ARRIVAL_SAMPLES`` polls, which an operator restarting every minute would never see
  if they were measured afresh; ``policy.resumed`` drops them when they are stale;
- the failed observations in a row (the fallback counts them) and the polls in a row with silent pods.

What describes the last poll or two (``policy.MEASURED_EACH_POLL``: the pods' totals and the lag at the
last poll, the last handler time) is left out and measured again after a start. Times are
wall-clock instants (ISO 8601, UTC, to the millisecond), the clock the policy's ``now`` comes from. The
replica that wrote them may have had another clock: a time later than this one's by more than
``RECORD_CLOCK_SKEW_SECONDS`` (or no instant at all, such as ``1e20`` seconds) makes the record unreadable
(``RecordError``, naming the field; the autoscaler starts afresh and the record is written again), and
``policy.resumed`` takes a time up to that much later as now.

The record is written when it differs from the stored one in a way a restarted operator would decide
differently on (``record_changes``), at most once per ``AUTOSCALER_SAVE_SECONDS`` per resource, and with
every resize (which writes status anyway). A steady resource writes nothing; a restart loses at most
the last ``AUTOSCALER_SAVE_SECONDS`` of changes, and the newest recommendation, repeated since it was
written, counts as made up to the restart (``policy.resumed``).

A failover is a restart without a new process: with kopf's peering, a standby replica's timers do not
run until it takes over, maybe hours after it started, and a replica paused meanwhile (another one with a
higher priority came) runs them again later with its memory from before the pause, while the replica
that acted meanwhile wrote status. So the memory of a resource that this process has not looked at
for longer than ``memory_lasts`` (two poll intervals and a tick: at least one poll missed) is dropped
and the poll resumes from status, as after a restart.

A started operator, or one that takes over, finds every resource due: without a spread, its first tick
would poll them all at once, a burst at Kafka and the API server. The moment it became active is the
first tick of any resource after ``ACTIVE_GAP_TICKS`` ticks without one (``became_active``; or its start,
when a tick came sooner). A resource that existed before that moment is first polled at its own moment
of its first interval from there (``first_poll_at``: a share of the interval from a digest of its UID,
so the moments are spread evenly and stay put across restarts); one created since (or up to
``CREATED_JUST_BEFORE_SECONDS`` before: the first tick that made the operator active may be its own) is
polled at once.

Pure, time a parameter: the poll (``poll.Poll``) reads status and writes the record.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from keyorder_operator.policy import (
    HOLD_POLLS,
    RISE_BAND,
    RateSource,
    ScalingLimits,
    ScalingState,
    Size,
    scale_up_rates,
    window_memory,
)
from keyorder_operator.status import state_from_memory, state_to_status

AUTOSCALER_SAVE_SECONDS = 30.0
"""At most one write of ``status.autoscaler`` per resource in this many seconds (besides the one that
rides along with a resize): with 500 resources whose recommendations all change on every poll, about 17
writes a second at most. It is also the most a restart or failover loses of the autoscaler's memory: a
fraction of the default 300 s scale-down window."""

LEARNED_TOLERANCE = 0.05
"""A learned figure (the median efficiency, the median drain rate per worker, a kept rate) that moved by
less than this share is not worth a write on its own: it rides along with the next one."""

NOT_RECORDED = frozenset(
    {
        "drainableLag",
        "handlerSeconds",
        "heldPolls",
        "idlePolls",
        "podTotals",
        "podTotalsAt",
        "polledAt",
        "saturated",
        "settled",
    }
)
"""The ``state_to_status`` keys of ``policy.MEASURED_EACH_POLL``: left out of the record."""


RECORD_CLOCK_SKEW_SECONDS = 60.0
"""How much later than this operator's clock a time in ``status.autoscaler`` may be: the replica that wrote
it (before a failover) may have a clock a little ahead. Up to this, ``policy.resumed`` takes the time as
now; beyond it the record is refused (a recommendation dated tomorrow would hold a scale-down until
tomorrow)."""

MEMORY_GAP_INTERVALS = 2
"""A resource's memory not looked at for this many poll intervals (and a tick) is dropped (``memory_lasts``)."""

ACTIVE_GAP_TICKS = 3
"""No tick of any resource for this many ticks: the operator was paused (a kopf peering standby), or had
nothing to poll; the next tick is when it became active again (``became_active``)."""

CREATED_JUST_BEFORE_SECONDS = 5.0
"""A resource created this little before the operator became active counts as created since (its first
poll is not spread): kopf starts a new resource's timer a moment after the creation, and that first tick
may be the one that made the operator active."""


class RecordError(ValueError):
    """``status.autoscaler`` cannot be read; the message names the field."""


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def instant(seconds: float) -> str:
    """A wall-clock time as status keeps it: ISO 8601, UTC, to the millisecond."""
    moment = EPOCH + timedelta(milliseconds=round(seconds * 1000))
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def seconds_of(value: Any, field: str, now: float | None = None) -> float:
    """A time from status: an ISO 8601 instant, or seconds since the epoch (an older release's record). With
    ``now``, a time later than it by more than ``RECORD_CLOCK_SKEW_SECONDS`` is refused too."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
            if moment.tzinfo is None:
                moment = moment.replace(tzinfo=UTC)
            seconds = (moment - EPOCH).total_seconds()
        except (OverflowError, ValueError):
            raise RecordError(f"{field}: {value!r} is not an ISO 8601 time") from None
    else:
        raise RecordError(f"{field}: expected an ISO 8601 time, got {value!r}")
    try:
        instant(seconds)  # a time status can hold again: finite, in the years 1 to 9999
    except (OverflowError, ValueError):
        raise RecordError(f"{field}: {value!r} is out of range (a time in the years 1 to 9999)") from None
    if now is not None and seconds > now + RECORD_CLOCK_SKEW_SECONDS:
        raise RecordError(
            f"{field}: {instant(seconds)} is {seconds - now:.0f} s later than this operator's clock "
            f"({instant(now)}; more than {RECORD_CLOCK_SKEW_SECONDS:.0f} s): written by a clock ahead of it"
        )
    return seconds


def _entries(value: Any, field: str, width: int) -> list[list[Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise RecordError(f"{field}: expected a list, got {value!r}")
    for index, item in enumerate(value):
        if not (isinstance(item, list) and len(item) == width):
            raise RecordError(f"{field}[{index}]: expected a list of {width} items, got {item!r}")
        for position, number in enumerate(item[1:], start=1):
            if not (isinstance(number, int) and not isinstance(number, bool) and number >= 0):
                raise RecordError(f"{field}[{index}][{position}]: expected a count, got {number!r}")
    return value


def record_of(state: ScalingState, saved_at: float) -> dict[str, Any]:
    """``status.autoscaler`` for ``state``, written at ``saved_at``."""
    memory = {
        key: value
        for key, value in state_to_status(state).items()
        if key not in NOT_RECORDED and value is not None and value != []
    }
    memory["recommendations"] = [[instant(at), replicas, workers] for at, replicas, workers in state.recommendations]
    if state.replica_changes:
        memory["replicaChanges"] = [[instant(at), before] for at, before in state.replica_changes]
    if state.step_started_at is not None:
        memory["stepStartedAt"] = instant(state.step_started_at)
    memory.pop("arrivalsAt", None)  # an instant, as every time in the record
    if state.arrival_samples and state.arrivals_at is not None:
        memory["arrivalsAt"] = instant(state.arrivals_at)
    return {"savedAt": instant(saved_at), **memory}


def state_from_record(record: Any, current: Size, now: float | None = None) -> ScalingState:
    """The state ``status.autoscaler`` holds, at size ``current`` (not yet ``policy.resumed``). Reads
    records of older releases too (times in seconds, the whole state); raises ``RecordError`` naming
    the field when it cannot be read, or (given ``now``) when a time in it is later than ``now`` by more
    than ``RECORD_CLOCK_SKEW_SECONDS``."""
    field = "status.autoscaler"
    if not isinstance(record, dict):
        raise RecordError(f"{field}: expected a map, got {record!r}")
    memory = dict(record)
    memory["recommendations"] = [
        [seconds_of(at, f"{field}.recommendations[{index}][0]", now), replicas, workers]
        for index, (at, replicas, workers) in enumerate(
            _entries(record.get("recommendations"), f"{field}.recommendations", 3)
        )
    ]
    memory["replicaChanges"] = [
        [seconds_of(at, f"{field}.replicaChanges[{index}][0]", now), before]
        for index, (at, before) in enumerate(_entries(record.get("replicaChanges"), f"{field}.replicaChanges", 2))
    ]
    if record.get("stepStartedAt") is not None:
        memory["stepStartedAt"] = seconds_of(record["stepStartedAt"], f"{field}.stepStartedAt", now)
    if record.get("arrivalsAt") is not None:
        memory["arrivalsAt"] = seconds_of(record["arrivalsAt"], f"{field}.arrivalsAt", now)
    try:
        return state_from_memory(memory, current)
    except (TypeError, ValueError, IndexError) as error:
        raise RecordError(f"{field}: {type(error).__name__}: {error}") from None


def saved_at(record: Any, now: float | None = None) -> float | None:
    """When ``status.autoscaler`` was written (``None``: never, or by a release that did not say); refused
    as ``state_from_record`` refuses a time."""
    if not isinstance(record, dict) or record.get("savedAt") is None:
        return None
    return seconds_of(record["savedAt"], "status.autoscaler.savedAt", now)


def as_recorded(state: ScalingState) -> ScalingState:
    """``state`` as it reads back from its record (times to the millisecond, per-poll figures left out)."""
    return state_from_record(record_of(state, 0.0), state.current)


def _median(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def _moved(before: float | None, after: float | None, tolerance: float = LEARNED_TOLERANCE) -> bool:
    if before is None or after is None:
        return (before is None) != (after is None)
    return abs(after - before) > tolerance * max(abs(before), abs(after))


def _arrivals_moved(stored: ScalingState, live: ScalingState) -> bool:
    """Whether the arrival samples a restart would resume differ from the live ones: in number, or an
    interval's rate by more than ``policy.RISE_BAND`` (within it, one level: noise writes nothing; a
    periodic producer's samples shift on every poll, and are written at the rate limit)."""
    before, after = stored.arrival_samples, live.arrival_samples
    return len(before) != len(after) or any(_moved(old, new, RISE_BAND) for old, new in zip(before, after, strict=True))


def _windows(state: ScalingState, now: float, limits: ScalingLimits) -> tuple[Any, ...]:
    """The windows' memory as a restart would resume it: every entry but the newest with its time, the
    newest without (``policy.resumed`` takes it as made at the restart)."""
    kept = window_memory(state.recommendations, now, limits)
    return (kept[:-1], kept[-1][1:]) if kept else ()


def _learned(state: ScalingState) -> tuple[Any, ...]:
    """What was learned, as far as a later decision tells apart: whether the pods ever reported a handler
    time (``policy.learn_rate`` then stops learning from the drain; a poll that only keeps the rate is no
    news), the workload it belongs to, the CPU bound."""
    reported = state.rate_source in (RateSource.HANDLER_TIME, RateSource.KEPT)
    return (reported, state.workload, state.cpu_workers_per_pod)


def record_changes(
    stored: ScalingState | None, live: ScalingState, limits: ScalingLimits, now: float
) -> tuple[str, ...]:
    """What in ``live`` (the memory after this poll's decision) a restart from ``stored`` (the record in
    status) would not know, by the record's field names; empty when a restarted operator would decide
    as this one will. Counts of polls in a row matter up to where they act (the fallback's threshold,
    ``HOLD_POLLS`` silent polls); learned figures when they moved by more than ``LEARNED_TOLERANCE``."""
    if stored is None:
        return ("record",)
    live = as_recorded(live)
    changes = []
    if _windows(stored, now, limits) != _windows(live, now, limits):
        changes.append("recommendations")
    longest = max((rate.period_seconds for rate in (*scale_up_rates(limits), *limits.scale_down_rates)), default=0)
    if [c for c in stored.replica_changes if c[0] >= now - longest] != [
        c for c in live.replica_changes if c[0] >= now - longest
    ]:
        changes.append("replicaChanges")
    if (stored.step_started_at, stored.step_seconds) != (live.step_started_at, live.step_seconds):
        changes.append("stepSeconds")
    if _arrivals_moved(stored, live):
        changes.append("arrivalSamples")
    kept_rate = live.rate_source is not RateSource.HANDLER_TIME and _moved(stored.per_worker_rate, live.per_worker_rate)
    if (
        _learned(stored) != _learned(live)
        or _moved(_median(stored.efficiency_samples), _median(live.efficiency_samples))
        or _moved(_median(stored.rate_samples), _median(live.rate_samples))
        or kept_rate
    ):
        changes.append("learned")
    stored_limit = (stored.limit.kind if stored.limit else None, stored.limit_gone_polls)
    if stored_limit != (live.limit.kind if live.limit else None, live.limit_gone_polls):
        changes.append("limit")
    if min(stored.failed_observations, limits.fallback_after) != min(live.failed_observations, limits.fallback_after):
        changes.append("failedObservations")
    if min(stored.silent_polls, HOLD_POLLS) != min(live.silent_polls, HOLD_POLLS):
        changes.append("silentPolls")
    return tuple(changes)


def save_due(changes: tuple[str, ...], resized: bool, last_saved: float | None, now: float, every: float) -> bool:
    """Whether to write the record now: something a restart would miss changed, and either the size
    changed too (status is written for it anyway) or the last write is ``every`` seconds old."""
    if not changes:
        return False
    if resized or last_saved is None or "record" in changes:
        return True
    return now - last_saved >= every or now < last_saved  # a clock set back does not stop the writes


def memory_lasts(interval: float, tick: float) -> float:
    """Seconds a resource's memory in the process stays good without a look at the resource: two poll
    intervals (an interval is at least a tick) and a tick. A longer gap missed at least one poll: the
    replica was paused (kopf's peering) and another one may have polled and written status since."""
    return MEMORY_GAP_INTERVALS * max(interval, tick) + tick


def became_active(last_tick: float | None, now: float, tick: float) -> bool:
    """Whether a tick at ``now`` (monotonic) is the first after a silence: no tick of any resource since
    ``last_tick`` for more than ``ACTIVE_GAP_TICKS`` ticks (``None``: none ever)."""
    return last_tick is None or now - last_tick > ACTIVE_GAP_TICKS * tick


def first_poll_at(uid: str, started_at: float, interval: float) -> float:
    """When a resource that existed before the operator started (or became active) is first polled: its
    own share of the first interval, from a digest of its UID (even over the interval, the same after
    every restart)."""
    share = int.from_bytes(hashlib.sha256(uid.encode()).digest()[:8], "big") / 2**64
    return started_at + share * interval


def existed_before(created: Any, started_at: float) -> bool:
    """Whether a resource's ``metadata.creationTimestamp`` (whole seconds) is before the second the
    operator started (or became active) in. Unknown: no (it is polled at once)."""
    if not isinstance(created, str):
        return False
    try:
        return seconds_of(created, "metadata.creationTimestamp") < math.floor(started_at)
    except RecordError:
        return False


def first_poll_spread(created: Any, active_since: float) -> bool:
    """Whether a resource's first poll since the operator became active at ``active_since`` waits for its
    moment (``first_poll_at``): it existed more than ``CREATED_JUST_BEFORE_SECONDS`` before."""
    return existed_before(created, active_since - CREATED_JUST_BEFORE_SECONDS)
