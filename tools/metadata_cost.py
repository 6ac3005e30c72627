"""What encoding the commit metadata costs the poll thread, per partition and commit, on one machine.

A development probe, not a benchmark: 50,000 done offsets above a stuck committed one (the
``--max-uncommitted`` window), at several densities (done offsets / their span), each encoded with
``core.offset_metadata.encode`` at the 4 KiB limit; the best of ``--repeat`` runs. With
``--against REV`` it also times the encoder of git revision ``REV`` on the same sets in the same
run (interleaved, so the ratio holds on a busy machine) and checks that it reads the new metadata
as this one does. Last, the cost of sorting the tracker's done set, paid before every encoding.

    .venv/bin/python -m tools.metadata_cost
    .venv/bin/python -m tools.metadata_cost --against 62264b1
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from keyorder.core import offset_metadata

DONE = 50_000
DENSITIES = (0.5, 0.9, 0.99, 0.1, 0.01)
BASE = 1_000_000_000
CODEC = "consumer/keyorder/core/offset_metadata.py"


def done_set(density: float, seed: int = 36) -> list[int]:
    """``DONE`` offsets spread at random over ``DONE / density`` offsets above ``BASE``."""
    rng = random.Random(seed)
    return sorted(BASE + 1 + delta for delta in rng.sample(range(int(DONE / density)), DONE))


def codec_at(revision: str) -> ModuleType:
    """The offset_metadata module as it was at ``revision``."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{revision}:{CODEC}"], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="keyorder-codec-")) / "offset_metadata_at_revision.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def best_ms(encode: Callable[[int, list[int]], str], done: list[int], repeat: int) -> tuple[float, str]:
    best, metadata = float("inf"), ""
    for _ in range(repeat):
        started = time.perf_counter()
        metadata = encode(BASE, done)
        best = min(best, time.perf_counter() - started)
    return best * 1000, metadata


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", metavar="REV", help="also time the encoder of this git revision")
    parser.add_argument("--repeat", type=int, default=5, help="runs per set; the best counts (default 5)")
    args = parser.parse_args(argv)
    other = codec_at(args.against) if args.against else None
    header = "| done / span | kept offsets | bytes | encode (ms) |"
    rule = "|---:|---:|---:|---:|"
    if other is not None:
        header += f" at {args.against} (ms) | kept there | ratio |"
        rule += "---:|---:|---:|"
    print(header)
    print(rule)
    for density in DENSITIES:
        done = done_set(density)
        ms, metadata = best_ms(offset_metadata.encode, done, args.repeat)
        kept = len(offset_metadata.decode(metadata, BASE))
        row = f"| {density:g} | {kept:,} | {len(metadata):,} | {ms:.1f} |"
        if other is not None:
            other_ms, other_metadata = best_ms(other.encode, done, args.repeat)
            other_kept = len(offset_metadata.decode(other_metadata, BASE))
            assert other.decode(metadata, BASE) == offset_metadata.decode(metadata, BASE)
            row += f" {other_ms:.1f} | {other_kept:,} | {other_ms / ms:.1f} x |"
        print(row)
    unordered = set(done_set(0.5))
    ms, _ = best_ms(lambda _base, _done: str(sorted(unordered)), [], args.repeat)
    print(f"\nsorting the tracker's done set of {DONE:,} offsets at 0.5 (completed_above_position): {ms:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
