"""A failover without a new process: kopf's peering keeps a standby replica's timers stopped until it takes
over, maybe hours after it started, and stops a replica's timers while another with a higher priority acts,
then runs them again (kopf/_core/engines/daemons.py, ``daemon_killer``: daemons and timers are stopped when
the operator pauses, and respawned by the re-listing after it resumes).

Real kopf on the API emulator, no broker (``NoKafka``). The pause is kopf stopped and started again on the
same ``OperatorContext`` (what a peering pause leaves of the process: its memory), and the time it lasted is
the context's clocks: really waited for a standby's takeover (the first polls are timed against the wall
clock), moved on an hour for a paused replica's memory (its age is counted on the monotonic clock).
Review F2: the standby polled every resource on its first tick, and the paused replica resumed with its
memory from before the pause over what its successor wrote.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from keyorder_operator.context import OperatorContext
from keyorder_operator.kube import Kube
from keyorder_operator.policy import ScalingState, Size
from keyorder_operator.reconcile import register
from keyorder_operator.restart import CREATED_JUST_BEFORE_SECONDS, first_poll_at, instant, record_of
from tests.operator.harness import CR, api_client, first_polls, polls_of, run_kopf, wait_for
from tests.operator.test_operator_deployable import NoKafka, resource

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

TICK = 0.3


@contextlib.contextmanager
def standing_by(url: str, monotonic_shift: list[float] | None = None, **settings: Any) -> Iterator[OperatorContext]:
    """An operator process that has started and holds its context, with kopf not running yet (a peering standby,
    or a replica paused): ``acting(context)`` runs kopf on it. ``monotonic_shift[0]`` is added to its monotonic
    clock (the time a pause lasted, without waiting for it)."""
    shift = monotonic_shift if monotonic_shift is not None else [0.0]
    with api_client(url) as client:
        context = OperatorContext(
            kube=Kube(client),
            tick_seconds=TICK,
            lag_source_for=NoKafka,
            monotonic=lambda: time.monotonic() + shift[0],
            **settings,
        )
        with polls_of(context):
            yield context


def acting(url: str, context: OperatorContext) -> contextlib.AbstractContextManager[Any]:
    """kopf running the handlers on ``context``: the replica acts (it took over, or was resumed)."""
    return run_kopf(url, lambda registry: register(registry, context))


def test_a_standby_that_takes_over_spreads_its_first_polls_over_the_interval_from_the_takeover(kube):
    """Twelve resources exist; the standby started, and took over more than an interval later. Each is first
    polled at its own moment of the first 4 s interval from the takeover (``restart.first_poll_at``): not all at
    the first tick, as when their moments were counted from the process's start, long past."""
    interval = 4
    names = [f"spread-{n}" for n in range(12)]
    uids = {
        name: kube.create(CR, resource(name, scaling={"pollIntervalSeconds": interval}))["metadata"]["uid"]
        for name in names
    }
    with standing_by(kube.url) as standby:
        # the scenario: paused by kopf's peering for longer than an interval, and the resources older than
        # CREATED_JUST_BEFORE_SECONDS at the takeover (younger ones are polled at once)
        time.sleep(max(interval, CREATED_JUST_BEFORE_SECONDS) + 2)
        takeover = time.time()
        with acting(kube.url, standby):
            polled = first_polls(kube, names, interval + 30, "a first poll of every resource by the standby")
    early = {
        name: round(polled[name] - first_poll_at(uids[name], takeover, interval), 2)
        for name in names
        if polled[name] < first_poll_at(uids[name], takeover, interval) - TICK / 2
    }
    assert not early, f"polled before their moment of the first interval after the takeover (seconds): {early}"
    span = max(polled.values()) - min(polled.values())
    assert span > 2 * TICK, f"the first polls came within {span:.2f} s of each other"
    active = standby.active_since
    # event order: active from the takeover's first tick, before any first poll
    assert takeover <= active < min(polled.values()) + TICK
    assert all(polled[name] >= first_poll_at(uids[name], active, interval) - TICK / 2 for name in names)


def test_a_replica_paused_longer_than_its_memory_lasts_resumes_from_what_its_successor_wrote(kube):
    """The replica polls a resource whose Kafka does not answer, counting the failed observations (5 and more);
    it is paused, and the replica that acts meanwhile reaches Kafka (its record says 0 failures in a row). Resumed
    an hour later, the replica counts on from its successor's record, not from its own memory: it would fall
    back (``scaling.fallback``) sooner than either replica alone would."""
    shift = [0.0]
    scaling = {"pollIntervalSeconds": 1, "fallback": {"failureThreshold": 50, "replicas": 1}}

    def record() -> dict[str, Any]:
        return ((kube.get(CR, "paused") or {}).get("status") or {}).get("autoscaler") or {}

    with standing_by(kube.url, shift, autoscaler_save_seconds=0.3) as replica:
        with acting(kube.url, replica):
            kube.create(CR, resource("paused", scaling=scaling))
            wait_for(lambda: record().get("failedObservations", 0) >= 5, 30, "five failed observations recorded")
        successor = instant(time.time())
        kube.patch(
            CR,
            "paused",
            {"status": {"autoscaler": {**record_of(ScalingState(Size(1, 16)), 0.0), "savedAt": successor}}},
            subresource="status",
        )
        assert record().get("failedObservations") == 0
        shift[0] += 3_600  # paused for an hour
        with acting(kube.url, replica):
            wait_for(lambda: record().get("savedAt") != successor, 30, "the resumed replica's record")
            failures = record().get("failedObservations")
    assert failures is not None and failures <= 2, (
        f"{failures} failed observations in a row: counted on from the memory of before the pause"
    )
