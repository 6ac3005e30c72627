"""What survives an operator restart (``keyorder_operator.restart``): the autoscaler's record in
``status.autoscaler`` (its round trip, what it leaves out, the write rate, the times it refuses), the windows'
short memory (``policy.window_memory``) deciding as the whole history, a restarted policy deciding as the
process it replaces, a resize not made kept as none, a failover (a memory from before a pause dropped), and
the first polls after a start or a takeover spread over the interval. Time is a parameter throughout."""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import fields, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder_operator.policy import (
    ARRIVAL_SAMPLES,
    ARRIVALS_STALE_SECONDS,
    MEASURED_EACH_POLL,
    SEED_AGE,
    Limited,
    LimitKind,
    Observation,
    RateSource,
    ScalingLimits,
    ScalingState,
    Size,
    decide,
    not_resized,
    resumed,
    smoothed_arrivals,
    stabilized,
    window_memory,
)
from keyorder_operator.restart import (
    ACTIVE_GAP_TICKS,
    AUTOSCALER_SAVE_SECONDS,
    CREATED_JUST_BEFORE_SECONDS,
    NOT_RECORDED,
    RECORD_CLOCK_SKEW_SECONDS,
    RecordError,
    became_active,
    existed_before,
    first_poll_at,
    first_poll_spread,
    instant,
    memory_lasts,
    record_changes,
    record_of,
    save_due,
    saved_at,
    state_from_record,
)
from keyorder_operator.status import state_to_status
from tests.unit.policy_fixtures import LIMITS
from tests.unit.poll_fixtures import INTERVAL, TICK, Clocks, poll_context, poll_of

T0 = 1_750_000_000.0
"""A wall-clock moment (June 2025): the policy's times are seconds since the epoch."""

LEARNED = ScalingState(
    current=Size(3, 8),
    recommendations=((T0 + 10.25, 4, 8), (T0 + 25.5, 3, 8)),
    per_worker_rate=92.5,
    rate_source=RateSource.HANDLER_TIME,
    rate_samples=(50.0,),
    efficiency_samples=(0.9, 0.95),
    handler_time=0.0102,
    arrival_samples=(400.0, 410.5, 399.0),
    arrivals_at=T0 + 25.5,
    drainable_lag=12_345,
    settled=False,
    pod_totals=(1_000, 10.5, 2, 3, 4.25),
    pod_totals_at=T0 + 25.5,
    idle_polls=1,
    failed_observations=2,
    held_polls=1,
    silent_polls=2,
    replica_changes=((T0 + 25.5, 4),),
    limit=Limited(LimitKind.HOT_KEY, "scaling cannot help: ..."),
    limit_gone_polls=1,
    workload="abc123",
    cpu_workers_per_pod=2,
    polled_at=T0 + 25.5,
    saturated=True,
    step_started_at=T0 + 25.5,
    step_seconds=(12.5, 20.0),
)
"""A state with every field away from its default."""


def through_the_api_server(record: dict) -> dict:
    return json.loads(json.dumps(record))


def test_the_record_round_trips_what_a_restart_resumes():
    record = through_the_api_server(record_of(LEARNED, T0 + 26))
    assert record["savedAt"] == "2025-06-15T15:07:06.000Z"
    assert record["recommendations"] == [["2025-06-15T15:06:50.250Z", 4, 8], ["2025-06-15T15:07:05.500Z", 3, 8]]
    assert record["replicaChanges"] == [["2025-06-15T15:07:05.500Z", 4]]
    assert record["stepStartedAt"] == "2025-06-15T15:07:05.500Z"
    assert saved_at(record) == T0 + 26
    back = state_from_record(record, LEARNED.current)
    defaults = ScalingState(current=LEARNED.current)
    measured_again = {name: getattr(defaults, name) for name in MEASURED_EACH_POLL}
    assert back == replace(LEARNED, **measured_again)
    assert resumed(back, T0 + 90) == replace(
        LEARNED, recommendations=((T0 + 10.25, 4, 8), (T0 + 90 - SEED_AGE, 3, 8)), **measured_again
    )
    assert record["arrivalsAt"] == "2025-06-15T15:07:05.500Z"
    stale = resumed(back, T0 + 25.5 + ARRIVALS_STALE_SECONDS + 1)
    assert (stale.arrival_samples, stale.arrivals_at) == ((), None), "samples of another time start afresh"


