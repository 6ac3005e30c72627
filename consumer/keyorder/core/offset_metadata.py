"""Compact encoding of "offsets already completed above the committed one" for commit metadata.

After a crash the consumer restarts from the committed min-offset. Without more information it
would re-run every message above it that had already finished. Like Confluent's Parallel
Consumer, keyorder writes those completed offsets into the offset-commit metadata string, so the
next owner of the partition skips them.

Format: ``ko1:<base>:<kind>:<urlsafe-base64(zlib(payload))>``, where ``base`` is the committed
offset the set is relative to and ``kind`` is ``r`` (varint run lengths, alternating not-done /
done starting at base+1) or ``b`` (bitset, bit i = offset base+1+i). The smaller is chosen. The
result never exceeds ``MAX_METADATA_BYTES``: when it would, the highest offsets are dropped
(safe: a dropped offset is merely processed again, at-least-once is kept).

Encoding never materialises the offset span: the run-length payload is built from the offsets
themselves, and the bitset only when it is the smaller one (so it is never larger than the runs).
A sparse set over a span of 10^8 offsets (a compacted topic) costs as much as its offsets, not
12 MB of zero bits.

Decoding is forgiving: absent, foreign or corrupt metadata, or metadata written for a different
base, yields an empty set (brokers such as the test broker do not store metadata at all). It is
also bounded, because any client with commit rights can write metadata: a payload that inflates
beyond ``MAX_PAYLOAD_BYTES``, a varint longer than a 64-bit one, an offset beyond the 64-bit
offset range, or a set of more than ``MAX_DECODED_OFFSETS`` offsets is ignored as a whole
(``decode_checked`` says why, so the caller can log it). Ignoring metadata is always safe: its
offsets are merely processed again.
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence
from typing import NamedTuple

PREFIX = "ko1"
MAX_METADATA_BYTES = 4096

MAX_DECODED_OFFSETS = 1_000_000
"""Most offsets a decoded set may hold. An encoder only lists offsets the pod received and
finished above the committed one, at most the uncommitted window (``--max-uncommitted``, 50,000 by
default, per pod), so a valid set is far smaller; a larger one is forged or corrupt."""

MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
"""Most bytes a payload may inflate to: more than a ``MAX_METADATA_BYTES`` string can produce
through zlib (at most about 1,000:1), so only a forged payload (from longer metadata than the
encoder writes) is refused."""

MAX_OFFSET = 2**63 - 1
"""Kafka offsets are signed 64-bit integers."""

_MAX_VARINT_BYTES = 10  # a 64-bit value


def _varints(numbers: Sequence[int]) -> bytes:
    out = bytearray()
    for number in numbers:
        while number >= 0x80:
            out.append((number & 0x7F) | 0x80)
            number >>= 7
        out.append(number)
    return bytes(out)


def _read_varints(data: bytes) -> list[int]:
    numbers, value, shift = [], 0, 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            if shift >= 7 * _MAX_VARINT_BYTES:
                raise OverflowError("a varint longer than 64 bits")
        else:
            numbers.append(value)
            value, shift = 0, 0
    if shift:
        raise ValueError("truncated varint")
    return numbers


def _runs(base: int, done: Sequence[int]) -> bytes:
    runs: list[int] = []
    cursor = base + 1  # base itself is the lowest unfinished offset: never done
    for offset in done:
        if offset == cursor and runs:
            runs[-1] += 1
        else:
            runs.extend((offset - cursor, 1))
        cursor = offset + 1
    return _varints(runs)


def _bits_length(base: int, done: Sequence[int]) -> int:
    """Bytes of the bitset of ``done``, computed without building it."""
    return (done[-1] - base + 7) // 8 if done else 0


def _bits(base: int, done: Sequence[int]) -> bytes:
    bits = bytearray(_bits_length(base, done))
    for offset in done:
        index = offset - base - 1
        bits[index >> 3] |= 1 << (index & 7)
    return bytes(bits)


def _encode_all(base: int, done: Sequence[int]) -> str:
    runs = _runs(base, done)
    # The bitset is built only when it is smaller than the runs, so its size is bounded by the
    # number of offsets, never by their span (a sparse set over a huge span stays cheap).
    kind, payload = ("r", runs) if len(runs) <= _bits_length(base, done) else ("b", _bits(base, done))
    packed = base64.urlsafe_b64encode(zlib.compress(payload, 9)).decode()
    return f"{PREFIX}:{base}:{kind}:{packed}"


def encode(base: int, done: Sequence[int], limit: int = MAX_METADATA_BYTES) -> str:
    """Metadata for committing ``base`` with completed offsets ``done`` (ascending, all > base)."""
    done = [offset for offset in done if offset > base]
    text = _encode_all(base, done)
    if len(text) <= limit:
        return text
    low, high = 0, len(done)  # keep the longest prefix that fits
    while low < high:
        middle = (low + high + 1) // 2
        if len(_encode_all(base, done[:middle])) <= limit:
            low = middle
        else:
            high = middle - 1
    return _encode_all(base, done[:low])


class Decoded(NamedTuple):
    """A decoded set, and why the metadata was ignored if it was refused as out of bounds."""

    done: set[int]
    refused: str | None = None
    """Set when the metadata was ours but out of bounds (forged or corrupt): worth a warning."""


def _inflate(packed: str) -> bytes:
    inflater = zlib.decompressobj()
    payload = inflater.decompress(base64.urlsafe_b64decode(packed), MAX_PAYLOAD_BYTES)
    if inflater.unconsumed_tail or len(payload) >= MAX_PAYLOAD_BYTES:
        raise OverflowError(f"payload inflates beyond {MAX_PAYLOAD_BYTES} bytes")
    if not inflater.eof:
        raise ValueError("truncated zlib stream")
    return payload


def _decode_runs(base: int, payload: bytes) -> set[int]:
    numbers = _read_varints(payload)
    pairs = list(zip(numbers[::2], numbers[1::2], strict=False))
    total = sum(length for _gap, length in pairs)
    if total > MAX_DECODED_OFFSETS:
        raise OverflowError(f"{total} offsets, more than {MAX_DECODED_OFFSETS}")
    done: set[int] = set()
    cursor = base + 1
    for gap, length in pairs:
        cursor += gap
        done.update(range(cursor, cursor + length))
        cursor += length
    if cursor - 1 > MAX_OFFSET:
        raise OverflowError(f"offsets beyond {MAX_OFFSET}")
    return done


_BITS_OF_BYTE = tuple(tuple(bit for bit in range(8) if value >> bit & 1) for value in range(256))


def _decode_bits(base: int, payload: bytes) -> set[int]:
    if base + len(payload) * 8 > MAX_OFFSET:
        raise OverflowError(f"offsets beyond {MAX_OFFSET}")
    done: set[int] = set()
    first = base + 1
    for index, byte in enumerate(payload):
        if byte:
            offset = first + index * 8
            done.update(offset + bit for bit in _BITS_OF_BYTE[byte])
            if len(done) > MAX_DECODED_OFFSETS:
                raise OverflowError(f"more than {MAX_DECODED_OFFSETS} offsets")
    return done


def decode_checked(metadata: str | None, committed: int) -> Decoded:
    """Like ``decode``, also saying why metadata in our format was refused as out of bounds."""
    if not metadata or not metadata.startswith(PREFIX + ":"):
        return Decoded(set())
    try:
        if len(metadata) > MAX_PAYLOAD_BYTES:
            raise OverflowError(f"{len(metadata)} characters of metadata")
        _, base_text, kind, packed = metadata.split(":", 3)
        base = int(base_text)
        if base != committed or kind not in ("r", "b"):
            return Decoded(set())
        payload = _inflate(packed)
        return Decoded(_decode_runs(base, payload) if kind == "r" else _decode_bits(base, payload))
    except OverflowError as error:
        return Decoded(set(), str(error))
    except (ValueError, zlib.error):
        return Decoded(set())


def decode(metadata: str | None, committed: int) -> set[int]:
    """Completed offsets above ``committed`` recorded in ``metadata``; empty if unusable or out of bounds."""
    return decode_checked(metadata, committed).done
