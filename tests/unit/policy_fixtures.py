"""The scaling limits the policy's table tests share (``test_policy``, ``test_policy_signals``).

One place, so every table reads against the same spec: a change of the baseline shows in every
test that depends on it instead of drifting between two copies.
"""

from __future__ import annotations

from dataclasses import replace

from keyorder_operator.policy import ScalingLimits

LIMITS = ScalingLimits(
    min_replicas=1,
    initial_workers=16,
    max_workers=256,
    target_drain_seconds=300,
    activation_lag=100,
    scale_up_window_seconds=0,
    scale_down_window_seconds=300,
)
"""16 workers per new pod, up to 256; drain within 5 min; scale up at once, down after 5 min."""

ZERO = replace(LIMITS, min_replicas=0, scale_to_zero=True, scale_down_window_seconds=0)
"""``LIMITS`` with scale-to-zero and no scale-down window."""
