"""Some rows of ``keyorder bench``'s full preset on two commits, taking turns: a regression or the machine?

A development probe. On this shared 2-core VM a row drifts by 10-20% between two runs minutes apart, more
than the 0.9 x floor ``keyorder bench --baseline`` checks against, so a row under it in one pair of full
runs says nothing yet. This runs the named rows once each in a process of its own on ``--against``'s
``consumer/`` (a temporary worktree), then on the working tree's, ``--rounds`` times in turn, each process
on its own embedded broker with the full preset's topic, under ``/tmp/keyorder-heavy.lock``; then prints
each row's median on both and their ratio::

    .venv/bin/python -m tools.bench_rows_ab --against 2faa6b0 --rounds 2 "key W=4 cpu" "key async W=1024"
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = "/tmp/keyorder-heavy.lock"


def run_rows(names: list[str]) -> None:
    """In this process: the named rows of the full preset, once each, on whichever keyorder it imports."""
    from dataclasses import replace

    from keyorder.devtools.bench import PRESETS, Runner
    from keyorder.devtools.embedded import EmbeddedBroker
    from keyorder.devtools.loadgen import create_topics, produce_keyed
    from keyorder.progress import Progress

    preset = PRESETS["full"]
    specs = [spec for spec in preset.runs if spec.name in names]
    missing = set(names) - {spec.name for spec in specs}
    if missing:
        raise SystemExit(f"no such rows in the full preset: {sorted(missing)}")
    with EmbeddedBroker() as broker:
        create_topics(broker.bootstrap, ["bench"], preset.partitions)
        produce_keyed(broker.bootstrap, "bench", preset.messages, preset.keys)
        runner = Runner(broker.bootstrap, "bench", replace(preset, runs=()), Progress())
        for spec in specs:
            print(f"RESULT\t{spec.name}\t{runner.run(spec, '').rate:.1f}", flush=True)


def _child(consumer: Path, names: list[str]) -> dict[str, float]:
    environment = {**os.environ, "PYTHONPATH": f"{consumer}{os.pathsep}{ROOT}"}
    done = subprocess.run(
        ["flock", LOCK, sys.executable, "-m", "tools.bench_rows_ab", "--in-process", *names],
        env=environment,
        cwd=ROOT,  # this probe from here; keyorder from PYTHONPATH (consumer/ is not under ROOT directly)
        capture_output=True,
        text=True,
        check=True,
    )
    rows = [line.split("\t") for line in done.stdout.splitlines() if line.startswith("RESULT\t")]
    return {name: float(rate) for _tag, name, rate in rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("rows", nargs="+", help="row names of the full preset (as the bench's table names them)")
    parser.add_argument("--against", help="the commit to put the working tree against")
    parser.add_argument("--rounds", type=int, default=2, help="processes per side, in turn")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.in_process:
        run_rows(options.rows)
        return
    if not options.against:
        raise SystemExit("--against COMMIT is required")
    rates: dict[str, dict[str, list[float]]] = {"before": defaultdict(list), "after": defaultdict(list)}
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as directory:
        worktree = Path(directory) / "before"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(worktree), options.against],
                       check=True, capture_output=True)  # fmt: skip
        try:
            for round_number in range(1, options.rounds + 1):
                for side, consumer in (("before", worktree / "consumer"), ("after", ROOT / "consumer")):
                    print(f"round {round_number}/{options.rounds}: {side}", file=sys.stderr, flush=True)
                    for name, rate in _child(consumer, options.rows).items():
                        rates[side][name].append(rate)
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)], check=False)
    print("| row | before: runs, median (min-max) | after: runs, median (min-max) | after / before |")
    print("|---|---:|---:|---:|")
    for name in options.rows:
        before, after = rates["before"][name], rates["after"][name]
        if not before or not after:
            continue

        def cell(values: list[float]) -> str:
            return f"{len(values)}, {statistics.median(values):,.0f} ({min(values):,.0f}-{max(values):,.0f})"

        ratio = statistics.median(after) / statistics.median(before)
        print(f"| {name} | {cell(before)} | {cell(after)} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
