"""The commit-metadata codec: round trip, encoding choice, size bound and forgiving decode."""

from __future__ import annotations

import base64
import itertools
import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyorder.core import offset_metadata
from keyorder.core.offset_metadata import (
    MAX_DECODED_OFFSETS,
    MAX_METADATA_BYTES,
    MAX_PAYLOAD_BYTES,
    decode,
    decode_checked,
    encode,
)


def _kind(metadata: str) -> str:
    prefix, _base, kind, _payload = metadata.split(":", 3)
    assert prefix == "ko1"
    return kind


def _packed(payload: bytes) -> str:
    return base64.urlsafe_b64encode(zlib.compress(payload)).decode()


@st.composite
def base_and_done(draw: st.DrawFn, max_span: int = 5000, max_size: int = 300) -> tuple[int, list[int]]:
    base = draw(st.integers(0, 10**15))
    above = draw(st.sets(st.integers(1, max_span), max_size=max_size))
    return base, sorted(base + delta for delta in above)


@settings(max_examples=300)
@given(base_and_done())
def test_round_trip(case: tuple[int, list[int]]) -> None:
    base, done = case
    metadata = encode(base, done)
    # At most 300 offsets within 5000 of base always fit, so nothing may be dropped.
    assert len(metadata) <= MAX_METADATA_BYTES
    assert decode(metadata, base) == set(done)


def test_round_trip_of_nothing_done() -> None:
    assert decode(encode(7, []), 7) == set()


def test_offsets_at_or_below_base_are_ignored() -> None:
    assert decode(encode(100, [98, 99, 100, 102]), 100) == {102}


@pytest.mark.parametrize(
    ("name", "done_deltas", "kind"),
    [
        ("alternating, dense", range(2, 4001, 2), "b"),  # runs: 2 bytes/offset; bitset: 1 bit/offset
        ("random half of 2000", sorted(random.Random(7).sample(range(1, 2001), 1000)), "b"),
        ("far apart", range(1000, 200_001, 1000), "r"),  # bitset would be 25 kB, runs ~3 bytes each
        ("one long block", range(1, 10_001), "r"),  # runs: (0, 10000)
        ("single neighbour", [1], "b"),  # 1 byte of bits beats 2 bytes of runs
    ],
)
def test_the_smaller_encoding_is_chosen(name: str, done_deltas: range | list[int], kind: str) -> None:
    base = 5_000_000
    done = [base + delta for delta in done_deltas]
    metadata = encode(base, done)
    assert _kind(metadata) == kind, name
    assert decode(metadata, base) == set(done)


def _assert_lowest_prefix(decoded: set[int], done: list[int]) -> None:
    """Truncation keeps the lowest offsets: the decoded set is a prefix of the sorted done list."""
    assert decoded == set(done[: len(decoded)])


@pytest.mark.parametrize(
    "pattern",
    ["all 10000 after a stuck offset", "random 50% of 10000", "10000 scattered over 1e6"],
)
def test_10000_inflight_behind_one_stuck_offset_fits_in_4096(pattern: str) -> None:
    stuck = 123_456_789  # the committed (lowest unfinished) offset: everything above it is tracked
    rng = random.Random(2024)
    if pattern == "all 10000 after a stuck offset":
        done = list(range(stuck + 1, stuck + 10_001))
    elif pattern == "random 50% of 10000":
        done = [offset for offset in range(stuck + 1, stuck + 10_001) if rng.random() < 0.5]
    else:
        done = sorted(stuck + delta for delta in rng.sample(range(1, 1_000_001), 10_000))
    metadata = encode(stuck, done)
    assert len(metadata) <= 4096
    assert len(metadata.encode()) == len(metadata)  # ASCII: characters are bytes
    decoded = decode(metadata, stuck)
    assert decoded, "nothing survived the size bound"
    _assert_lowest_prefix(decoded, done)
    if pattern != "10000 scattered over 1e6":
        assert decoded == set(done)  # these two fit whole
    else:
        assert len(decoded) < len(done)  # ~25 kB of runs: must have been truncated


@settings(max_examples=150)
@given(case=base_and_done(max_span=20_000, max_size=2000), limit=st.integers(64, 600))
def test_truncation_respects_the_limit_and_keeps_the_lowest_offsets(case: tuple[int, list[int]], limit: int) -> None:
    base, done = case
    metadata = encode(base, done, limit=limit)
    assert len(metadata) <= limit
    _assert_lowest_prefix(decode(metadata, base), done)


