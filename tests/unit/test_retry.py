"""RetryPolicy: exponential backoff schedule, verdicts at max_attempts, validation."""

from __future__ import annotations

import dataclasses

import pytest

from keyorder.core.retry import ExhaustedPolicy, RetryPolicy, Verdict

DEFAULT = RetryPolicy(initial_backoff=0.2, multiplier=2.0, max_backoff=30.0)


@pytest.mark.parametrize(
    ("failed_attempts", "seconds"),
    [
        (0, 0.2),  # defensive: never below the initial backoff
        (1, 0.2),
        (2, 0.4),
        (3, 0.8),
        (4, 1.6),
        (5, 3.2),
        (6, 6.4),
        (7, 12.8),
        (8, 25.6),
        (9, 30.0),  # 51.2 capped
        (10, 30.0),
        (1_000, 30.0),  # no overflow however long a lane stays blocked
    ],
)
def test_backoff_schedule(failed_attempts: int, seconds: float) -> None:
    assert DEFAULT.backoff(failed_attempts) == pytest.approx(seconds)


def test_multiplier_one_gives_a_constant_backoff() -> None:
    policy = RetryPolicy(initial_backoff=1.5, multiplier=1.0, max_backoff=10.0)
    assert [policy.backoff(n) for n in range(1, 6)] == [1.5] * 5


def test_zero_backoff_retries_immediately() -> None:
    policy = RetryPolicy(initial_backoff=0.0, max_backoff=0.0)
    assert policy.after_failure(1) == (Verdict.RETRY, 0.0)


@pytest.mark.parametrize(
    ("exhausted", "failed_attempts", "verdict", "delay"),
    [
        (ExhaustedPolicy.DLQ, 1, Verdict.RETRY, 0.2),
        (ExhaustedPolicy.DLQ, 2, Verdict.RETRY, 0.4),
        (ExhaustedPolicy.DLQ, 3, Verdict.DEAD_LETTER, 0.0),  # the 3rd attempt was the last
        (ExhaustedPolicy.DLQ, 4, Verdict.DEAD_LETTER, 0.0),
        (ExhaustedPolicy.BLOCK, 1, Verdict.RETRY, 0.2),
        (ExhaustedPolicy.BLOCK, 2, Verdict.RETRY, 0.4),
        (ExhaustedPolicy.BLOCK, 3, Verdict.BLOCK, 30.0),  # parked, retried every max_backoff
        (ExhaustedPolicy.BLOCK, 50, Verdict.BLOCK, 30.0),
    ],
)
def test_after_failure_verdicts(
    exhausted: ExhaustedPolicy, failed_attempts: int, verdict: Verdict, delay: float
) -> None:
    policy = RetryPolicy(max_attempts=3, exhausted=exhausted)
    got_verdict, got_delay = policy.after_failure(failed_attempts)
    assert got_verdict is verdict
    assert got_delay == pytest.approx(delay)


@pytest.mark.parametrize(("exhausted", "verdict"), [("dlq", Verdict.DEAD_LETTER), ("block", Verdict.BLOCK)])
def test_single_attempt_goes_straight_to_the_exhausted_policy(exhausted: str, verdict: Verdict) -> None:
    policy = RetryPolicy(max_attempts=1, exhausted=ExhaustedPolicy(exhausted))
    assert policy.after_failure(1)[0] is verdict


def test_defaults() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff, policy.max_backoff, policy.multiplier) == (5, 0.2, 30.0, 2.0)
    assert policy.exhausted is ExhaustedPolicy.DLQ
    assert [policy.after_failure(n)[0] for n in range(1, 6)] == [Verdict.RETRY] * 4 + [Verdict.DEAD_LETTER]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be >= 1"),
        ({"max_attempts": -3}, "max_attempts must be >= 1"),
        ({"initial_backoff": -0.1}, "initial_backoff"),
        ({"initial_backoff": 31.0, "max_backoff": 30.0}, "initial_backoff <= max_backoff"),
        ({"initial_backoff": float("nan")}, "initial_backoff"),
        ({"multiplier": 0.5}, "multiplier must be >= 1"),
        ({"multiplier": 0.0}, "multiplier must be >= 1"),
    ],
)
def test_invalid_policies_raise(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_unknown_exhausted_policy_is_rejected() -> None:
    with pytest.raises(ValueError):
        ExhaustedPolicy("drop")


def test_policy_is_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT.max_attempts = 10  # type: ignore[misc]


def test_large_multiplier_is_capped_not_overflowing() -> None:
    policy = RetryPolicy(max_attempts=100, initial_backoff=1.0, multiplier=1e6, max_backoff=60.0)
    assert policy.after_failure(70) == (Verdict.RETRY, 60.0)


# --- jitter ---------------------------------------------------------------------------------------


def test_without_a_random_source_the_schedule_is_deterministic() -> None:
    assert [DEFAULT.after_failure(n)[1] for n in (1, 2, 3)] == [DEFAULT.after_failure(n)[1] for n in (1, 2, 3)]
    assert DEFAULT.after_failure(2) == (Verdict.RETRY, pytest.approx(0.4))


@pytest.mark.parametrize(
    ("draw", "failed_attempts", "delay"),
    [
        (0.0, 1, 0.1),  # equal jitter: at least half the backoff
        (0.5, 1, 0.15),
        (0.999, 2, 0.3998),  # below the full backoff
        (0.0, 20, 15.0),  # half the cap
        (1.5, 20, 30.0),  # an out-of-range source is clamped: never above the cap
        (-1.0, 20, 15.0),
    ],
)
def test_equal_jitter_uses_the_injected_source(draw: float, failed_attempts: int, delay: float) -> None:
    policy = RetryPolicy(max_attempts=100, random=lambda: draw)
    assert policy.after_failure(failed_attempts) == (Verdict.RETRY, pytest.approx(delay))


def test_jitter_spreads_keys_that_failed_together() -> None:
    import random

    policy = RetryPolicy(max_attempts=10, random=random.Random(7).random)
    delays = [policy.after_failure(3)[1] for _ in range(200)]
    assert all(0.4 <= delay <= 0.8 for delay in delays)
    assert len(set(delays)) > 150, "keys failing at the same moment must not retry in lock-step"
    assert max(delays) - min(delays) > 0.3


def test_blocked_keys_are_jittered_too_and_dead_letters_are_immediate() -> None:
    block = RetryPolicy(max_attempts=1, exhausted=ExhaustedPolicy.BLOCK, random=lambda: 0.0)
    assert block.after_failure(1) == (Verdict.BLOCK, pytest.approx(15.0))
    dlq = RetryPolicy(max_attempts=1, random=lambda: 0.5)
    assert dlq.after_failure(1) == (Verdict.DEAD_LETTER, 0.0)


def test_zero_backoff_stays_zero_with_jitter() -> None:
    assert RetryPolicy(initial_backoff=0.0, max_backoff=0.0, random=lambda: 0.9).after_failure(1) == (
        Verdict.RETRY,
        0.0,
    )


def test_the_pod_policy_has_jitter() -> None:
    from keyorder.config import load_run_config

    config = load_run_config({"handler": "m:f", "topics": "t", "group_id": "g"}, environ={})
    policy = config.retry_policy()
    delays = {policy.after_failure(1)[1] for _ in range(50)}
    assert len(delays) > 1 and all(0.1 <= delay <= 0.2 for delay in delays)
