"""The scaling limits the policy's table tests share (``test_policy``, ``test_policy_signals``).

One place, so every table reads against the same spec: a change of the baseline shows in every
test that depends on it instead of drifting between two copies.
"""

from __future__ import annotations

from dataclasses import replace

from keyorder_operator.policy import RateKind, RateLimit, ScalingLimits

UNLIMITED_UP = (RateLimit(RateKind.PERCENT, 10_000, 15),)
"""A scale-up rate limit that never binds in these tables (HPA's default, 4 pods or 100% per 15 s,
applies when none is set; its own tests set it)."""

LIMITS = ScalingLimits(
    min_replicas=1,
    initial_workers=16,
    max_workers=256,
    target_drain_seconds=300,
    activation_lag=100,
    scale_up_window_seconds=0,
    scale_down_window_seconds=300,
    scale_up_rates=UNLIMITED_UP,
)
"""16 workers per new pod, up to 256; drain within 5 min; scale up at once, down after 5 min."""

ZERO = replace(LIMITS, min_replicas=0, scale_to_zero=True, scale_down_window_seconds=0)
"""``LIMITS`` with scale-to-zero and no scale-down window."""
