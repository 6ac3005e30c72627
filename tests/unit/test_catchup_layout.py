"""``layout``: whether a wave's tasks read whole partitions (no shuffle) or take their keys from a shuffle."""

from __future__ import annotations

import pytest

from keyorder.catchup.layout import BALANCE_TOLERANCE, Layout, choose_layout, deal_partitions


def test_partitions_are_dealt_largest_first_to_the_least_loaded_task() -> None:
    assert deal_partitions({0: 10, 1: 10, 2: 10, 3: 10}, 2) == ((0, 2), (1, 3))
    assert deal_partitions({0: 50, 1: 30, 2: 20, 3: 0}, 2) == ((0,), (1, 2))  # an empty partition: no reader
    assert deal_partitions({0: 5}, 4) == ((0,),)  # never more tasks than partitions with messages


def test_auto_reads_whole_partitions_when_they_share_the_tasks_evenly() -> None:
    chosen = choose_layout(Layout.AUTO, {0: 1000, 1: 1020, 2: 990, 3: 1010}, 2)
    assert chosen.layout is Layout.BY_PARTITION
    assert sorted(source for task in chosen.tasks for source in task) == [0, 1, 2, 3]
    assert len(chosen.tasks) == 2 and "no shuffle" in chosen.reason


def test_auto_shuffles_when_fewer_partitions_have_messages_than_tasks() -> None:
    chosen = choose_layout(Layout.AUTO, {0: 1000, 1: 1000, 2: 0}, 4)
    assert chosen.layout is Layout.SHUFFLE
    assert "only 2 partitions have messages, fewer than the 4 tasks" in chosen.reason


def test_auto_shuffles_when_whole_partitions_would_leave_a_task_overloaded() -> None:
    # 5 equal partitions on 4 tasks: one task holds 2 of them, 60% above an even share
    chosen = choose_layout(Layout.AUTO, dict.fromkeys(range(5), 1000), 4)
    assert chosen.layout is Layout.SHUFFLE
    assert "60% above an even share" in chosen.reason


@pytest.mark.parametrize(
    ("busiest", "expected"),
    [(1000 * (1 + BALANCE_TOLERANCE), Layout.BY_PARTITION), (1000 * (1 + BALANCE_TOLERANCE) + 60, Layout.SHUFFLE)],
)
def test_the_balance_tolerance_is_the_boundary(busiest: float, expected: Layout) -> None:
    # two tasks: the busiest holds `busiest`, the other the rest of 2,000 (even share 1,000)
    sizes = {0: int(busiest), 1: 2000 - int(busiest)}
    assert choose_layout(Layout.AUTO, sizes, 2).layout is expected


def test_an_explicit_layout_is_kept_and_said_so() -> None:
    sizes = dict.fromkeys(range(5), 1000)
    forced = choose_layout(Layout.BY_PARTITION, sizes, 4)
    assert forced.layout is Layout.BY_PARTITION and "--layout by-partition" in forced.reason
    assert "+60%" in forced.reason
    shuffled = choose_layout(Layout.SHUFFLE, {0: 10, 1: 10}, 2)
    assert shuffled.layout is Layout.SHUFFLE and shuffled.handler_tasks == 2
    assert "--layout shuffle" in shuffled.reason


def test_merged_chunks_keep_each_streams_order_and_go_least_progress_first() -> None:
    from keyorder.catchup.datasource import PROGRESS_SCALE, merge_chunks

    def row(source: int, progress: int, marker: int | None = None) -> tuple:
        return (0, source, progress, progress, b"k", b"v", [], None, marker, None)

    first = iter([[row(0, 0), row(0, 10)], [row(0, 20)], [row(0, PROGRESS_SCALE, marker=3)]])
    second = iter([[row(1, 5)], [row(1, 15)], [row(1, 30)]])
    merged = [[(r[1], r[2]) for r in chunk] for chunk in merge_chunks([lambda: first, lambda: second])]
    assert merged == [[(0, 0), (0, 10)], [(1, 5)], [(1, 15)], [(0, 20)], [(0, PROGRESS_SCALE)], [(1, 30)]]