def test_a_lasting_rise_counts_through_restarts_between_every_poll():
    """Issue 39 review, finding 2: the arrival samples are resumed from the record, so a rise that lasts
    ``ARRIVAL_SAMPLES`` polls counts even when the operator restarts between every two of them (they were
    measured afresh after each restart, never reached five, and the rate stayed the old level)."""
    limits = ScalingLimits()
    state = ScalingState(Size(2, 16), arrival_samples=(800.0,) * ARRIVAL_SAMPLES, arrivals_at=T0)
    stored = state_from_record(through_the_api_server(record_of(state, T0)), state.current)
    rates = []
    for poll in range(1, ARRIVAL_SAMPLES + 1):
        now = T0 + 15 * poll
        state = resumed(stored, now)  # a restart before every poll
        observation = Observation(lag=0, partitions=12, drain_rate=None, arrival_rate=20_000.0)
        rate, samples = smoothed_arrivals(observation, state)
        rates.append(rate)
        live = replace(state, arrival_samples=samples, arrivals_at=now)
        assert "arrivalSamples" in record_changes(stored, live, limits, now)
        stored = state_from_record(through_the_api_server(record_of(live, now)), live.current)
    assert rates[:-1] == [800.0] * (ARRIVAL_SAMPLES - 1), "a rise counts only once it lasted"
    assert rates[-1] == 20_000.0


def test_noise_in_the_arrivals_writes_no_record():
    stored = ScalingState(Size(2, 16), arrival_samples=(800.0, 820.0, 790.0), arrivals_at=T0)
    live = replace(stored, arrival_samples=(820.0, 790.0, 805.0), arrivals_at=T0 + 15)
    assert "arrivalSamples" not in record_changes(stored, live, ScalingLimits(), T0 + 15)


def test_the_record_leaves_out_exactly_what_is_measured_each_poll():
    """Every field of the policy's state is either in the record or measured again after a restart."""
    defaults = ScalingState(current=LEARNED.current)
    measured = replace(LEARNED, **{name: getattr(defaults, name) for name in MEASURED_EACH_POLL})
    changed_keys = {key for key, value in state_to_status(LEARNED).items() if state_to_status(measured)[key] != value}
    assert changed_keys == NOT_RECORDED
    assert not NOT_RECORDED & set(record_of(LEARNED, T0))
    assert {f.name for f in fields(ScalingState)} >= set(MEASURED_EACH_POLL)


def test_times_are_kept_to_the_millisecond():
    assert instant(T0 + 0.0004) == "2025-06-15T15:06:40.000Z"
    assert instant(T0 + 0.9996) == "2025-06-15T15:06:41.000Z"
    assert instant(T0 + 12.3456) == "2025-06-15T15:06:52.346Z"


def test_a_record_an_older_release_wrote_is_read():
    """Until this release, status held the whole state, times in seconds, with no ``savedAt``."""
    old = through_the_api_server(state_to_status(LEARNED))
    state = state_from_record(old, LEARNED.current)
    assert state.recommendations == LEARNED.recommendations
    assert state.replica_changes == LEARNED.replica_changes
    assert state.step_started_at == LEARNED.step_started_at
    assert saved_at(old) is None
    assert resumed(state, T0 + 90).pod_totals is None, "a stale pod total would measure a rate over the outage"


@pytest.mark.parametrize(
    ("record", "field"),
    [
        ([1, 2], "status.autoscaler: expected a map"),
        ({"recommendations": "often"}, "status.autoscaler.recommendations: expected a list"),
        ({"recommendations": [[T0, 3]]}, "status.autoscaler.recommendations[0]: expected a list of 3 items"),
        ({"recommendations": [["yesterday", 3, 8]]}, "status.autoscaler.recommendations[0][0]: 'yesterday'"),
        ({"recommendations": [[T0, -1, 8]]}, "status.autoscaler.recommendations[0][1]: expected a count"),
        ({"replicaChanges": [[T0, "two"]]}, "status.autoscaler.replicaChanges[0][1]: expected a count"),
        ({"stepStartedAt": True}, "status.autoscaler.stepStartedAt: expected an ISO 8601 time"),
        ({"savedAt": "soon"}, "status.autoscaler.savedAt: 'soon' is not an ISO 8601 time"),
    ],
)
def test_an_unreadable_record_is_refused_naming_the_field(record, field):
    with pytest.raises(RecordError, match="^" + field.replace("[", r"\[").replace("]", r"\]")):
        state_from_record(record, Size(1, 16))
        saved_at(record)