def test_hand_built_runs_payload_decodes() -> None:
    """Format check independent of ``encode``: varint (gap, length) pairs from base + 1."""
    # gap 2 -> 103..105 (length 3); gap 1 -> 107 (length 1); gap 300 (varint 0xAC 0x02) -> 408
    payload = bytes([2, 3, 1, 1, 0xAC, 0x02, 1])
    assert decode(f"ko1:100:r:{_packed(payload)}", 100) == {103, 104, 105, 107, 408}


def test_hand_built_bitset_payload_decodes() -> None:
    """Format check independent of ``encode``: bit i (LSB first) means base + 1 + i."""
    payload = bytes([0b0000_0101, 0b0000_0001])
    assert decode(f"ko1:100:b:{_packed(payload)}", 100) == {101, 103, 109}


VALID = encode(100, [102, 103])


@pytest.mark.parametrize(
    "metadata",
    [
        None,
        "",
        "garbage",
        "ko1",
        "ko1:",
        "ko1:100",
        "ko1:100:r",
        "ko2" + VALID[3:],  # a future or foreign format
        "ko1:abc:r:" + _packed(b"\x01\x01"),  # non-numeric base
        "ko1:100:r:!!!not-base64!!!",
        "ko1:100:r:abc",  # bad base64 padding
        "ko1:100:r:" + base64.urlsafe_b64encode(b"not zlib").decode(),
        "ko1:100:r:" + _packed(b"\x80"),  # truncated varint
        "ko1:100:z:" + _packed(b"\x01\x01"),  # unknown kind
        "some-other-client-metadata",
    ],
)
def test_unusable_metadata_decodes_to_nothing(metadata: str | None) -> None:
    assert decode(metadata, 100) == set()


def test_metadata_for_a_different_base_is_ignored() -> None:
    assert decode(VALID, 100) == {102, 103}
    assert decode(VALID, 101) == set()
    assert decode(VALID, 99) == set()


def _varints(*numbers: int) -> bytes:
    out = bytearray()
    for number in numbers:
        while number >= 0x80:
            out.append((number & 0x7F) | 0x80)
            number >>= 7
        out.append(number)
    return bytes(out)


@pytest.mark.parametrize(
    ("name", "metadata"),
    [
        ("a 31-character run of 3 million", "ko1:0:r:" + _packed(_varints(0, 3_000_000))),
        ("runs adding up past the bound", "ko1:0:r:" + _packed(_varints(0, 600_000, 5, 600_000))),
        ("a bitset with every bit of 3 MB set", "ko1:0:b:" + _packed(b"\xff" * 3_000_000)),
        ("a zlib bomb", "ko1:0:b:" + _packed(bytes(MAX_PAYLOAD_BYTES + 1))),
        ("a varint of 1000 bytes", "ko1:0:r:" + _packed(b"\x80" * 1000 + b"\x01")),
        ("offsets beyond the 64-bit range", "ko1:0:r:" + _packed(_varints(2**63, 1))),
        ("metadata far longer than any broker default", "ko1:0:r:" + "A" * (MAX_PAYLOAD_BYTES + 1)),
    ],
)
def test_out_of_bounds_metadata_is_refused_with_a_reason(name: str, metadata: str) -> None:
    """Any client with commit rights can write metadata: decoding must not explode (memory, CPU)."""
    decoded = decode_checked(metadata, 0)
    assert decoded.done == set(), name
    assert decoded.refused, name
    assert decode(metadata, 0) == set(), name


def test_the_largest_allowed_set_still_decodes() -> None:
    metadata = "ko1:0:r:" + _packed(_varints(0, MAX_DECODED_OFFSETS))
    assert len(decode(metadata, 0)) == MAX_DECODED_OFFSETS
    assert decode_checked(metadata, 0).refused is None


def test_unusable_but_harmless_metadata_is_not_reported_as_refused() -> None:
    for metadata in (None, "", "other-client", "ko1:100:r:abc", encode(5, [7])):
        assert decode_checked(metadata, 100).refused is None


