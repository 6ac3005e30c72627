"""A simulated consumer group that drives the operator's real scaling policy, poll by poll.

An autoscaler is judged over hours of noisy signals, which no table test and no broker-backed test
can afford. This package simulates a consumer group in seconds (pure, deterministic, seeded, time a
parameter): partitions with arrivals and lag, pods that start after a delay, rebalances that pause
the group, workers whose handler time changes, hot and blocked keys, pods that stop reporting, lag
that cannot be read, spec changes. The pods' scaling reports are built by the pods' own report code
(``keyorder.adapters.scaling_report.build_report``) and read by the operator's own parser; the
decisions come from ``keyorder_operator.policy.decide`` through the status round trip the operator
uses. ``keyorder simulate`` runs the scenarios and plots them.

- ``model``: the simulated group (one step of simulated time at a time).
- ``driver``: the operator's poll against it, and the run's timeline.
- ``criteria``: what a run must satisfy, computed from its timeline.
- ``scenarios``: the named scenarios, each with its criteria's thresholds.
- ``keda``: the reference policy, KEDA's Kafka scaler feeding the HPA (``--against keda``), which
  scales a plain consumer (one handler thread per partition) on the same scenario.
- ``compare``: one scenario under both policies, side by side.
- ``plot`` and ``command``: the PNGs and ``keyorder simulate``.
"""