# -- the windows' short memory ---------------------------------------------------------------------------

recommendation_steps = st.lists(
    st.tuples(st.integers(1, 40), st.integers(0, 6), st.integers(1, 5)), min_size=1, max_size=40
)


@settings(max_examples=300, deadline=None)
@given(recommendation_steps, st.sampled_from([0, 30, 60]), st.sampled_from([0, 45, 120]))
def test_the_short_memory_decides_as_the_whole_history(steps, up_window, down_window):
    """Whatever is recommended, the windows stabilize every later recommendation the same from the short
    memory as from every recommendation made: so it is what status keeps."""
    limits = replace(LIMITS, scale_up_window_seconds=up_window, scale_down_window_seconds=down_window)
    now, whole, short = T0, [], ()
    for gap, replicas, workers in steps:
        now += gap
        for recommended in (Size(0, 1), Size(1, 3), Size(3, 2), Size(6, 5)):
            for current in (Size(1, 1), Size(2, 4), Size(5, 3)):
                expected = stabilized(recommended, current, tuple(whole), now, limits, 8)
                assert stabilized(recommended, current, short, now, limits, 8) == expected
        whole.append((now, replicas, workers))
        short = window_memory((*short, (now, replicas, workers)), now, limits)
        assert short[-1] == whole[-1], "the newest recommendation is always kept"


def test_a_steady_recommendation_is_one_entry():
    short: tuple = ()
    for poll in range(200):
        short = window_memory((*short, (T0 + 5 * poll, 4, 16)), T0 + 5 * poll, LIMITS)
    assert short == ((T0 + 995, 4, 16),)


# -- a restart decides as the process it replaces -----------------------------------------------------------


START = Size(3, 16)


def run(steps, restarts=(), every=AUTOSCALER_SAVE_SECONDS, start=START):
    """Feed ``(time, lag)`` steps through ``decide`` as the operator's poll does: the record is written
    by the poll's rule (``record_changes``, ``save_due``), and at each time in ``restarts`` a new operator
    resumes from it (through JSON, as the API server keeps it). The targets, and when the record was written."""
    state, record, last_saved = ScalingState(start), None, None
    targets, writes = [], []
    for now, lag in steps:
        if now in restarts:
            assert record is not None, "nothing to resume from"
            state = resumed(state_from_record(through_the_api_server(record), state.current), now)
            last_saved = saved_at(record)
        drain = min(100.0 * state.current.capacity, lag) if lag else 0.0
        decision = decide(Observation(lag=lag, partitions=4, drain_rate=drain), LIMITS, state, now)
        state = decision.state
        targets.append(decision.target)
        stored = state_from_record(record, state.current) if record is not None else None
        if save_due(record_changes(stored, state, LIMITS, now), decision.scaled, last_saved, now, every):
            record, last_saved = record_of(state, now), now
            writes.append(now)
    return targets, writes


BACKLOG_THEN_DRAINED = [
    (T0 + t, lag) for t, lag in [(0, 6_000_000), (60, 6_000_000), (120, 0), (200, 0), (330, 0), (379, 0)]
]
"""A backlog sizes the group at 4 x 50 and keeps it there until 60 s; drained at 120 s, 1 x 16 is recommended
from then on, and the 300 s window (counted from 60 s, the last recommendation of 4 x 50) lets it in at 360 s."""


def test_without_a_restart_the_window_holds_the_scale_down_until_it_ends():
    targets, writes = run(BACKLOG_THEN_DRAINED)
    assert targets == [Size(4, 50)] * 5 + [Size(1, 16)]
    # written with the resize, when the rate was no longer learned from the drain, at the first lower
    # recommendation, with the resize
    assert writes == [T0, T0 + 60, T0 + 120, T0 + 379]


