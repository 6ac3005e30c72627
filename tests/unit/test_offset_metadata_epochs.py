"""Commit metadata with the leader epoch of the log it is about (issue 36, finding F6), and the first
release's format, which is still read and still written when the epoch is unknown."""

from __future__ import annotations

import pytest

from keyorder.core.offset_metadata import MAX_METADATA_BYTES, decode, decode_checked, encode, leader_epoch


def test_the_epoch_is_written_and_read_back_with_the_set() -> None:
    metadata = encode(100, [102, 103, 150], leader_epoch=7)
    assert metadata.startswith("ko2:100:7:")
    decoded = decode_checked(metadata, 100)
    assert decoded.done == {102, 103, 150} and decoded.leader_epoch == 7 and decoded.refused is None
    assert leader_epoch(metadata) == 7


def test_without_an_epoch_the_first_format_is_written_and_read_as_before() -> None:
    metadata = encode(100, [102, 103])
    assert metadata.startswith("ko1:100:")
    decoded = decode_checked(metadata, 100)
    assert decoded.done == {102, 103} and decoded.leader_epoch is None
    assert leader_epoch(metadata) is None


def test_an_empty_set_keeps_its_epoch() -> None:
    metadata = encode(5, [], leader_epoch=3)
    assert decode_checked(metadata, 5) == (set(), None, 3)
    assert leader_epoch(metadata) == 3


def test_a_set_cut_to_the_limit_keeps_its_epoch() -> None:
    metadata = encode(0, list(range(1, 400_000, 3)), leader_epoch=2**31 - 1)
    assert len(metadata) <= MAX_METADATA_BYTES
    assert decode_checked(metadata, 0).leader_epoch == 2**31 - 1


@pytest.mark.parametrize(
    "metadata",
    ["ko2:100:x:r:eNoDAAAAAAE=", "ko2:100:-1:r:eNoDAAAAAAE=", "ko2:100:r:eNoDAAAAAAE=", "ko2:100:5"],
)
def test_a_malformed_epoch_is_ignored_with_the_set(metadata: str) -> None:
    assert decode(metadata, 100) == set()
    assert leader_epoch(metadata) is None


def test_foreign_metadata_has_no_epoch() -> None:
    assert leader_epoch(None) is None and leader_epoch("") is None and leader_epoch("pc:1:2:3") is None
