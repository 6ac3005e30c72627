"""A scenario under the keyorder autoscaler and under the KEDA reference, side by side.

``keyorder simulate NAME --against keda`` runs the scenario twice with the same seed and the same
arrivals: once with the operator's ``decide`` sizing pods and key workers, once with KEDA's Kafka
scaler and the HPA (``keda``) sizing a plain consumer (one handler thread per partition). This module
holds what the comparison reports for each run, from its timeline:

- **time to target**: from the disturbance until the backlog drains within the target at the ready
  capacity, for good (``criteria.measure``; ``None``: never within the run);
- **peak lag**, **pod-minutes** (the Deployment's replicas over the run: what the group costs),
  **replica changes** (each is a rebalance);
- **peak workers / need**: the most handler workers running at once over the workers the workload
  needed (the lag of the keyorder run drained within the target plus the arrivals, at the true rate,
  shaped as the policy shapes them; the same need for both). A plain consumer's workers are its
  partitions' threads, however many pods it has;
- **order violations**: 0 for both, by construction, and not counted by the fluid model: the keyorder
  pods run one key's messages one at a time (lanes), and the plain consumer one partition's messages
  one at a time (one thread per partition).

``verdict`` says whether keyorder drained at least as fast at no more pod-minutes, and
``SPIKE_RATIO`` is the bound on the spike and burst scenarios (keyorder's time to target at most half
of KEDA's).
"""

from __future__ import annotations

from dataclasses import dataclass

from keyorder.devtools.groupsim.criteria import Measured, measure
from keyorder.devtools.groupsim.driver import run
from keyorder.devtools.groupsim.keda import KedaSettings
from keyorder.devtools.groupsim.scenarios import Scenario

SPIKE_RATIO = 0.5
"""On the spike and burst scenarios keyorder's time to target is at most this share of KEDA's."""
SPIKE_SCENARIOS = ("spike", "spike-eager", "burst", "big-burst", "burst-ends")
"""The spike and burst scenarios the ratio is held to."""


@dataclass(frozen=True)
class Outcome:
    """One run's figures, as the comparison table shows them."""

    policy: str
    seconds_to_target: float | None
    peak_lag: float
    pod_minutes: float
    replica_changes: int
    peak_workers: int | None
    """``None`` for the KEDA reference: its workers are the threads of the partitions its ready pods own,
    which the fluid model does not count apart from the partitions themselves (review of issue 39,
    finding 7: a constant would say nothing)."""
    needed_workers: int

    @property
    def workers_over_need(self) -> float | None:
        if self.peak_workers is None or not self.needed_workers:
            return None
        return self.peak_workers / self.needed_workers


@dataclass(frozen=True)
class Comparison:
    scenario: Scenario
    seed: int
    keyorder: Measured
    keda: Measured
    keyorder_outcome: Outcome
    keda_outcome: Outcome

    @property
    def time_ratio(self) -> float | None:
        """keyorder's time to target over KEDA's (``None``: not defined; 0.0 when KEDA never got there)."""
        ours, theirs = self.keyorder_outcome.seconds_to_target, self.keda_outcome.seconds_to_target
        if ours is None:
            return None
        if theirs is None:
            return 0.0
        return ours / theirs if theirs > 0 else (1.0 if ours == 0 else None)

    @property
    def cost_ratio(self) -> float:
        theirs = self.keda_outcome.pod_minutes
        return self.keyorder_outcome.pod_minutes / theirs if theirs else float("inf")


def outcome(measured: Measured, needed_workers: int) -> Outcome:
    """The figures of one run (``needed_workers``: the workload's need, the same for both runs)."""
    run_ = measured.run
    scenario = run_.scenario
    after = [p for p in run_.points if p.t >= scenario.disturbance]
    pod_minutes = sum(p.replicas for p in run_.points) * scenario.step_seconds / 60
    changes = sum(1 for poll in run_.polls if poll.target.replicas != poll.before.replicas)
    peak = None if run_.policy == "keda" else measured.peak_workers
    return Outcome(
        policy=run_.policy,
        seconds_to_target=measured.seconds_to_within_target,
        peak_lag=max((p.lag for p in after), default=0.0),
        pod_minutes=pod_minutes,
        replica_changes=changes,
        peak_workers=peak,
        needed_workers=needed_workers,
    )