def test_a_sparse_set_over_a_huge_span_never_builds_the_bitset(monkeypatch: pytest.MonkeyPatch) -> None:
    """5x10^7 offsets of span (a compacted topic): the bitset would be 6 MB per commit."""
    built: list[int] = []
    real_build = offset_metadata._Bitset._build

    def spy(self: offset_metadata._Bitset, stop: int) -> None:
        real_build(self, stop)
        built.append(len(self.built))

    monkeypatch.setattr(offset_metadata._Bitset, "_build", spy)
    base = 10**9
    done = [base + delta for delta in range(1_000_000, 50_000_001, 1_000_000)]
    metadata = encode(base, done)
    assert _kind(metadata) == "r"
    assert decode(metadata, base) == set(done)
    assert built == [], "the bitset of the whole span was materialised"
    dense = [base + delta for delta in range(2, 4001, 2)]
    assert _kind(encode(base, dense)) == "b"
    assert built and max(built) <= 500, "the bitset is built only when it is the smaller payload"


class _CountingZlib:
    """``zlib`` for the codec, counting the bytes it is given to compress."""

    def __init__(self) -> None:
        self.compressed = 0

    def __getattr__(self, name: str) -> object:
        return getattr(zlib, name)

    def compress(self, data: bytes, level: int = -1) -> bytes:
        self.compressed += len(data)
        return zlib.compress(data, level)

    def compressobj(self, *args: object) -> _CountingCompressor:
        return _CountingCompressor(self, zlib.compressobj(*args))  # type: ignore[arg-type]


class _CountingCompressor:
    def __init__(self, counter: _CountingZlib, compressor: zlib._Compress) -> None:
        self.counter, self.compressor = counter, compressor

    def compress(self, data: bytes) -> bytes:
        self.counter.compressed += len(data)
        return self.compressor.compress(data)

    def copy(self) -> _CountingCompressor:
        return _CountingCompressor(self.counter, self.compressor.copy())

    def flush(self, *args: int) -> bytes:
        return self.compressor.flush(*args)


@pytest.mark.parametrize("density", [0.5, 0.9, 0.1, 0.01])
def test_a_set_far_past_the_limit_costs_about_what_fits(monkeypatch: pytest.MonkeyPatch, density: float) -> None:
    """50,000 done offsets above a stuck one (issue 36, defect 8): the encoder compresses about the
    bytes it keeps, a few times over at most, not the whole payload once per step of a search."""
    counting = _CountingZlib()
    monkeypatch.setattr(offset_metadata, "zlib", counting)
    base = 10**9
    rng = random.Random(8)
    done = sorted(base + 1 + delta for delta in rng.sample(range(int(50_000 / density)), 50_000))
    metadata = encode(base, done)
    assert len(metadata) <= MAX_METADATA_BYTES
    kept = decode(metadata, base)
    _assert_lowest_prefix(kept, done)
    assert len(kept) < len(done)
    payload_kept = len(zlib.decompress(base64.urlsafe_b64decode(metadata.split(":", 3)[3])))
    assert counting.compressed <= 3 * payload_kept, (counting.compressed, payload_kept)


_BASE = 1_000_000
_RNG = random.Random(36)
_HALF = [offset for offset in range(_BASE + 1, _BASE + 2001) if _RNG.random() < 0.5]
_SPARSE = list(itertools.accumulate([_BASE, *(_RNG.randint(1, 60) for _ in range(300))]))[1:]


@pytest.mark.parametrize(
    ("name", "done", "limit", "old", "kept"),
    [
        ("runs, whole", [_BASE + 2, _BASE + 3, _BASE + 4, _BASE + 10, _BASE + 400], 4096,
         "ko1:1000000:r:eNpjZGZlbGVmBAAB0wCU", 5),
        ("bitset, whole", list(range(_BASE + 2, _BASE + 200, 2)), 4096, "ko1:1000000:b:eNpbtQo70AIA12sQGw==", 99),
        ("empty", [], 4096, "ko1:1000000:r:eNoDAAAAAAE=", 0),
        ("bitset, cut", _HALF, 160,
         "ko1:1000000:b:eNoBYQCe_0EFOVU9pD-mTs-d0_pbSMCawocoYq7ycVni3jBd-SIndqMu2h8gaFwDohHhovoiNmW2NcjI6iRdk6UMjCtrCGi"
         "GCO-SjA9bp1GIwNIPrWcwc9TUijQryL9469SVmPBNEXTLgS7W", 368),
        ("runs, cut", _SPARSE, 160,
         "ko1:1000000:r:eNoNjYEKggAQQ3kkqVhmaVApFQUZQSlWJvb__-Vj3LHtxm7gy4-INXMu7iMftnoFHSN3dcCDihsbVsQcSKllLSfO9DTykrep"
         "SvU01dlW27BnJhK9l9fezN8Z_bJjYV_GlRwIGdRLMQF9tgil", 70),
    ],
)  # fmt: skip
def test_metadata_written_by_the_first_encoder_still_decodes(
    name: str, done: list[int], limit: int, old: str, kept: int
) -> None:
    """``old``: what the encoder before issue 36 wrote (a binary search re-encoding every prefix):
    pods that committed it are read by this one; it writes the same, or keeps as many offsets."""
    assert decode(old, _BASE) == set(done[:kept]), name
    new = encode(_BASE, done, limit=limit)
    if "cut" not in name:  # the whole set fits: the same string
        assert new == old, name
    assert len(new) <= limit and len(decode(new, _BASE)) >= kept, name


