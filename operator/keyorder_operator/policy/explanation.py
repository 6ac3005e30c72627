"""The words of a decision: durations, the net drain time and its ETA, and the one-line description
of a resize that status, Events and ``keyorder simulate`` show.

Formatting only, of figures the decision already has, so that every step that explains itself (the
bounds, the step cost, the decision) can use it without importing the others.
"""

from __future__ import annotations

import math

from keyorder_operator.policy.model import Observation, ScalingLimits, Size


def duration(seconds: float) -> str:
    """Human-sized duration for reasons and Events: 45 s, 12.5 min, 3.2 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


STEADY_BAND = 0.02
"""Drain and arrivals within this share of each other: the group keeps up, and the lag is only what
is in flight (it holds at its level)."""


def net_drain_seconds(lag: int, drain: float | None, arrivals: float | None) -> float | None:
    """Seconds until the lag is worked off, net of arrivals: ``lag / (drain - arrivals)`` while the lag
    shrinks; ``lag / drain`` while the group just keeps up (the lag is what is in flight); ``inf``
    while the lag grows; ``None`` before a drain rate is measured."""
    if lag == 0:
        return 0.0
    if drain is None:
        return None
    arriving = arrivals or 0.0
    net = drain - arriving
    band = STEADY_BAND * max(drain, arriving)
    if net > band:
        return lag / net
    if net >= -band and drain > 0:
        return lag / drain
    return math.inf


def drain_eta(observation: Observation, arrivals: float) -> str:
    """The drain ETA in words: ``growing`` (with both rates) when the lag does not shrink."""
    lag = observation.lag or 0
    drain = observation.drain_rate
    if lag == 0:
        return "drained"
    seconds = net_drain_seconds(lag, drain, arrivals)
    if seconds is None or drain is None:
        return "unknown (no drain measured yet)"
    if math.isinf(seconds):
        return f"growing (arrivals {arrivals:.0f}/s, drain {drain:.0f}/s)"
    return duration(seconds)


def _describe(before: Size, after: Size, observation: Observation, limits: ScalingLimits, arrivals: float) -> str:
    facts = (
        f"lag {observation.lag or 0}, drain ETA {drain_eta(observation, arrivals)}, "
        f"target {duration(limits.target_drain_seconds)}"
    )
    changes = []
    if after.replicas != before.replicas:
        changes.append(f"replicas {before.replicas}\u2192{after.replicas}")
    if after.workers != before.workers:
        changes.append(f"workers/pod {before.workers}\u2192{after.workers}")
    if not changes:
        return f"kept {before.replicas} replicas x {before.workers} workers: {facts}"
    return f"scaled {', '.join(changes)}: {facts}"


def _size_words(size: Size) -> str:
    return f"{size.replicas} replicas x {size.workers} workers"
