"""Issue 36's defects as named plans of the pod simulation: each one failed on the code before its fix.

A random seed finds an interleaving by chance; these plans make one likely on purpose, with a
workload and faults aimed at one defect, so that each defect keeps a seed that would catch it
again. ``python -m tests.simulation --regressions`` runs them all; ``--plan NAME --seed N`` one.
Each entry names the invariant that failed on the code before the fix and the message it gave
there (run against commit 62264b1 in a worktree, with ``tests/simulation`` copied in), and the commit
that fixed it: the plan fails on that commit's parent and holds on it. Defect 8 is a
cost; its poll-loop part is caught as a loop that redoes the same flow decision turn after turn.
The simulation's findings F3 and F6 (docs/testing.md) keep plans here too; the simulation they fail
under gives records leader epochs, which their fix (d8d435f) also brought to the code, so on its
parent 43b1399 they ran with three check-only shims (``contracts.FetchPosition``, a
``Message.leader_epoch`` field the old runtime ignores, ``offset_metadata.leader_epoch`` returning None).
The review's prefetch finding (prefetched-past-a-truncation) needs the client fake's prefetch, which came
with its fix: it fails on the fix's parent with this simulation copied in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.simulation.workload import Burst, Fault, HandlerPlan, Key, Plan, Scripted


@dataclass(frozen=True)
class Regression:
    defect: str
    """The defect of issue 36 it stands for."""
    seed: int
    plan: Callable[[int], Plan]
    failed_before: str
    """The violation it reported on the code before the fix."""
    fixed_by: str = ""
    """The commit that fixed the defect (the plan fails on its parent and holds on it)."""


def _flags(**overrides: Any) -> dict[str, Any]:
    flags: dict[str, Any] = {
        "topics": "orders",
        "group_id": "simulated",
        "bootstrap_servers": "simulated:9092",
        "handler": "tests.simulation.workload:handler_for_the_process_executor",
        "executor": "thread",
        "workers": 2,
        "max_workers": 16,
        "max_inflight": 100,
        "max_inflight_per_partition": 50,
        "max_uncommitted": 400,
        "pause_after": 0.5,
        "poll_batch": 100,
        "commit_interval": 0.2,
        "max_attempts": 3,
        "retry_initial_backoff": 0.05,
        "retry_max_backoff": 0.5,
        "on_exhausted": "dlq",
        "revoke_drain_timeout": 5.0,
        "shutdown_grace": 10.0,
        "kafka_property": [],
    }
    flags.update(overrides)
    return flags


def _handler(seed: int, **overrides: Any) -> HandlerPlan:
    values: dict[str, Any] = {
        "seed": seed,
        "fail_rate": 0.0,
        "flaky_attempts": 1,
        "base_duration": (0.005, 0.02),
        "long_rate": 0.0,
        "long_duration": (0.5, 1.0),
        "dead_letter_failures": 0,
    }
    values.update(overrides)
    return HandlerPlan(**values)


def _plan(
    name: str,
    seed: int,
    flags: dict[str, Any],
    keys: tuple[Key, ...],
    script: tuple[Scripted, ...],
    faults: tuple[Fault, ...] = (),
    partitions: int = 1,
    bursts: tuple[Burst, ...] = (),
    handler: HandlerPlan | None = None,
) -> Plan:
    return Plan(
        seed,
        flags,
        {"orders": partitions},
        keys,
        bursts,
        faults,
        handler or _handler(seed),
        quiet_limit=60.0,
        preemption=0.2,
        name=name,
        script=script,
    )


def idle_process_killed(seed: int) -> Plan:
    """Defect 1: a worker process killed while idle made the next batch count as handled without running."""
    keys = (Key("a", 1.0, (0,)),)
    script = tuple(Scripted(0.5 + 0.1 * index, "a", 0) for index in range(3))
    script += tuple(Scripted(3.0 + 0.1 * index, "a", 0) for index in range(3))
    faults = (Fault(2.0, "kill_process", {"busy": False}),)
    return _plan("idle-process-killed", seed, _flags(executor="process", workers=1), keys, script, faults)


def blocked_key_stalls_the_pod(seed: int) -> Plan:
    """Defect 2: a partition blocked by a poison key (onExhausted block) held the pod's budget, and the
    healthy partition stayed paused for good."""
    keys = (Key("poison", 1.0, (0,), poison=1.0), Key("healthy", 1.0, (1,)))
    script = tuple(Scripted(0.5 + 0.01 * index, "poison", 0, poison=True) for index in range(12))
    script += tuple(Scripted(0.6 + 0.1 * index, "healthy", 1) for index in range(40))
    flags = _flags(
        on_exhausted="block",
        max_attempts=1,
        max_inflight=8,
        max_inflight_per_partition=8,
        max_uncommitted=8,
        pause_after=0.1,
        retry_max_backoff=1.0,
    )
    return _plan("blocked-key-stalls-the-pod", seed, flags, keys, script, partitions=2)


def revoke_waits_for_a_failed_handler(seed: int) -> Plan:
    """Defect 3: a handler of a revoked partition that failed after the withdraw kept the revoke waiting
    for the whole drain timeout."""
    keys = (Key("a", 1.0, (0,), fails=1, duration=1.0), Key("b", 1.0, (1,)))
    script = (Scripted(0.5, "a", 0), *(Scripted(0.5 + 0.2 * index, "b", 1) for index in range(20)))
    faults = (Fault(1.2, "move_elsewhere", {"partition": 0, "seconds": 2.0}),)
    flags = _flags(revoke_drain_timeout=5.0, retry_initial_backoff=0.2, retry_max_backoff=0.2)
    return _plan("revoke-waits-for-a-failed-handler", seed, flags, keys, script, faults, partitions=2)


def static_member_keeps_partitions(seed: int) -> Plan:
    """Defect 4: a static member under group.protocol=consumer only leaves for a while (member epoch -2);
    the broker kept the stopped pod's partitions until the session timed out."""
    keys = (Key("a", 1.0, (0, 1)),)
    script = tuple(Scripted(0.5 + 0.2 * index, "a", index % 2) for index in range(40))
    faults = (Fault(2.0, "rolling_restart", {"restart_after": 0.5}),)  # the old pod stops for good
    flags = _flags(kafka_property=["group.protocol=consumer", "group.instance.id=pod-a"])
    return _plan("static-member-keeps-partitions", seed, flags, keys, script, faults, partitions=2)