def compare(
    scenario: Scenario, seed: int = 1, keda: KedaSettings | None = None, restart_every: float | None = None
) -> Comparison:
    """Run ``scenario`` under both policies, same seed and arrivals; ``restart_every`` restarts keyorder's
    operator (the KEDA reference keeps its memory: KEDA's and the HPA's restarts are not modelled)."""
    ours = measure(run(scenario, seed=seed, restart_every=restart_every))
    theirs = measure(run(scenario, seed=seed, keda=keda or KedaSettings()))
    need = ours.needed_workers
    return Comparison(scenario, seed, ours, theirs, outcome(ours, need), outcome(theirs, need))


def verdict(comparison: Comparison) -> str:
    """``as fast, cheaper`` and its variants: whether keyorder drained at least as fast at no more pod-minutes."""
    ours, theirs = comparison.keyorder_outcome, comparison.keda_outcome
    faster = _at_least_as_fast(ours.seconds_to_target, theirs.seconds_to_target)
    cheaper = ours.pod_minutes <= theirs.pod_minutes
    words = ("as fast" if faster else "slower") + (", no costlier" if cheaper else ", costlier")
    if comparison.scenario.name in SPIKE_SCENARIOS:
        ratio = comparison.time_ratio
        held = ratio is not None and ratio <= SPIKE_RATIO
        words += f"; time ratio {'held' if held else 'MISSED'} (<= {SPIKE_RATIO})"
    return words


def _at_least_as_fast(ours: float | None, theirs: float | None) -> bool:
    if ours is None:
        return theirs is None
    return theirs is None or ours <= theirs


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f} s"


def table(comparison: Comparison) -> str:
    """The two runs' figures, one row each, for the terminal."""
    ours, theirs = comparison.keyorder_outcome, comparison.keda_outcome
    rows = [("", "keyorder", "KEDA reference")]
    rows.append(("time to target", _seconds(ours.seconds_to_target), _seconds(theirs.seconds_to_target)))
    rows.append(("peak lag", f"{ours.peak_lag:,.0f}", f"{theirs.peak_lag:,.0f}"))
    rows.append(("pod-minutes", f"{ours.pod_minutes:,.0f}", f"{theirs.pod_minutes:,.0f}"))
    rows.append(("replica changes", str(ours.replica_changes), str(theirs.replica_changes)))
    rows.append(
        (
            "peak workers / need",
            f"{ours.peak_workers if ours.peak_workers is not None else '-'} / {ours.needed_workers}",
            f"{theirs.peak_workers if theirs.peak_workers is not None else '-'} / {theirs.needed_workers}",
        )
    )
    rows.append(("order violations", "0 (per-key lanes)", "0 (thread per partition)"))
    lines = [f"  {name:<22} {a:>20} {b:>26}" for name, a, b in rows]
    ratio = comparison.time_ratio
    shown = "-" if ratio is None else f"{ratio:.2f}"
    lines.append(f"  time ratio {shown}, cost ratio {comparison.cost_ratio:.2f}: keyorder {verdict(comparison)}")
    return "\n".join(lines)


SUMMARY_HEADER = (
    "| scenario | time to target (keyorder / KEDA) | peak lag (keyorder / KEDA) | pod-minutes (keyorder / KEDA) "
    "| replica changes | peak workers / need (keyorder / KEDA) | verdict |\n"
    "|---|---|---|---|---|---|---|"
)


def summary_row(comparison: Comparison) -> str:
    """One Markdown row of the whole comparison (what docs/operator.md holds)."""
    ours, theirs = comparison.keyorder_outcome, comparison.keda_outcome

    def need(value: Outcome) -> str:
        over = value.workers_over_need
        return "-" if over is None else f"{over:.1f}x"

    return (
        f"| {comparison.scenario.name} "
        f"| {_seconds(ours.seconds_to_target)} / {_seconds(theirs.seconds_to_target)} "
        f"| {ours.peak_lag:,.0f} / {theirs.peak_lag:,.0f} "
        f"| {ours.pod_minutes:,.0f} / {theirs.pod_minutes:,.0f} "
        f"| {ours.replica_changes} / {theirs.replica_changes} "
        f"| {need(ours)} / {need(theirs)} "
        f"| {verdict(comparison)} |"
    )
