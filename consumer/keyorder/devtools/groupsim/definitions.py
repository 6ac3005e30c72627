"""What a scenario is, what its run records and what is measured from that record: the types the
catalogue (``scenarios``), the driver (``driver``) and the judge (``criteria``) share.

They are one room because they name each other: a ``Scenario`` carries its own ``checks``, which read
the ``Measured`` figures of a run; ``Measured`` keeps its ``Run``; a ``Run`` keeps the ``Scenario`` it
ran. Kept apart, the three modules that fill them in imported each other in a circle (criteria ->
driver -> scenarios -> criteria); here they sit below all three, and import only the model and the
operator's ``Size``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from keyorder.devtools.groupsim.model import GroupSettings, SimulatedGroup, Workload
from keyorder_operator.policy import Size


@dataclass(frozen=True)
class Window:
    start: float
    end: float = math.inf

    def holds(self, t: float) -> bool:
        return self.start <= t < self.end


@dataclass(frozen=True)
class Silence:
    """Pods that stop answering ``GET /admin/scaling`` (CPU-starved): the first ``pods`` by name, or all."""

    window: Window
    pods: int | None = 1
    """How many pods (the oldest first); ``None``: every pod."""


@dataclass(frozen=True)
class Criteria:
    """Thresholds a run must meet (``None``: not applicable). Two hold for every scenario and are not
    settable: no exception, and no scale-down while the lag grows."""

    within_target_seconds: float | None = None
    """Most seconds from the disturbance until the backlog drains within the target at the ready capacity."""
    max_overshoot: float | None = None
    """Most peak decided workers / the workers that were needed (shaped as the policy shapes them)."""
    max_underprovisioned_minutes: float | None = None
    """Most minutes in which the decided capacity was below the arrivals while the lag grew."""
    max_replica_changes_per_hour: float | None = None
    steady: Window | None = None
    """Where replica changes per hour are counted."""


Check = Callable[["Measured"], "str | None"]
"""A scenario's own check: ``None`` when it holds, else what went wrong, with the numbers."""


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    spec: Mapping[str, Any]
    duration: float
    arrivals: Callable[[float], float]
    """Mean messages/s produced at simulated second ``t``."""
    criteria: Criteria = field(default_factory=Criteria)
    checks: tuple[Check, ...] = ()
    disturbance: float = 0.0
    """When the trouble starts: the criteria count from here."""
    noise: float = 0.0
    """Arrivals vary by up to +-this share per step (uniform)."""
    bursts: tuple[tuple[float, int], ...] = ()
    """``(t, messages)`` produced within one step."""
    initial_backlog: int = 0
    weights: Callable[[float], tuple[float, ...] | None] = lambda t: None
    """How arrivals are spread over the partitions at ``t`` (``None``: evenly)."""
    workloads: Mapping[str, Workload] = field(default_factory=dict)
    """Image -> what it runs (the spec's ``handler.image`` picks one)."""
    group: GroupSettings = field(default_factory=GroupSettings)
    initial_replicas: int = 1
    hot_keys: tuple[tuple[int, float], ...] = ()
    """``(partition, share of its arrivals)`` on one hot key."""
    blocked_keys: tuple[tuple[int, float], ...] = ()
    """``(partition, t)``: from ``t`` a key there fails forever (``onExhausted: block``)."""
    silences: tuple[Silence, ...] = ()
    lag_unknown: tuple[Window, ...] = ()
    paused: tuple[Window, ...] = ()
    spec_changes: tuple[tuple[float, Mapping[str, Any]], ...] = ()
    """``(t, changes)``: from ``t`` the spec is deep-merged with ``changes``."""
    step_seconds: float = 1.0

    def spec_at(self, t: float) -> dict[str, Any]:
        spec = copy.deepcopy(dict(self.spec))
        for at, changes in self.spec_changes:
            if t >= at:
                _merge(spec, changes)
        return spec

    def weights_at(self, t: float) -> tuple[float, ...] | None:
        return self.weights(t)

    def paused_at(self, t: float) -> bool:
        return any(window.holds(t) for window in self.paused)

    def lag_unknown_at(self, t: float) -> bool:
        return any(window.holds(t) for window in self.lag_unknown)

    def silent_at(self, t: float, pod: str, group: SimulatedGroup) -> bool:
        names = sorted(p.name for p in group.pods)
        for silence in self.silences:
            if silence.window.holds(t) and (silence.pods is None or pod in names[: silence.pods]):
                return True
        return False

    def events(self) -> list[tuple[float, str]]:
        """What the plot marks: the scenario's own events, in time order."""
        marks = [(at, f"burst {size:,}") for at, size in self.bursts]
        marks += [(silence.window.start, "pods silent") for silence in self.silences]
        marks += [(silence.window.end, "pods answer") for silence in self.silences if silence.window.end < math.inf]
        marks += [(w.start, "lag unknown") for w in self.lag_unknown] + [(w.end, "lag back") for w in self.lag_unknown]
        marks += [(w.start, "paused") for w in self.paused] + [(w.end, "resumed") for w in self.paused]
        marks += [(at, "spec change") for at, _ in self.spec_changes]
        marks += [(at, "key blocked") for _, at in self.blocked_keys]
        return sorted((at, label) for at, label in marks if at < self.duration)


def _merge(into: dict[str, Any], changes: Mapping[str, Any]) -> None:
    for key, value in changes.items():
        if isinstance(value, Mapping) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = copy.deepcopy(value)


@dataclass(frozen=True)
class Point:
    """The group after one step."""

    t: float
    lag: float
    arrival_rate: float
    """Messages/s produced in the step (noise and bursts included)."""
    drain_rate: float
    """Messages/s committed in the step."""
    replicas: int
    """Decided (the Deployment's)."""
    ready: int
    """Pods in the group."""
    workers: int
    """Decided workers per pod."""
    capacity: float
    """Messages/s the group's pods can handle (the ground truth; rebalance pauses aside)."""
    per_worker_rate: float
    """Messages/s one busy worker handles (the ground truth)."""
    paused: bool
    lag_unknown: bool


@dataclass(frozen=True)
class PollRecord:
    t: float
    before: Size
    target: Size
    recommended: Size | None
    cause: str
    reason: str
    limited: str | None
    caveat: str | None
    exception: str | None = None


@dataclass
class Run:
    """A scenario's timeline: one point per step, one record per poll."""

    scenario: Scenario
    seed: int
    policy: str = "keyorder"
    """``keyorder`` (the operator's ``decide``) or ``keda`` (``keda.decide`` on a plain consumer)."""
    points: list[Point] = field(default_factory=list)
    polls: list[PollRecord] = field(default_factory=list)


@dataclass(frozen=True)
class Measured:
    run: Run
    seconds_to_within_target: float | None
    """From the disturbance until the backlog drains within the target (``None``: never)."""
    overshoot: float | None
    """Peak decided workers / the workers that were needed (``None``: nothing was needed)."""
    peak_workers: int
    needed_workers: int
    replica_overshoot: float | None
    """Peak decided replicas / the replicas the needed workers take (pods first); reported, not judged
    (more pods with fewer workers each is a shape, not waste)."""
    peak_replicas: int
    needed_replicas: int
    underprovisioned_minutes: float
    replica_changes_per_hour: float | None
    scale_downs_while_growing: list[str]
    exceptions: list[str]