def shutdown_waits_for_a_blocked_key(seed: int) -> Plan:
    """Defect 5: SIGTERM waited the whole shutdown grace for a blocked key with no handler running."""
    keys = (Key("poison", 1.0, (0,), poison=1.0), Key("b", 1.0, (0,)))
    script = (Scripted(0.5, "poison", 0, poison=True), *(Scripted(0.6 + 0.1 * index, "b", 0) for index in range(10)))
    faults = (Fault(3.0, "sigterm", {"restart_after": 1.0}),)
    flags = _flags(on_exhausted="block", max_attempts=1, retry_max_backoff=60.0, shutdown_grace=10.0)
    return _plan("shutdown-waits-for-a-blocked-key", seed, flags, keys, script, faults)


def paused_partition_holds(seed: int) -> Plan:
    """Defect 6: a partition paused on its uncommitted bound that was also full in flight still held up
    reading for --pause-after."""
    keys = (Key("poison", 1.0, (0,), poison=1.0), Key("healthy", 1.0, (1,)))
    # exactly the poison partition's bounds (4 in flight, 4 uncommitted): paused on its uncommitted bound and
    # full in flight, and no more than the pod's low-water mark (the pod bound stalls nothing here)
    script = tuple(Scripted(0.5 + 0.01 * index, "poison", 0, poison=True) for index in range(4))
    script += tuple(Scripted(0.6 + 0.05 * index, "healthy", 1) for index in range(80))
    flags = _flags(
        on_exhausted="block",
        max_attempts=1,
        max_inflight=8,
        max_inflight_per_partition=4,
        max_uncommitted=8,
        pause_after=5.0,
        retry_max_backoff=1.0,
    )
    return _plan("paused-partition-holds", seed, flags, keys, script, partitions=2)


