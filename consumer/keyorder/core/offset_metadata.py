"""Compact encoding of "offsets already completed above the committed one" for commit metadata.

After a crash the consumer restarts from the committed min-offset. Without more information it
would re-run every message above it that had already finished. Like Confluent's Parallel
Consumer, keyorder writes those completed offsets into the offset-commit metadata string, so the
next owner of the partition skips them.

Format: ``ko2:<base>:<epoch>:<kind>:<urlsafe-base64(zlib(payload))>``, where ``base`` is the
committed offset the set is relative to, ``epoch`` the greatest leader epoch of the records the
pod had received (KIP-320) and ``kind`` is ``r`` (varint run lengths, alternating not-done / done
starting at base+1) or ``b`` (bitset, bit i = offset base+1+i). The smaller is chosen. The result
never exceeds ``MAX_METADATA_BYTES`` (``limit``): when it would, the highest offsets are dropped
(safe: a dropped offset is merely processed again, at-least-once is kept). Without a known epoch
(a broker that gives none) it is the first release's ``ko1:<base>:<kind>:<payload>``, which every
version reads; this one reads both (an older pod ignores ``ko2`` metadata: it merely processes
those offsets again).

The epoch says which log the set is about. A log truncated by an unclean leader election is
refilled under a greater leader epoch, at the same offsets: a record at an offset the set marks
done whose epoch is greater than the set's is not the record that was done (``core.tracking``).
The same epoch goes with the committed offset itself (``leader_epoch``: the Kafka adapter commits
it, so librdkafka can validate the offset against a truncation, KIP-320).

Encoding never materialises the offset span: the run-length payload is built from the offsets
themselves, and the bitset only when it is the smaller one (so it is never larger than the runs).
A sparse set over a span of 10^8 offsets (a compacted topic) costs as much as its offsets, not
12 MB of zero bits. Nor does it read much more of a long set than it keeps, since it runs on the
poll thread at every commit: the choice of payload counts runs only until the answer is certain,
the payload is built only as far as it is compressed, and one zlib stream advances along it,
probing where the cut falls by interpolating the sizes seen (``_longest_fitting_stream``). The
cut falls after a run, or after a byte of the bitset, within 1/256 of the longest prefix that
fits. For the cost against the previous encoder (a binary search that re-encoded every prefix),
see docs/performance.md ("Commit metadata").

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
import bisect
import itertools
import zlib
from collections.abc import Iterator, Sequence
from typing import NamedTuple

PREFIX = "ko1"
"""The first format, without a leader epoch (still written when the epoch is unknown)."""
PREFIX_WITH_EPOCH = "ko2"
"""The format with the leader epoch of the log the set is about."""
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


def _varint(number: int) -> bytes:
    out = bytearray()
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


_RUN_SCAN_CHUNK = 4096


class _RunEnds:
    """Where the runs of consecutive offsets in ``done`` end (indexes into it), found a chunk at a
    time: deciding the payload needs only their number, and only until it is large enough."""

    def __init__(self, done: Sequence[int]) -> None:
        self.done = done
        self.ends: list[int] = []
        self._scanned = 0  # offsets whose run end is known

    def scan(self) -> bool:
        """Find the run ends of the next chunk; False when all are found."""
        done, start = self.done, self._scanned
        if start >= len(done):
            return False
        stop = min(start + _RUN_SCAN_CHUNK, len(done))
        append = self.ends.append
        previous = done[start]
        for index, offset in enumerate(done[start + 1 : stop + 1], start):  # and the next chunk's first
            if offset != previous + 1:
                append(index)
            previous = offset
        if stop == len(done):
            append(stop - 1)
        self._scanned = stop
        return True

    def count_past(self, bound: int) -> int:
        """The number of runs, counted only until it passes ``bound``."""
        while len(self.ends) <= bound and self.scan():
            pass
        return len(self.ends)


class _Runs:
    """The run-length payload: varint (gap, length) pairs, not-done then done, from base + 1, built
    only as far as it is read. It may be cut after any pair (``ends``: the payload's length after
    each pair built so far). ``length`` is exact once ``complete``, an upper bound before."""

    def __init__(self, base: int, runs: _RunEnds, length_bound: int) -> None:
        self.built = bytearray()
        self.ends: list[int] = []
        self.complete = not runs.done
        self.length = 0 if not runs.done else length_bound
        self._wanted = 0
        self._builder = self._build(base, runs)

    def _build(self, base: int, runs: _RunEnds) -> Iterator[None]:
        """Appends pairs, pausing once ``_wanted`` bytes are built."""
        out, ends, done = self.built, self.ends, runs.done
        append = out.append
        cursor = base + 1  # base itself is the lowest unfinished offset: never done
        first_index = built_runs = 0
        while built_runs < len(runs.ends) or runs.scan():
            for last_index in itertools.islice(runs.ends, built_runs, None):
                first, last = done[first_index], done[last_index]
                gap, length = first - cursor, last - first + 1
                if gap < 0x80:
                    append(gap)
                else:
                    out += _varint(gap)
                if length < 0x80:
                    append(length)
                else:
                    out += _varint(length)
                ends.append(len(out))
                cursor, first_index = last + 1, last_index + 1
                built_runs += 1
                if len(out) >= self._wanted:
                    yield
        self.complete, self.length = True, len(out)

    def build_past(self, size: int) -> None:
        """Build until more than ``size`` bytes are built, or all of it."""
        if not self.complete and len(self.built) <= size:
            self._wanted = size + 1
            next(self._builder, None)

    def cut(self, at: int) -> int:
        """The longest cut of at most ``at`` bytes (0: none)."""
        self.build_past(at)
        index = bisect.bisect_right(self.ends, at)
        return self.ends[index - 1] if index else 0

    def next_cut(self, after: int) -> int:
        """The shortest cut longer than ``after`` bytes (``length + 1``: none)."""
        self.build_past(after)
        index = bisect.bisect_right(self.ends, after)
        return self.ends[index] if index < len(self.ends) else self.length + 1

    def read(self, start: int, stop: int) -> bytes:
        self.build_past(stop - 1)
        return bytes(self.built[start:stop])


def _bits_length(base: int, done: Sequence[int]) -> int:
    """Bytes of the bitset of ``done``, computed without building it."""
    return (done[-1] - base + 7) // 8 if done else 0


class _Bitset:
    """The bitset payload (bit i, LSB first, is offset base + 1 + i), built only as far as it is read:
    when the set is truncated, only the bytes that fit (and a few probed beyond) are ever built.
    It may be cut after any byte."""

    def __init__(self, base: int, done: Sequence[int]) -> None:
        self.first, self.done, self.length = base + 1, done, _bits_length(base, done)
        self.built = bytearray()
        self._unbuilt = 0  # index in ``done`` of the first offset not in ``built``

    def cut(self, at: int) -> int:
        return min(at, self.length)

    def next_cut(self, after: int) -> int:
        return after + 1

    def read(self, start: int, stop: int) -> bytes:
        self._build(stop)
        return bytes(self.built[start:stop])

    def _build(self, stop: int) -> None:
        if stop <= len(self.built):
            return
        origin = self.first + 8 * len(self.built)
        upto = bisect.bisect_left(self.done, self.first + 8 * stop, self._unbuilt)
        piece = bytearray(stop - len(self.built))
        for offset in self.done[self._unbuilt : upto]:
            index = offset - origin
            piece[index >> 3] |= 1 << (index & 7)
        self.built += piece
        self._unbuilt = upto


_Payload = _Runs | _Bitset


def _choose(base: int, done: Sequence[int]) -> tuple[str, _Payload]:
    """The smaller payload, counted before compression (runs on a tie), decided reading as little
    as it can: a run takes at least 2 bytes and at most a varint of the span and one of the count,
    and there are at most as many runs as offsets."""
    runs = _RunEnds(done)
    if not done:
        return "r", _Runs(base, runs, 0)
    bits_length = _bits_length(base, done)
    most_per_run = len(_varint(done[-1] - base)) + len(_varint(len(done)))
    if len(done) * most_per_run <= bits_length:  # sparse: no need to count the runs
        return "r", _Runs(base, runs, len(done) * most_per_run)
    count = runs.count_past(bits_length // 2)
    if 2 * count > bits_length:
        return "b", _Bitset(base, done)
    payload = _Runs(base, runs, count * most_per_run)
    if count * most_per_run > bits_length:  # the bounds do not tell: build it to see
        payload.build_past(bits_length)
        if not payload.complete or payload.length > bits_length:
            return "b", _Bitset(base, done)
    return "r", payload


_PROBES = 64
"""Most trial compressions per encoding (a handful are needed: sizes grow almost linearly)."""


def _longest_fitting_stream(payload: _Payload, budget: int) -> tuple[int, bytes]:
    """``(cut, stream)``: the longest prefix of ``payload`` that ends at one of its cuts and whose
    zlib stream takes at most ``budget`` bytes (to within 1/256 of its length), and that stream.
    ``(0, b"")`` when not even the empty stream fits.

    One compressor advances along the payload; each probe compresses only the bytes past the
    longest prefix known to fit, on a copy of it. The next probe is interpolated from the sizes seen
    (compressed size grows almost linearly with the payload), so a few probes find the cut, and
    the bytes compressed stay near the kept prefix's, however long the payload."""
    compressor = zlib.compressobj(9)
    fed, out, tail = 0, b"", compressor.copy().flush()  # the prefix known to fit and its stream
    if len(tail) > budget:
        return 0, b""
    too_long, too_long_size = payload.length + 1, 0  # the shortest cut known not to fit (none yet)
    for _probe in range(_PROBES):
        size = len(out) + len(tail)
        if fed == payload.length or (too_long <= payload.length and too_long - fed <= max(1, fed >> 8)):
            break
        if too_long > payload.length:  # nothing overflowed yet: extrapolate from the start
            estimate = budget if fed == 0 else fed * (budget - size) // max(size, 1) + fed
            estimate = min(estimate, 4 * fed + budget, payload.length)  # at most a few times longer
        else:  # between a prefix that fits and one that does not
            estimate = fed + (budget - size) * (too_long - fed) // max(too_long_size - size, 1)
            estimate = max(min(estimate, too_long - 1), fed + (too_long - fed) // 8)  # shrink it by 1/8 at least
        stop = payload.cut(estimate)
        if stop <= fed:
            stop = payload.next_cut(fed)
        if stop >= too_long or stop > payload.length:
            break
        trial = compressor.copy()
        piece = trial.compress(payload.read(fed, stop))
        trial_tail = trial.copy().flush()
        trial_size = len(out) + len(piece) + len(trial_tail)
        if trial_size <= budget:
            compressor, fed, out, tail = trial, stop, out + piece, trial_tail
        else:
            too_long, too_long_size = stop, trial_size
    return fed, out + tail


def _header(base: int, kind: str, leader_epoch: int | None) -> str:
    if leader_epoch is None:
        return f"{PREFIX}:{base}:{kind}:"
    return f"{PREFIX_WITH_EPOCH}:{base}:{leader_epoch}:{kind}:"


def encode(base: int, done: Sequence[int], limit: int = MAX_METADATA_BYTES, leader_epoch: int | None = None) -> str:
    """Metadata for committing ``base`` with completed offsets ``done`` (ascending, all > base), about
    the log whose greatest leader epoch received is ``leader_epoch`` (``None``: unknown).

    The smaller payload of the two kinds (counted before compression) is written; when its stream
    does not fit ``limit``, it is cut after the longest prefix that does (see the module doc)."""
    done = done[bisect.bisect_right(done, base) :]
    kind, payload = _choose(base, done)
    header = _header(base, kind, leader_epoch)
    budget = (limit - len(header)) // 4 * 3  # the stream's bytes whose base64 fits
    cut, stream = _longest_fitting_stream(payload, budget)
    if cut == 0:  # nothing fits (or nothing is done): the one encoding of the empty set
        return _header(base, "r", leader_epoch) + base64.urlsafe_b64encode(zlib.compress(b"", 9)).decode()
    return header + base64.urlsafe_b64encode(stream).decode()


class Decoded(NamedTuple):
    """A decoded set, and why the metadata was ignored if it was refused as out of bounds."""

    done: set[int]
    refused: str | None = None
    """Set when the metadata was ours but out of bounds (forged or corrupt): worth a warning."""
    leader_epoch: int | None = None
    """The leader epoch the set is about, recorded even when the set is empty. ``None``: the metadata has no
    epoch (the first format, or not ours), or it was not used: refused, or written for another base offset
    than the committed one."""


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


def _fields(metadata: str) -> tuple[int, int | None, str, str]:
    """(base, leader epoch, kind, packed payload) of metadata in either format; ``ValueError`` if malformed."""
    if metadata.startswith(PREFIX_WITH_EPOCH + ":"):
        _, base_text, epoch_text, kind, packed = metadata.split(":", 4)
        epoch = int(epoch_text)
        if epoch < 0:
            raise ValueError(f"leader epoch {epoch}")
        return int(base_text), epoch, kind, packed
    _, base_text, kind, packed = metadata.split(":", 3)
    return int(base_text), None, kind, packed


def _ours(metadata: str) -> bool:
    return metadata.startswith((PREFIX + ":", PREFIX_WITH_EPOCH + ":"))


def decode_checked(metadata: str | None, committed: int) -> Decoded:
    """Like ``decode``, also saying why metadata in our format was refused as out of bounds, and with the
    leader epoch it records."""
    if not metadata or not _ours(metadata):
        return Decoded(set())
    try:
        if len(metadata) > MAX_PAYLOAD_BYTES:
            raise OverflowError(f"{len(metadata)} characters of metadata")
        base, epoch, kind, packed = _fields(metadata)
        if base != committed or kind not in ("r", "b"):
            return Decoded(set())
        payload = _inflate(packed)
        done = _decode_runs(base, payload) if kind == "r" else _decode_bits(base, payload)
        return Decoded(done, None, epoch)
    except OverflowError as error:
        return Decoded(set(), str(error))
    except (ValueError, zlib.error):
        return Decoded(set())


def leader_epoch(metadata: str | None) -> int | None:
    """The leader epoch recorded in metadata this module wrote (``None``: none, or not ours). The Kafka
    adapter commits it with the offset, so the two never disagree."""
    if metadata is None or not metadata.startswith(PREFIX_WITH_EPOCH + ":") or len(metadata) > MAX_PAYLOAD_BYTES:
        return None
    try:
        return _fields(metadata)[1]
    except ValueError:
        return None


def decode(metadata: str | None, committed: int) -> set[int]:
    """Completed offsets above ``committed`` recorded in ``metadata``; empty if unusable or out of bounds."""
    return decode_checked(metadata, committed).done