@pytest.mark.parametrize("restart", [200, 330, 379])
def test_a_restart_inside_the_window_decides_as_the_process_it_replaces(restart):
    """The recommendation of 4 x 50 made at 60 s survives the restart, and so does the lower one made
    since. (The old operator kept in status only what it had at the resize at 0 s: restarted at 200 s,
    it scaled down at 330 s, inside the window.)"""
    continuous, _ = run(BACKLOG_THEN_DRAINED)
    restarted, _ = run(BACKLOG_THEN_DRAINED, restarts={T0 + restart})
    assert restarted == continuous


@pytest.mark.parametrize("restart", [60, 120, 200, 330, 379])
def test_a_restart_never_scales_down_sooner(restart):
    """A restart before the poll that recommends less takes the newest recommendation status has as made
    at the restart: the scale-down may come later (by up to the time between the two), never sooner."""
    continuous, _ = run(BACKLOG_THEN_DRAINED)
    restarted, _ = run(BACKLOG_THEN_DRAINED, restarts={T0 + restart})
    for before, after in zip(continuous, restarted, strict=True):
        assert (after.replicas, after.capacity) >= (before.replicas, before.capacity), (continuous, restarted)


def test_a_restart_before_the_lower_recommendation_was_written_holds_a_whole_window():
    """With a write rate that kept the first lower recommendation out of status, a restart takes the newest
    one status has (4 x 50) as made at the restart: it never scales down sooner than the old process."""
    targets, writes = run(BACKLOG_THEN_DRAINED, restarts={T0 + 200}, every=1_000)
    assert writes[:1] == [T0] and T0 + 120 not in writes
    assert targets[:5] == [Size(4, 50)] * 5


def test_a_restart_holds_no_scale_up_the_process_it_replaces_would_make():
    """With no scale-up window, a backlog on the first poll after a restart scales up at once: the newest
    recommendation taken as made at the restart is not in a zero-length window (the simulator, restarting
    the operator every minute, found the scale-up held one poll)."""
    steady_then_backlog = [(T0 + t, lag) for t, lag in [(0, 50), (15, 50), (30, 50), (45, 6_000_000)]]
    continuous, _ = run(steady_then_backlog, start=Size(1, 16))
    restarted, _ = run(steady_then_backlog, restarts={T0 + 45}, start=Size(1, 16))
    assert continuous[-1] == Size(4, 50)
    assert restarted == continuous


# -- the write rate ---------------------------------------------------------------------------------------


def polls(recommended, every=AUTOSCALER_SAVE_SECONDS, interval=5.0, resized_at=()):
    """Polls every ``interval`` s for 10 minutes whose recommendation at poll i is ``recommended(i)``; the
    times the record was written."""
    state, record, last_saved, writes = ScalingState(Size(4, 16)), None, None, []
    for poll in range(120):
        now = T0 + interval * poll
        replicas = recommended(poll)
        state = replace(
            state, recommendations=window_memory((*state.recommendations, (now, replicas, 16)), now, LIMITS)
        )
        stored = state_from_record(record, state.current) if record is not None else None
        if save_due(record_changes(stored, state, LIMITS, now), poll in resized_at, last_saved, now, every):
            record, last_saved = record_of(state, now), now
            writes.append(now - T0)
    return writes


def test_a_steady_resource_writes_its_record_once():
    assert polls(lambda poll: 4) == [0.0]


def test_a_memory_that_changes_every_poll_is_written_at_most_once_per_save_interval():
    writes = polls(lambda poll: 1 + poll % 4)  # a new recommendation on every poll
    assert writes[0] == 0.0
    gaps = [later - earlier for earlier, later in itertools.pairwise(writes)]
    assert gaps and min(gaps) >= AUTOSCALER_SAVE_SECONDS
    assert len(writes) <= 600 / AUTOSCALER_SAVE_SECONDS + 1


def test_a_resize_writes_the_record_with_it():
    """A resize writes status anyway: the record rides along, whatever the rate."""
    writes = polls(lambda poll: 4 if poll < 7 else 2, every=10_000, resized_at={7})
    assert writes == [0.0, 35.0]


