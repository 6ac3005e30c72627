"""A plain partition-ordered consumer group scaled by KEDA's reference policy, on the broker.

What a platform team runs today for an ordered Kafka consumer is KEDA's ``kafka`` trigger on a plain
consumer Deployment. ``keyorder dev`` runs that beside its own autoscaled group, on the same spike and
the same broker: real ``keyorder run`` processes in ``partition`` ordering with one handler thread per
partition (a plain consumer, as a KEDA user runs it), their count decided every poll by
``groupsim.keda.decide`` (KEDA's metric and the HPA's algorithm, cited there) from the group's lag per
partition. The simulator (``keyorder simulate --against keda``) runs the same policy on a modelled group.

Time is compressed as the demo compresses the keyorder operator's: KEDA's polling interval and the HPA's
sync period are the demo's poll interval, the HPA's scaling policies count per poll instead of per 15 s,
and its scale-down window is the demo's (``groupsim.demo_replay.demo_keda_settings``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from keyorder.devtools.drain import crossing_seconds_before
from keyorder.devtools.groupsim.keda import KedaSettings, KedaState, decide
from keyorder.devtools.local_pods import LocalPods

KEDA_STOP_GRACE_SECONDS = 5.0
"""How long the KEDA group's processes may take to stop once it drained (then they are killed)."""


@dataclass
class KedaGroupRun:
    """What the KEDA-scaled group did, on the clock of the run it was compared with (``started``)."""

    points: list[dict[str, Any]] = field(default_factory=list)
    """``{"t", "lag", "replicas"}`` per poll."""
    decisions: list[dict[str, Any]] = field(default_factory=list)
    """``{"t", "reason"}`` of each change of replicas."""
    drained_seconds: float | None = None
    """When its committed total reached the spike's end (interpolated between polls)."""
    peak_replicas: int = 1
    error: str | None = None
    """Set when a pod process died, or the group did not drain by its deadline."""

    def report(self) -> dict[str, Any]:
        return {
            "policy": "KEDA kafka trigger + HPA (keyorder.devtools.groupsim.keda), partition-ordered plain consumers",
            "spike_drained_seconds": self.drained_seconds,
            "peak_replicas": self.peak_replicas,
            "decisions": self.decisions,
            "timeline": self.points,
            "error": self.error,
        }


class KedaGroup:
    """Runs the KEDA-scaled group in a thread from ``start`` until its committed offsets reach
    ``spike_end`` (or ``deadline`` seconds after ``started`` pass, or ``stop``); ``join`` returns the run."""

    def __init__(
        self,
        workdir: Path,
        settings: Mapping[str, str],
        lag_source: Any,
        topic: str,
        partitions: int,
        spike_end: int,
        policy: KedaSettings,
        started: float,
        deadline: float,
    ) -> None:
        self.pods = LocalPods(workdir, settings, name="keda")
        self.group = settings["KEYORDER_GROUP_ID"]
        self.lag_source, self.topic, self.partitions = lag_source, topic, partitions
        self.spike_end, self.policy = spike_end, policy
        self.started, self.deadline = started, deadline
        self.run = KedaGroupRun()
        self._stop = threading.Event()
        # not a daemon: an exit waits for its ``finally``, which stops the group's processes
        self._thread = threading.Thread(target=self._loop, name="keda-group")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def join(self) -> KedaGroupRun:
        self._thread.join()
        return self.run

    def _loop(self) -> None:
        try:
            self._drive()
        except Exception as error:  # reported with the comparison: the demo goes on without it
            self.run.error = f"the KEDA group failed: {error!r}"
        finally:
            # Its measurement is over and nothing audits it: do not wait out its pods' stop. All of them
            # leaving at once rebalances the group on the embedded broker, and a stopping pod handed a
            # partition then spent up to 3 x 10 s reading committed offsets (docs/operator.md).
            self.pods.stop_all(grace=KEDA_STOP_GRACE_SECONDS)
            self.lag_source.close()

    def _drive(self) -> None:
        from keyorder_operator.observe import LagUnavailable

        state, replicas, previous = KedaState(), 1, None
        self.pods.scale(replicas)
        while not self._stop.wait(self.policy.sync_period):
            elapsed = time.monotonic() - self.started
            if crashed := self.pods.crashed():
                self.run.error = f"a consumer process died: {crashed}"
                return
            if elapsed > self.deadline:
                self.run.error = f"not drained within {self.deadline:.0f} s"
                return
            try:
                sample = self.lag_source.sample([self.topic], self.group, time.time())
            except LagUnavailable:  # until the group's first commit: the HPA keeps the replicas
                sample = None
            lags = tuple(sample.partition_lags) if sample is not None else None
            decision = decide(elapsed, replicas, lags, state, self.policy)
            state = decision.state
            if decision.replicas != replicas:
                self.run.decisions.append({"t": round(elapsed, 1), "reason": decision.reason})
                replicas = decision.replicas
                self.pods.scale(replicas)
                self.run.peak_replicas = max(self.run.peak_replicas, replicas)
            self.run.points.append(
                {"t": round(elapsed, 2), "lag": sample.lag if sample else None, "replicas": replicas}
            )
            if sample is not None:
                if sample.committed_total >= self.spike_end:
                    crossed = elapsed - crossing_seconds_before(previous, sample, self.spike_end)
                    self.run.drained_seconds = round(crossed, 1)
                    return
                previous = sample
