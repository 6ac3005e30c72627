"""How a wave's messages reach its handler tasks: through a shuffle, or read by the tasks themselves.

A key's messages must meet in one task. The *shuffle* layout gets there for any number of tasks:
every split is read first, then each message moves to the task of its key's hash. But the shuffle
is a barrier: no handler starts before the last split is read, so a wave takes its read stage
*plus* its longest key chain, and every message is written to and read from shuffle files.

Both give the same order, ``ORDER_GUARANTEE``: the unit of order is (topic, partition, key), the
pods' own. The shuffle routes a record by the hash of its key *within its partition*, so a key that
sits in two partitions (partitions were added) is two units in either layout, each in offset order,
handled independently; ``--layout auto`` may pick another layout for the next wave without changing
what such a key gets.

Kafka keeps a key in one partition while the partition count stays (the pods rely on it too). So when
there are at least as many partitions with messages as tasks, a task can take whole partitions, read
them and hand the messages to its handlers as they arrive: the *by-partition* layout. Reading overlaps handling, a hot
key's chain starts with the wave, and nothing is shuffled or sorted. It cannot split one partition
over several tasks (that would read it several times), so it needs enough partitions, and whole
partitions must share the tasks evenly: ``choose_layout`` deals the partitions out largest first to
the least loaded task and takes that only if no task is more than ``BALANCE_TOLERANCE`` above an
even share; otherwise the shuffle, which balances by key, is the better trade.

Pure: the job passes each wave's range sizes and its key partitions, and ships what comes back.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

ORDER_GUARANTEE = (
    "per key, in offset order within a partition, as the pods give it: a key's messages of one partition "
    "are handled one at a time in offset order; a key in two partitions (after partitions were added) is "
    "handled in each independently, in both layouts, so --layout auto switching between them changes "
    "nothing for it"
)
"""The one ordering guarantee of catch-up, as ``--plan`` and the report state it (docs/catchup.md)."""


class Layout(StrEnum):
    AUTO = "auto"
    SHUFFLE = "shuffle"
    BY_PARTITION = "by-partition"


BALANCE_TOLERANCE = 0.10
"""``auto`` takes by-partition only if its busiest task holds at most this much above an even share."""


@dataclass(frozen=True)
class WaveLayout:
    layout: Layout
    handler_tasks: int
    """Spark tasks that run the handlers: the key partitions (shuffle) or the dealt tasks (by-partition)."""
    reason: str
    tasks: tuple[tuple[int, ...], ...] = ()
    """By-partition: each task's sources (indexes into the plan's partitions); shuffle: none."""

    def report(self) -> dict[str, object]:
        return {"layout": self.layout.value, "tasks": self.handler_tasks, "reason": self.reason}


def deal_partitions(sizes: Mapping[int, int], tasks: int) -> tuple[tuple[int, ...], ...]:
    """The sources with messages dealt to at most ``tasks`` tasks, largest first to the least loaded
    (ties: the lower task); each task's sources in plan order."""
    loads: list[tuple[int, int]] = [(0, task) for task in range(max(tasks, 1))]
    dealt: dict[int, list[int]] = {}
    for source in sorted((s for s, size in sizes.items() if size > 0), key=lambda s: (-sizes[s], s)):
        load, task = heapq.heappop(loads)
        dealt.setdefault(task, []).append(source)
        heapq.heappush(loads, (load + sizes[source], task))
    return tuple(tuple(sorted(sources)) for _, sources in sorted(dealt.items()))


def _tasks(count: int) -> str:
    return f"{count} task" if count == 1 else f"{count} tasks"


def choose_layout(requested: Layout, sizes: Mapping[int, int], key_partitions: int) -> WaveLayout:
    """The layout of a wave whose sources hold ``sizes`` messages (offsets) each, for ``key_partitions`` tasks."""
    busy = {source: size for source, size in sizes.items() if size > 0}

    def shuffle(why: str) -> WaveLayout:
        return WaveLayout(Layout.SHUFFLE, key_partitions, f"shuffle into {key_partitions} key partitions: {why}")

    def by_partition(why: str) -> WaveLayout:
        return WaveLayout(
            Layout.BY_PARTITION, len(dealt), f"{len(busy)} partitions read by {_tasks(len(dealt))}{why}", dealt
        )

    if requested is Layout.SHUFFLE:
        return shuffle("--layout shuffle")
    dealt = deal_partitions(busy, key_partitions)
    total = sum(busy.values())
    busiest = max((sum(busy[s] for s in task) for task in dealt), default=0)
    even = total / max(key_partitions, 1)
    over = busiest / even - 1 if even else 0.0
    if requested is Layout.BY_PARTITION:
        return by_partition(f": --layout by-partition (the busiest task holds {over:+.0%} against an even share)")
    if len(busy) < key_partitions:
        return shuffle(f"only {len(busy)} partitions have messages, fewer than the {key_partitions} tasks")
    if busiest > even * (1 + BALANCE_TOLERANCE):
        return shuffle(
            f"whole partitions would leave the busiest of {key_partitions} tasks {over:.0%} above an even "
            f"share (at most {BALANCE_TOLERANCE:.0%})"
        )
    return by_partition(f", handled as they are read (no shuffle; the busiest task {over:+.0%} against an even share)")