def test_counts_of_polls_in_a_row_matter_up_to_where_they_act():
    limits = replace(LIMITS, fallback_after=3)
    stored = as_stored = replace(LEARNED, failed_observations=3, silent_polls=2)
    assert record_changes(as_stored, replace(stored, failed_observations=7, silent_polls=9), limits, T0 + 30) == ()
    assert record_changes(as_stored, replace(stored, failed_observations=0), limits, T0 + 30) == (
        "failedObservations",
    ), "a reset count written late would make a restarted operator fall back after one failure"
    no_fallback = replace(LIMITS, fallback_after=0)
    assert record_changes(as_stored, replace(stored, failed_observations=0), no_fallback, T0 + 30) == ()


def test_a_learned_figure_is_written_when_it_moved_beyond_the_tolerance():
    drifted = replace(LEARNED, efficiency_samples=(0.9, 0.95, 0.93))  # median 0.925 -> 0.93
    moved = replace(LEARNED, efficiency_samples=(0.7, 0.72))  # median 0.925 -> 0.71
    assert record_changes(LEARNED, drifted, LIMITS, T0 + 30) == ()
    assert record_changes(LEARNED, moved, LIMITS, T0 + 30) == ("learned",)
    assert record_changes(LEARNED, replace(LEARNED, workload="new-image"), LIMITS, T0 + 30) == ("learned",)


def test_nothing_stored_is_written_at_once():
    assert save_due(record_changes(None, LEARNED, LIMITS, T0), False, T0 - 1, T0, 1_000)


# -- the first polls after a start ----------------------------------------------------------------------


def test_first_polls_are_spread_evenly_over_the_interval():
    started, interval = T0, 15.0
    uids = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"okc-{n}")) for n in range(10_000)]
    moments = [first_poll_at(uid, started, interval) for uid in uids]
    assert all(started <= at < started + interval for at in moments)
    counts = [0] * 10
    for at in moments:
        counts[int((at - started) / interval * 10)] += 1
    assert all(850 <= count <= 1_150 for count in counts), counts
    assert first_poll_at(uids[0], started + 60, interval) == moments[0] + 60, "a resource keeps its moment"


def test_only_resources_that_existed_before_the_start_wait_for_their_moment():
    started = T0 + 0.7  # 2025-06-15T15:06:40.700Z
    assert existed_before("2025-06-15T15:06:39Z", started)
    assert not existed_before("2025-06-15T15:06:40Z", started), "created in the second the operator started"
    assert not existed_before(None, started)


# -- times the record cannot have (review F3) -----------------------------------------------------------


def test_a_time_that_is_no_instant_is_refused_naming_the_field():
    """``1e20`` seconds is no time status can hold: read as one, writing the record again overflowed on
    every poll, and the resource was never scaled again."""
    for value in (1e20, -1e20):
        with pytest.raises(RecordError, match=r"^status\.autoscaler\.recommendations\[0\]\[0\]: .* out of range"):
            state_from_record({"recommendations": [[value, 3, 8]]}, Size(1, 16))
    with pytest.raises(RecordError, match=r"^status\.autoscaler\.savedAt: .* out of range"):
        saved_at({"savedAt": 1e20})


@pytest.mark.parametrize("field", ["recommendations", "replicaChanges", "stepStartedAt", "savedAt"])
def test_a_time_later_than_this_operator_s_clock_beyond_the_skew_is_refused_naming_the_field(field):
    """A replica whose clock ran ahead (by a day here) wrote the record: its times would hold a scale-down
    until that day. Up to ``RECORD_CLOCK_SKEW_SECONDS`` ahead is a clock a little off, and read."""
    ahead = instant(T0 + 86_400)
    record = {
        "recommendations": [[ahead, 3, 8]] if field == "recommendations" else [],
        "replicaChanges": [[ahead, 2]] if field == "replicaChanges" else [],
        "stepStartedAt": ahead if field == "stepStartedAt" else None,
        "savedAt": ahead if field == "savedAt" else instant(T0),
    }
    with pytest.raises(RecordError, match=rf"^status\.autoscaler\.{field}\b.* later than this operator's clock"):
        state_from_record(record, Size(1, 16), T0)
        saved_at(record, T0)
    state_from_record(record, Size(1, 16), T0 + 86_400 - RECORD_CLOCK_SKEW_SECONDS)
    saved_at(record, T0 + 86_400 - RECORD_CLOCK_SKEW_SECONDS)