def retry_due_time_missed(seed: int) -> Plan:
    """Defect 7: a retry parked by a worker that went on to a long handler was not run at its due time
    while the other worker idled (a batch of fast lanes settled its park only at the batch's end)."""
    fast = tuple(Key(f"f{index}", 1.0, (0,), duration=0.00001) for index in range(12))
    keys = (*fast, Key("retry", 1.0, (0,), fails=1, duration=0.00001), Key("long", 1.0, (0,), duration=10.0))
    script = tuple(Scripted(0.3 + 0.001 * index, f"f{index % 12}", 0) for index in range(400))
    # four ready lanes for two workers: one worker takes the first two in one turn (the handler is fast)
    script += (Scripted(2.0, "retry", 0), Scripted(2.0, "long", 0), Scripted(2.0, "f0", 0), Scripted(2.0, "f1", 0))
    flags = _flags(
        workers=2,
        retry_initial_backoff=0.1,
        retry_max_backoff=0.1,
        poll_batch=500,
        max_inflight=500,
        max_inflight_per_partition=500,
        max_uncommitted=2000,
        commit_interval=0.05,
        pause_after=0.0,
    )
    return _plan("retry-due-time-missed", seed, flags, keys, script)


def paused_loop_spins(seed: int) -> Plan:
    """Defect 8 (the poll loop's part): while a partition was paused the loop turned every 5 ms and redid the
    whole flow decision each turn, though nothing had changed. A blocked key keeps one partition paused on
    its uncommitted bound; the other partition has nothing to read."""
    keys = (Key("poison", 1.0, (0,), poison=1.0), Key("other", 1.0, (1,)))
    script = tuple(Scripted(0.5 + 0.01 * index, "poison", 0, poison=True) for index in range(4))
    script += (Scripted(0.6, "other", 1), Scripted(8.0, "other", 1))
    flags = _flags(on_exhausted="block", max_attempts=1, max_inflight=8, max_inflight_per_partition=4,
                   max_uncommitted=8, retry_max_backoff=30.0, commit_interval=1.0)  # fmt: skip
    return _plan("paused-loop-spins", seed, flags, keys, script, partitions=2)


def withdrawn_blocked_head(seed: int) -> Plan:
    """Defect 9: withdrawing a blocked head (its partition revoked) left its lane marked blocked, so the
    key's next head (from another partition) was reported blocked though it never failed."""
    keys = (Key("k", 1.0, (0, 1), duration=0.5),)
    script = (Scripted(0.5, "k", 0, poison=True), *(Scripted(0.8 + 0.05 * index, "k", 1) for index in range(4)))
    # the first attempt fails at about 1.02 s; its retry waits at least half the 1 s backoff: revoked while parked
    faults = (Fault(1.2, "move_elsewhere", {"partition": 0, "seconds": 3.0}),)
    flags = _flags(on_exhausted="block", max_attempts=1, retry_max_backoff=1.0)
    return _plan("withdrawn-blocked-head", seed, flags, keys, script, faults, partitions=2)


def truncated_while_fetched(seed: int) -> Plan:
    """Finding F3: a partition's log truncated below what the pod has received while it fetches (an unclean
    leader election): librdkafka moves the position back to the truncation point (KIP-320), and the new
    records at the reused offsets were taken for re-deliveries (``PartitionOffsets.received``: an offset at
    or below the last received one) and never run, while the commit moved past them. Now their greater
    leader epoch tells them apart (``LogTruncated``)."""
    keys = (Key("k", 1.0, (0,)),)
    script = tuple(Scripted(0.5 + 0.05 * index, "k", 0) for index in range(10))
    script += tuple(Scripted(4.0 + 0.05 * index, "k", 0) for index in range(5))
    faults = (Fault(3.0, "truncate", {"partition": 0, "back": 5}),)
    return _plan("truncated-while-fetched", seed, _flags(), keys, script, faults)