@settings(max_examples=150)
@given(
    base=st.integers(0, 10**15),
    gaps=st.lists(st.integers(1, 10**9), max_size=200),
    limit=st.integers(64, MAX_METADATA_BYTES),
)
def test_round_trip_of_sparse_sets_over_huge_spans(base: int, gaps: list[int], limit: int) -> None:
    done, cursor = [], base
    for gap in gaps:
        cursor += gap
        done.append(cursor)
    metadata = encode(base, done, limit=limit)
    assert len(metadata) <= limit
    _assert_lowest_prefix(decode(metadata, base), done)
    if limit == MAX_METADATA_BYTES:
        assert decode(metadata, base) == set(done)  # 200 runs of <= 5 bytes each always fit


def _reference_runs(base: int, done: list[int]) -> tuple[bytes, list[int]]:
    """The run-length payload and where it may be cut, built the plain way (no early stop)."""
    out, ends, cursor = bytearray(), [], base + 1
    for first, last in _runs_of(done):
        out += _varints(first - cursor, last - first + 1)
        ends.append(len(out))
        cursor = last + 1
    return bytes(out), ends


def _runs_of(done: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for offset in done:
        if runs and runs[-1][1] == offset - 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def _reference_bits(base: int, done: list[int]) -> bytes:
    bits = bytearray((done[-1] - base + 7) // 8 if done else 0)
    for offset in done:
        bits[(offset - base - 1) >> 3] |= 1 << ((offset - base - 1) & 7)
    return bytes(bits)


@st.composite
def clustered_sets(draw: st.DrawFn) -> tuple[int, list[int]]:
    """Blocks of done offsets with gaps between them: dense, sparse or mixed, up to ~40,000 offsets."""
    base = draw(st.integers(0, 10**12))
    rng = random.Random(draw(st.integers(0, 2**32)))
    longest_gap, longest_block = draw(st.integers(1, 300)), draw(st.integers(1, 40))
    done, cursor = [], base
    for _block in range(draw(st.integers(0, 2000))):
        cursor += rng.randint(1, longest_gap)
        length = rng.randint(1, longest_block)
        done.extend(range(cursor, cursor + length))
        cursor += length
    return base, done


@settings(max_examples=200, deadline=None)
@given(case=clustered_sets(), limit=st.integers(64, 1500))
def test_the_kept_prefix_stops_only_where_1_256_more_does_not_fit(case: tuple[int, list[int]], limit: int) -> None:
    """The payload is cut where it may be (after a run, after a byte of the bitset), and the cut is
    (nearly) the longest that fits: the whole payload, or one of the next cuts up to 1/256 further
    does not fit. (Compressed size is not quite monotonic, so a longer prefix may fit again.)"""
    base, done = case
    metadata = encode(base, done, limit=limit)
    assert len(metadata) <= limit
    _assert_lowest_prefix(decode(metadata, base), done)
    kind, packed = metadata.split(":", 3)[2:]
    kept = len(zlib.decompress(base64.urlsafe_b64decode(packed)))
    if kind == "r":
        payload, cuts = _reference_runs(base, done)
    else:
        payload = _reference_bits(base, done)
        cuts = list(range(1, len(payload) + 1))
    assert kept == 0 or kept in cuts
    if kept == len(payload):
        return
    budget = (limit - (len(metadata) - len(packed))) // 4 * 3
    following = [cut for cut in cuts if cut > kept]
    reach = max(kept + (kept >> 8), following[0])
    assert any(len(zlib.compress(payload[:cut], 9)) > budget for cut in following if cut <= reach), (kept, reach)