def test_a_resumed_state_has_nothing_later_than_now():
    """Times a little ahead of this operator's clock (a predecessor's clock within the skew) are taken as now:
    a recommendation as made just before it, so it holds a scale-down no longer than its window from now."""
    ahead = replace(
        LEARNED,
        recommendations=((T0 + 20, 4, 8), (T0 + 30, 3, 8)),
        replica_changes=((T0 + 30, 4),),
        step_started_at=T0 + 30,
    )
    state = resumed(ahead, T0)
    assert state.recommendations == ((T0 - SEED_AGE, 4, 8), (T0 - SEED_AGE, 3, 8))
    assert state.replica_changes == ((T0, 4),)
    assert state.step_started_at == T0


@pytest.mark.parametrize("bad", [1e20, instant(T0 + 86_400)], ids=["no time", "a day ahead"])
def test_a_record_with_an_impossible_time_starts_the_autoscaler_afresh_and_is_written_again(bad, caplog):
    """The poll's side: the record is refused with a warning naming the field, the autoscaler starts as on a
    new resource, and the next record replaces the bad one."""
    record = {"savedAt": instant(T0 - 10), "recommendations": [[bad, 3, 8]]}
    poll = poll_of(poll_context(Clocks(T0, 100.0)), {"autoscaler": record})
    with caplog.at_level("WARNING", logger="keyorder_operator.poll"):
        state = poll.remembered_state(3)
    assert state.recommendations == ()
    assert "status.autoscaler.recommendations[0][0]" in caplog.text
    decision = decide(Observation(lag=0, partitions=4, drain_rate=0.0), LIMITS, state, poll.now)
    poll.keep_record(decision.state, LIMITS, resized=False)
    written = poll.patch.status["autoscaler"]["recommendations"]
    assert written[-1] == [instant(T0), 1, 16] and all(at <= instant(T0) for at, *_ in written), written


# -- a decision whose replicas were not written (review F1) -----------------------------------------------


def test_a_resize_not_made_is_neither_a_replica_change_nor_a_step():
    """``kubectl scale`` to 3 lands while a poll decides 1 -> 2 from 1: the write is refused. Kept as made, the
    next polls would apply the rate limits from 1 and time a step that never ran."""
    before = ScalingState(Size(1, 16), replica_changes=((T0 - 5, 2),))  # scaled down from 2 a poll ago
    decision = decide(Observation(lag=6_000_000, partitions=4), LIMITS, before, T0)
    assert decision.target.replicas > 1 and decision.state.replica_changes[-1] == (T0, 1)
    assert decision.state.step_started_at == T0
    kept = not_resized(decision, T0)
    assert kept.current == Size(1, 16)
    assert kept.replica_changes == ((T0 - 5, 2),)
    assert kept.step_started_at is None
    assert not kept.settled, "somebody else changed the size: the next drain is over two sizes"
    assert kept.recommendations == decision.state.recommendations, "the recommendation was made all the same"
    record = record_of(kept, T0)
    assert record["replicaChanges"] == [[instant(T0 - 5), 2]] and "stepStartedAt" not in record


# -- a failover (review F2) -------------------------------------------------------------------------------


def test_a_memory_is_kept_while_the_process_looks_and_dropped_after_a_gap_longer_than_it_lasts():
    assert memory_lasts(15, 5) == 35
    assert memory_lasts(1, 5) == 15, "an interval shorter than a tick is a tick"
    clocks = Clocks(T0, 100.0)
    context = poll_context(clocks)
    memory = poll_of(context).memory
    memory.autoscaler = {"failedObservations": 7}
    for _ in range(20):  # looked at every tick: the memory stays, however long
        clocks.advance(TICK)
        assert poll_of(context).memory is memory
    clocks.advance(memory_lasts(INTERVAL, TICK))  # paused: up to the limit, kept
    assert poll_of(context).memory is memory
    clocks.advance(memory_lasts(INTERVAL, TICK) + 0.001)
    assert poll_of(context).memory is not memory
    assert context.poll_memory("default", "orders").autoscaler is None