def metadata_outlives_a_truncation(seed: int) -> Plan:
    """Finding F6: commit metadata written before a truncation marked the new log's records done. A key's
    retry holds the committed offset at 2 while 3-9 finish (metadata: 3-9 done); the pod stops; the log is
    truncated at 1 and refilled; the next pod is assigned offset 2 (inside the new log: librdkafka does not
    validate a committed offset when the fetch starts) and skipped the new records 3-9 as done by the
    metadata. Now the metadata records its log's leader epoch, and the new records' greater one voids it."""
    keys = (Key("slow", 1.0, (0,), fails=1), *(Key(f"k{index}", 1.0, (0,)) for index in range(3)))
    script = (Scripted(0.5, "k0", 0), Scripted(0.5, "k1", 0), Scripted(0.5, "slow", 0))
    script += tuple(Scripted(0.6 + 0.01 * index, f"k{index % 3}", 0) for index in range(7))
    script += tuple(Scripted(3.0 + 0.01 * index, f"k{index % 3}", 0) for index in range(12))
    faults = (
        Fault(1.0, "sigterm", {"restart_after": 2.5}),
        Fault(2.0, "truncate", {"partition": 0, "back": 9}),
    )
    flags = _flags(retry_initial_backoff=5.0, retry_max_backoff=5.0, shutdown_grace=0.5)
    return _plan("metadata-outlives-a-truncation", seed, flags, keys, script, faults)


def prefetched_past_a_truncation(seed: int) -> Plan:
    """Review of F3 (high): records librdkafka had prefetched past a truncation point were lost. The pod reads
    slowly (one key, 0.1 s calls, 4 in flight, held, never paused) while the client has fetched the whole
    log; the log is truncated at 20 while the pod has received about 14: librdkafka validates its fetch
    position, seeks to 20 and purges the queued records, 15-19 too. The new log's 20 (a greater leader
    epoch) was taken for an ordinary gap above the last received offset, and the pod committed past 15-19.
    Now a greater epoch above the next expected offset sends the partition back there (``EpochGap``)."""
    keys = (Key("k", 1.0, (0,), duration=0.1),)
    script = tuple(Scripted(0.5 + 0.001 * index, "k", 0) for index in range(40))
    script += tuple(Scripted(3.0 + 0.05 * index, "k", 0) for index in range(5))
    faults = (Fault(1.5, "truncate", {"partition": 0, "back": 20}),)
    flags = _flags(max_inflight=4, max_inflight_per_partition=4, pause_after=30.0)
    return _plan("prefetched-past-a-truncation", seed, flags, keys, script, faults)


