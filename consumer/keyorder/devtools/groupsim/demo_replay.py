"""The demo's spike replayed by the simulator: ``keyorder simulate`` checked against the real thing.

The simulator's verdicts (``keyorder simulate``, ``--against keda``) are only worth what its model of a
group is worth. ``keyorder dev`` runs the same policy on real processes and a real broker, so the
simulator replays the demo's spike with the demo's settings and the mechanics measured on this machine,
and its drain time is compared with the demo's (``keyorder dev`` prints both; docs/operator.md has the
figures and how they were calibrated):

- **start delay**: a ``keyorder run`` process is ready about ``DEMO_START_DELAY`` seconds after it is
  started (Python start-up, the client, the first group join on the embedded broker, whose join rounds
  take about 3 s: the broker's ``group.initial.rebalance.delay``);
- **a partition that moves** (cooperative rebalancing) waits ``DEMO_MOVE_PAUSE`` seconds for its new owner:
  in the demo's pod logs, a released partition was assigned 8 s later (two join rounds and the revoke);
- **the handler**: the example's 5-20 ms, uniform (mean 12.5 ms), plus the pod's own CPU per message on
  two cores shared by every process of the run (``DEMO_CPU_PER_MESSAGE``, from the right-sized group's
  drain: 5 pods x 8 workers drained 60,000 events in 27.7 s, about 2,600/s once joined, against 3,200/s
  for the handler alone).
"""

from __future__ import annotations

from typing import Any

from keyorder.devtools.groupsim.driver import Run, run
from keyorder.devtools.groupsim.keda import HpaPolicy, KedaSettings
from keyorder.devtools.groupsim.model import GroupSettings, Workload
from keyorder.devtools.groupsim.scenarios import APP, Scenario, constant, spec

DEMO_START_DELAY = 4.0
"""Seconds from a demo pod's process start to its first assignment (start-up and the first join round)."""
DEMO_MOVE_PAUSE = 8.0
"""Seconds a partition that changes owner waits, on the embedded broker (the demo's pod logs)."""
DEMO_CPU_PER_MESSAGE = 0.0004
"""CPU seconds per message outside the handler's sleep, as the demo's processes share two cores."""
DEMO_CORES_PER_POD = 0.4
"""The demo's two cores, shared by the autoscaled group's pods and the KEDA group's (about five each)."""


def demo_keda_settings(partitions: int, poll_seconds: float, scale_down_window: float) -> KedaSettings:
    """KEDA's and the HPA's defaults (``lagThreshold`` 10, the 10% tolerance, up by the larger of 4 pods or
    100%, down by 100%, the replicas capped at the partition count) on the demo's compressed clock: KEDA's
    polling interval and the HPA's sync period are the demo's poll, the policies count per poll instead of
    per 15 s, and the scale-down window is the demo's (as the demo compresses the keyorder operator's)."""
    return KedaSettings(
        polling_interval=poll_seconds,
        sync_period=poll_seconds,
        min_replicas=1,
        max_replicas=partitions,
        scale_up_policies=(HpaPolicy("Pods", 4, poll_seconds), HpaPolicy("Percent", 100, poll_seconds)),
        scale_down_window=scale_down_window,
        scale_down_policies=(HpaPolicy("Percent", 100, poll_seconds),),
    )


def demo_scenario(
    partitions: int,
    spike: int,
    rate: float,
    latency_min_ms: float,
    latency_max_ms: float,
    target_drain_seconds: float,
    scale_down_window: float,
    poll_seconds: float,
    initial_workers: int,
    max_workers: int,
    duration: float = 600.0,
) -> Scenario:
    """``keyorder dev``'s run as a scenario: the spike as the initial backlog, then ``rate``/s, the demo's
    policy settings (its compressed scale-up rates: 4 pods or 100% per poll), one pod to start with."""
    handler = (latency_min_ms + latency_max_ms) / 2 / 1000
    poll = max(round(poll_seconds), 1)
    resource = spec(
        workers={"min": 1, "initial": initial_workers, "max": max_workers},
        scaling={
            "pollIntervalSeconds": poll,
            "targetDrainSeconds": max(round(target_drain_seconds), 1),
            "activationLag": 50,
            "scaleDownStabilizationSeconds": max(round(scale_down_window), 0),
            "scaleUpPolicies": [
                {"type": "Pods", "value": 4, "periodSeconds": poll},
                {"type": "Percent", "value": 100, "periodSeconds": poll},
            ],
        },
    )
    return Scenario(
        name="demo",
        summary=f"keyorder dev's spike: {spike:,} events on {partitions} partitions, then {rate:g}/s",
        spec=resource,
        duration=duration,
        arrivals=constant(rate),
        initial_backlog=spike,
        workloads={APP: Workload(APP, constant(handler), cpu_per_message=DEMO_CPU_PER_MESSAGE, spread=0.1)},
        group=GroupSettings(
            partitions=partitions,
            start_delay=DEMO_START_DELAY,
            move_pause=DEMO_MOVE_PAUSE,
            cores_per_pod=DEMO_CORES_PER_POD,
        ),
        step_seconds=0.5,
    )


def drained_seconds(result: Run, spike: int) -> float | None:
    """When the committed messages reached the spike (``None``: not within the run)."""
    committed = 0.0
    step = result.scenario.step_seconds
    for point in result.points:
        committed += point.drain_rate * step
        if committed >= spike:
            return point.t
    return None


def replay(options: Any, seed: int = 1) -> dict[str, float | None]:
    """The simulator's drain times for ``keyorder dev``'s ``options`` (a ``DevOptions``): ``keyorder`` (the
    operator's policy) and ``keda`` (the KEDA reference on a plain consumer, as the demo runs it)."""
    scenario = demo_scenario(
        options.partitions,
        options.spike,
        options.rate,
        options.latency_min_ms,
        options.latency_max_ms,
        options.target_drain_seconds,
        options.scale_down_window,
        options.poll_seconds,
        options.initial_workers,
        options.max_workers,
    )
    keda = demo_keda_settings(options.partitions, options.poll_seconds, options.scale_down_window)
    return {
        "keyorder": drained_seconds(run(scenario, seed=seed), options.spike),
        "keda": drained_seconds(run(scenario, seed=seed, keda=keda), options.spike),
    }
