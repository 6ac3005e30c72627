"""Lanes per ordering mode: the one place that says what must stay in order."""

from __future__ import annotations

import pytest

from keyorder.core.routing import Ordering, lanes_function


@pytest.mark.parametrize(
    ("ordering", "key", "expected"),
    [
        (Ordering.KEY, b"k1", b"k1"),
        (Ordering.KEY, b"", b""),  # an empty key is a key, not "no key"
        (Ordering.KEY, None, ("orders", 3)),  # keyless: ordered per partition
        (Ordering.PARTITION, b"k1", ("orders", 3)),
        (Ordering.PARTITION, None, ("orders", 3)),
        (Ordering.UNORDERED, b"k1", None),
        (Ordering.UNORDERED, None, None),
    ],
)
def test_lane_per_ordering_mode(ordering: Ordering, key: bytes | None, expected: object) -> None:
    assert lanes_function(ordering)(("orders", 3), [key, key]) == [expected, expected]


def test_ordering_accepts_its_string_values_and_rejects_others() -> None:
    assert lanes_function("partition")(("t", 1), [b"k"]) == [("t", 1)]
    with pytest.raises(ValueError, match="random"):
        lanes_function("random")


def test_keyless_messages_of_one_partition_share_a_lane_and_partitions_differ() -> None:
    lanes_of = lanes_function(Ordering.KEY)
    assert lanes_of(("orders", 5), [None, b"k", None]) == [("orders", 5), b"k", ("orders", 5)]
    assert len({lanes_of(("orders", partition), [None])[0] for partition in range(32)}) == 32
    assert lanes_of(("orders", 5), [None]) != lanes_of(("payments", 5), [None])