def test_a_replica_paused_longer_than_its_memory_lasts_resumes_from_what_its_successor_wrote():
    """kopf's peering paused this replica (another one with a higher priority came) and resumed it later: the
    replica that acted meanwhile wrote status. The memory from before the pause (its failed observations, its
    last lag sample, its own writes awaited in the watched body) is not laid over it."""
    clocks = Clocks(T0, 100.0)
    context = poll_context(clocks)
    before = poll_of(context, {"lag": 5})
    before.memory.autoscaler = state_to_status(ScalingState(Size(4, 16), failed_observations=7))
    before.memory.started_at = before.now
    before.memory.last_sample = {"at": before.now, "partitions": 4, "endTotal": 10, "committedTotal": 5}
    before.patch.status["lag"] = 0
    before.write_status()
    assert before.memory.written
    clocks.advance(600)  # paused for ten minutes
    successor = ScalingState(Size(2, 16), recommendations=((clocks.wall - 10, 2, 16),), failed_observations=1)
    status = {"lag": 9, "autoscaler": through_the_api_server(record_of(successor, clocks.wall - 5))}
    after = poll_of(context, status)
    assert after.memory.autoscaler is None and after.memory.last_sample is None and not after.memory.written
    assert after.status["lag"] == 9, "its own write from before the pause was laid over the successor's"
    state = after.remembered_state(2)
    assert state.failed_observations == 1
    assert state.recommendations == ((clocks.wall - SEED_AGE, 2, 16),)
    assert after.memory.autoscaler_saved_at == clocks.wall - 5


UIDS = [str(uuid.uuid5(uuid.NAMESPACE_URL, f"okc-{n}")) for n in range(40)]


def test_a_standby_that_takes_over_spreads_its_first_polls_over_the_interval_from_the_takeover():
    """The standby started an hour before it took over; kopf ran none of its timers meanwhile. Its first polls
    are spread over the first interval from the takeover, not all made on its first tick."""
    clocks = Clocks(T0, 100.0)
    context = poll_context(clocks)  # the standby starts, paused by kopf's peering
    clocks.advance(3_600)
    takeover = clocks.wall
    due = {uid for n, uid in enumerate(UIDS) if poll_of(context, name=f"okc-{n}", uid=uid).due()}
    assert len(due) < len(UIDS) / 2, f"{len(due)} of {len(UIDS)} polled on the first tick"
    slack = TICK / 2
    assert due == {uid for uid in UIDS if first_poll_at(uid, takeover, INTERVAL) - slack <= takeover}
    assert context.active_since == takeover
    clocks.advance(TICK)
    later = {uid for n, uid in enumerate(UIDS) if poll_of(context, name=f"okc-{n}", uid=uid).due()}
    assert later == {uid for uid in UIDS if first_poll_at(uid, takeover, INTERVAL) - slack <= takeover + TICK}
    assert context.active_since == takeover, "a tick after a tick is no takeover"


def test_the_operator_is_active_from_its_start_or_from_the_first_tick_after_a_silence():
    clocks = Clocks(T0, 100.0)
    context = poll_context(clocks)
    clocks.advance(ACTIVE_GAP_TICKS * TICK)  # the first tick as soon as kopf runs: active since the start
    assert context.looked(clocks.wall, clocks.monotonic) == T0
    clocks.advance(ACTIVE_GAP_TICKS * TICK + 0.001)  # no tick of anything meanwhile: paused, or nothing to poll
    assert context.looked(clocks.wall, clocks.monotonic) == clocks.wall
    assert became_active(None, 0.0, TICK)


def test_a_resource_created_since_or_just_before_the_takeover_is_polled_at_once():
    clocks = Clocks(T0, 100.0)
    context = poll_context(clocks)
    clocks.advance(3_600)
    late = next(uid for uid in UIDS if first_poll_at(uid, clocks.wall, INTERVAL) > clocks.wall + INTERVAL / 2)
    just_before = instant(clocks.wall - CREATED_JUST_BEFORE_SECONDS + 1)
    assert poll_of(context, uid=late, created=just_before).due()
    assert not poll_of(context, name="older", uid=late, created=instant(T0)).due()
    assert first_poll_spread(instant(T0), clocks.wall)
    assert not first_poll_spread(just_before, clocks.wall)
