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

Decoding is forgiving: absent, foreign or corrupt metadata, or metadata written for a different
base, yields an empty set (brokers such as the test broker do not store metadata at all).
"""

from __future__ import annotations

import base64
import zlib
from collections.abc import Sequence

PREFIX = "ko1"
MAX_METADATA_BYTES = 4096


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


def _bits(base: int, done: Sequence[int]) -> bytes:
    bits = bytearray((done[-1] - base + 7) // 8) if done else bytearray()
    for offset in done:
        index = offset - base - 1
        bits[index >> 3] |= 1 << (index & 7)
    return bytes(bits)


def _encode_all(base: int, done: Sequence[int]) -> str:
    runs, bits = _runs(base, done), _bits(base, done)
    kind, payload = ("r", runs) if len(runs) <= len(bits) else ("b", bits)
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


def decode(metadata: str | None, committed: int) -> set[int]:
    """Completed offsets above ``committed`` recorded in ``metadata``; empty if unusable."""
    if not metadata or not metadata.startswith(PREFIX + ":"):
        return set()
    try:
        _, base_text, kind, packed = metadata.split(":", 3)
        base = int(base_text)
        if base != committed:
            return set()
        payload = zlib.decompress(base64.urlsafe_b64decode(packed))
        if kind == "r":
            done: set[int] = set()
            cursor, numbers = base + 1, _read_varints(payload)
            for gap, length in zip(numbers[::2], numbers[1::2], strict=False):
                cursor += gap
                done.update(range(cursor, cursor + length))
                cursor += length
            return done
        if kind == "b":
            return {base + 1 + index for index in range(len(payload) * 8) if payload[index >> 3] >> (index & 7) & 1}
    except (ValueError, zlib.error):
        return set()
    return set()