REGRESSIONS: dict[str, Regression] = {
    "idle-process-killed": Regression(
        "1",
        1,
        idle_process_killed,
        "[commits] at 3.202s: pod session 1 committed orders[0] at offset 4 while orders[0]@3 key a seq 3 below it "
        "was not handled (handled never)",
        fixed_by="a6643e4",
    ),
    "blocked-key-stalls-the-pod": Regression(
        "2",
        1,
        blocked_key_stalls_the_pod,
        "[liveness] at 1.800s: pod session 1: orders[1] had work that could run (orders[1]@0 key healthy seq 0) "
        "and an idle worker (0 of 2 busy) from 1.800s to 3.350s without a handler start (...; paused: True); "
        "[at least once] 40 records never handled by the end",
        fixed_by="d1e8488",
    ),
    "revoke-waits-for-a-failed-handler": Regression(
        "3",
        1,
        revoke_waits_for_a_failed_handler,
        "[revoke bound] at 1.369s: pod session 1's revoke of orders[0] took 0.340s (until 1.709s); the 1 handler "
        "calls it waited for ended by 1.518s (bound 1.618s, drain timeout 5s)",
        fixed_by="cca610b",
    ),
    "static-member-keeps-partitions": Regression(
        "4",
        1,
        static_member_keeps_partitions,
        "[handover] at 2.537s: pod session 1 stopped at 2.537s, but the broker kept orders[1] assigned to it until "
        "47.550s: its leave was only temporary (now: the configuration is refused)",
        fixed_by="515e98d",
    ),
    "shutdown-waits-for-a-blocked-key": Regression(
        "5",
        1,
        shutdown_waits_for_a_blocked_key,
        "[shutdown bound] at 3.000s: pod session 1 was asked to stop at 3.000s and stopped at 13.012s, although its "
        "last handler call or dead-letter write ended at 3.000s (bound 3.200s; grace 10s)",
        fixed_by="ba9dbdb",
    ),
    "paused-partition-holds": Regression(
        "6",
        1,
        paused_partition_holds,
        "[flow] at 0.618s: pod session 1's poll loop held reading for 5.000s although no partition full in flight "
        "was unpaused (full: orders[0]; paused: orders[0]; pod 5 in flight of 8)",
        fixed_by="44f1bf6",
    ),
    "retry-due-time-missed": Regression(
        "7",
        1,
        retry_due_time_missed,
        "[liveness] at 2.100s: pod session 1: orders[0] had work that could run (orders[0]@400 key retry seq 0) and "
        "an idle worker (1 of 2 busy) from 2.100s to 3.400s without a handler start (bound 1.27s; ...)",
        fixed_by="61ae099",
    ),
    "paused-loop-spins": Regression(
        "8",
        1,
        paused_loop_spins,
        "[flow] at 1.123s: pod session 1's poll loop made the same flow decision 50 times in a row from 1.123s to "
        "1.373s while orders[0] was paused and nothing it is made from changed (each an O(partitions) walk)",
        fixed_by="acc10de",
    ),
    "withdrawn-blocked-head": Regression(
        "9",
        1,
        withdrawn_blocked_head,
        "[lanes] at 1.350s: pod session 1's lanes report orders[1]@0 blocked, but orders[1]@0 key k seq 0 has failed "
        "0 times, fewer than --max-attempts 1",
        fixed_by="0b5e138",
    ),
    "truncated-while-fetched": Regression(
        "F3",
        1,
        truncated_while_fetched,
        "[at least once] 5 records never handled by the end, the first orders[0]@5 key k seq 10 produced at 4.000s "
        "(never called)",
        fixed_by="d8d435f",
    ),
    "metadata-outlives-a-truncation": Regression(
        "F6",
        1,
        metadata_outlives_a_truncation,
        "[commits] at 3.812s: pod session 2's commit of orders[0]@2 marks offset 3 done in its metadata, but "
        "orders[0]@3 key k2 seq 2 was not handled (handled never)",
        fixed_by="d8d435f",
    ),
    "prefetched-past-a-truncation": Regression(
        "F3 review",
        1,
        prefetched_past_a_truncation,
        "[commits] at 3.003s: pod session 1 committed orders[0] at offset 20 while orders[0]@12 key k seq 12 below it "
        "was not handled (handled never); [order] orders[0]@20 started before @19; [at least once] 8 records never "
        "handled (on 6b56f20's parent with this simulation)",
        fixed_by="6b56f20",
    ),
}
"""Name -> regression (the name is ``--plan``'s value)."""


OPEN_FINDINGS: dict[str, Regression] = {}
"""Plans that still fail on the current code: findings of the simulation, not yet fixed (not in ``--regressions``).
None now: the last one (seed 70213, a partition left unread past the liveness bound while the others' holds followed
each other) was the simulated client's, which let a partition paused and resumed overtake records queued before
it; librdkafka's consumer queue is one FIFO (``SimulatedSource._fetch``)."""
