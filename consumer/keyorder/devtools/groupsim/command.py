"""``keyorder simulate``: run a named scenario of the simulated group, print its criteria, write its plot.

``--list`` names the scenarios; ``NAME`` runs one (``all`` runs every one and prints a table). The
exit status is 0 when every criterion held, 1 when one did not, 2 for bad input (an unknown name).

``--against keda`` runs each scenario a second time, same seed and arrivals, under the KEDA reference
(KEDA's Kafka scaler and the HPA scaling a plain consumer, ``groupsim.keda``), prints both runs' figures
side by side (``groupsim.compare``), one chart per scenario with both runs (``NAME-vs-keda.png``), and
with several scenarios the whole comparison as one Markdown table. The exit status still judges
keyorder's criteria only.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from keyorder.devtools.groupsim.scenarios import Scenario

EXIT_FAILED, EXIT_USAGE = 1, 2


def add_simulate_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("scenario", nargs="?", help="a scenario name (see --list), or 'all'")
    parser.add_argument("--list", action="store_true", help="list the scenarios and what each shows")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the noise (default 1)")
    parser.add_argument(
        "--hours", type=_positive_hours, help="simulated hours to run (default: the scenario's own duration)"
    )
    parser.add_argument(
        "--output", type=Path, help="the PNG to write (default simulate-results/NAME.png; with 'all', a folder)"
    )
    parser.add_argument("--no-plot", action="store_true", help="print the criteria only")
    parser.add_argument(
        "--against",
        choices=("keda",),
        help="also run each scenario under a reference policy, same seed and arrivals, and compare: 'keda' is "
        "KEDA's Kafka scaler and the HPA scaling a plain consumer (one thread per partition)",
    )
    parser.add_argument(
        "--keda-lag-threshold",
        type=_positive_int,
        default=10,
        metavar="N",
        help="with --against keda: the trigger's lagThreshold, lag per pod (default 10, KEDA's own default)",
    )
    parser.add_argument(
        "--restart-every",
        type=_positive_seconds,
        metavar="SECONDS",
        help="restart the operator every SECONDS of simulated time: it resumes from status.autoscaler (default: "
        "never; with --against keda, keyorder's run only)",
    )


def _positive_hours(text: str) -> float:
    try:
        hours = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--hours must be a number of hours, got {text!r}") from None
    if not 0 < hours <= 48:
        raise argparse.ArgumentTypeError(f"--hours must be above 0 and at most 48, got {text}")
    return hours


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number of at least 1, got {text}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--restart-every must be a number of seconds, got {text!r}") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"--restart-every must be above 0 seconds, got {text}")
    return seconds


def simulate_command(args: argparse.Namespace) -> int:
    from keyorder.devtools.groupsim.criteria import failures, measure
    from keyorder.devtools.groupsim.driver import run
    from keyorder.devtools.groupsim.scenarios import SCENARIOS, by_name

    if args.list or not args.scenario:
        width = max(len(scenario.name) for scenario in SCENARIOS)
        for scenario in SCENARIOS:
            print(f"{scenario.name:<{width}}  {scenario.summary}")
        return 0 if args.list else EXIT_USAGE
    names = [scenario.name for scenario in SCENARIOS]
    if args.scenario != "all" and args.scenario not in names:
        print(
            f"keyorder simulate: unknown scenario {args.scenario!r}; choose one of: {', '.join(names)}, all",
            file=sys.stderr,
        )
        return EXIT_USAGE
    chosen = SCENARIOS if args.scenario == "all" else (by_name(args.scenario),)
    if args.hours is not None:  # the same scenario over a shorter or longer run, with the same thresholds
        chosen = tuple(dataclasses.replace(scenario, duration=args.hours * 3600) for scenario in chosen)
    if args.against == "keda":
        return _against_keda(args, chosen)
    failed = 0
    for scenario in chosen:
        print(f"{scenario.name}: {scenario.summary}", flush=True)

        def progress(t: float, total: float = scenario.duration) -> None:
            if int(t) % 900 == 0:
                print(f"  simulated {t / 60:.0f} of {total / 60:.0f} min", flush=True)

        measured = measure(run(scenario, seed=args.seed, progress=progress, restart_every=args.restart_every))
        missed = failures(measured)
        failed += bool(missed)
        print(_table(measured, missed))
        if not args.no_plot:
            path = _output(args.output, scenario.name, several=len(chosen) > 1)
            from keyorder.devtools.groupsim.plot import plot

            print(f"  plot: {plot(measured, path)}")
    if len(chosen) > 1:
        print(f"{len(chosen) - failed} of {len(chosen)} scenarios held every criterion")
    return EXIT_FAILED if failed else 0


def _against_keda(args: argparse.Namespace, chosen: tuple[Scenario, ...]) -> int:
    """Every chosen scenario under keyorder and under the KEDA reference: both runs' figures, a chart of
    both, and with several scenarios the whole comparison as one Markdown table."""
    from keyorder.devtools.groupsim.compare import SUMMARY_HEADER, compare, summary_row, table
    from keyorder.devtools.groupsim.criteria import failures
    from keyorder.devtools.groupsim.keda import KedaSettings

    keda = KedaSettings(lag_threshold=args.keda_lag_threshold)
    rows, failed = [], 0
    for scenario in chosen:
        print(f"{scenario.name}: {scenario.summary}", flush=True)
        comparison = compare(scenario, seed=args.seed, keda=keda, restart_every=args.restart_every)
        missed = failures(comparison.keyorder)
        failed += bool(missed)
        print(table(comparison))
        if missed:
            print("  keyorder FAIL: " + "\n        ".join(missed))
        rows.append(summary_row(comparison))
        if not args.no_plot:
            from keyorder.devtools.groupsim.plot import plot_comparison

            path = _output(args.output, f"{scenario.name}-vs-keda", several=len(chosen) > 1)
            print(f"  plot: {plot_comparison(comparison.keyorder, comparison.keda, path)}")
    if len(chosen) > 1:
        print(
            f"\nkeyorder against KEDA (lagThreshold {keda.lag_threshold}, seed {args.seed}); "
            "time to target: until the backlog drains within the target for good"
        )
        print(SUMMARY_HEADER)
        print("\n".join(rows))
    return EXIT_FAILED if failed else 0


def _output(output: Path | None, name: str, several: bool) -> Path:
    if output is None:
        return Path("simulate-results") / f"{name}.png"
    return output / f"{name}.png" if several or output.suffix != ".png" else output


def _table(measured: object, missed: list[str]) -> str:
    from keyorder.devtools.groupsim.criteria import Measured

    assert isinstance(measured, Measured)
    criteria = measured.run.scenario.criteria
    polls = measured.run.polls
    changes = sum(1 for poll in polls if poll.target.replicas != poll.before.replicas)
    within = measured.seconds_to_within_target
    rows = [
        (
            "backlog within target after",
            "never" if within is None else f"{within:.0f} s",
            f"<= {criteria.within_target_seconds:.0f} s" if criteria.within_target_seconds is not None else "-",
        ),
        (
            "peak / needed workers",
            "-"
            if measured.overshoot is None
            else f"{measured.peak_workers} / {measured.needed_workers} = {measured.overshoot:.2f}x",
            f"<= {criteria.max_overshoot}x" if criteria.max_overshoot is not None else "-",
        ),
        (
            "peak / needed replicas",
            "-"
            if measured.replica_overshoot is None
            else f"{measured.peak_replicas} / {measured.needed_replicas} = {measured.replica_overshoot:.2f}x",
            "(reported)",
        ),
        (
            "under-provisioned while lag grew",
            f"{measured.underprovisioned_minutes:.1f} min",
            f"<= {criteria.max_underprovisioned_minutes} min"
            if criteria.max_underprovisioned_minutes is not None
            else "-",
        ),
        (
            "replica changes per hour (steady)",
            "-" if measured.replica_changes_per_hour is None else f"{measured.replica_changes_per_hour:.1f}",
            f"<= {criteria.max_replica_changes_per_hour}" if criteria.max_replica_changes_per_hour is not None else "-",
        ),
        ("scale-downs while lag grew", str(len(measured.scale_downs_while_growing)), "0"),
        ("exceptions", str(len(measured.exceptions)), "0"),
        ("replica changes in the run", str(changes), ""),
    ]
    lines = [f"  {name:<36} {value:>22}  {limit}" for name, value, limit in rows]
    lines.append("  PASS: every criterion held" if not missed else "  FAIL: " + "\n        ".join(missed))
    return "\n".join(lines)
