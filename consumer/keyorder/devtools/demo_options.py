"""``keyorder dev``'s options: the flags, the run they describe (``DevOptions``, ``--quick``'s ``QUICK``)
and their checks.

Kept apart from the run (``demo``) so that what a run is can be read, built and checked without starting
one: the tests and the simulator's replay of the demo (``groupsim.demo_replay``) build ``DevOptions``
directly, ``validate`` refuses a bad flag with one line before anything starts, and ``replayable`` says
whether the simulator models the run.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from pathlib import Path


@dataclass
class DevOptions:
    partitions: int = 8
    spike: int = 45_000
    """Sized so that the KEDA-scaled partition-ordered group, at most a thread per partition, drains it in
    about 80 s (8 threads at 5-20 ms a message: about 640 messages/s), and ``make demo`` stays under three
    minutes on a fresh clone."""
    rate: float = 100.0
    latency_min_ms: float = 5.0
    latency_max_ms: float = 20.0
    target_drain_seconds: float = 30.0
    initial_workers: int = 4
    max_workers: int = 64
    poll_seconds: float = 2.0
    scale_down_window: float = 30.0
    """As long as the target drain time (as the operator's defaults, 300 s and 300 s): a shorter window
    shrinks the group mid-drain, as the need falls with the lag, and each shrink is a rebalance."""
    timeout: float = 900.0
    compare: bool = True
    """Run the KEDA-scaled partition-ordered group beside the autoscaled one, then the right-sized group."""
    seed: int = 7
    keys: int = 2_000
    """Orders in progress at once: the distinct keys the stream interleaves."""
    hot_key_share: float = 0.0
    """Share of the events on one long-lived key (``order-hot``)."""
    poison_key: bool = False
    """One order (``order-poison``) whose events always fail: retried, then dead-lettered (or blocked)."""
    on_exhausted: str = "dlq"
    assignment_strategy: str = "cooperative-sticky"
    """The pods' ``partition.assignment.strategy`` (keyorder's default; ``range`` for eager rebalances)."""
    handler: str | None = None
    """Your own ``pkg.module:function`` instead of the order example (the audit then cannot run)."""
    ui: bool = True
    output_dir: Path = Path("demo-results")


QUICK = DevOptions(
    partitions=4,
    spike=12_000,
    rate=20.0,
    target_drain_seconds=5.0,
    poll_seconds=1.0,
    scale_down_window=5.0,
    max_workers=32,
)
"""``--quick``: a smaller run (copied before the flags are applied to it)."""


def add_dev_flags(parser: argparse.ArgumentParser) -> None:
    defaults = DevOptions()
    parser.add_argument("--partitions", type=int, help=f"topic partitions [default: {defaults.partitions}]")
    parser.add_argument("--spike", type=int, help=f"events in the backlog spike [default: {defaults.spike}]")
    parser.add_argument("--rate", type=float, help=f"steady events/s after the spike [default: {defaults.rate:g}]")
    parser.add_argument("--latency-min-ms", type=float, help="handler latency, lower bound [default: 5]")
    parser.add_argument("--latency-max-ms", type=float, help="handler latency, upper bound [default: 20]")
    parser.add_argument("--target-drain-seconds", type=float, help="autoscaler target [default: 30]")
    parser.add_argument("--max-workers", type=int, help="key workers per pod, at most [default: 64]")
    parser.add_argument("--timeout", type=float, help="give up after this many seconds [default: 900]")
    parser.add_argument(
        "--compare",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also run, on the same spike, a partition-ordered group scaled by KEDA's Kafka trigger and the HPA "
        "(beside the autoscaled group) and a static keyorder group at the autoscaler's peak size [default: on]",
    )
    parser.add_argument("--seed", type=int, help="random seed of the event stream [default: 7]")
    parser.add_argument("--keys", type=int, help="orders (keys) in progress at once [default: 2000]")
    parser.add_argument(
        "--hot-key-share", type=float, help="share of the events on one hot key, 0 to 0.95 [default: 0]"
    )
    parser.add_argument(
        "--poison-key",
        action="store_true",
        default=None,
        help="one order whose events always fail (retried, then dead-lettered or, with --on-exhausted block, blocked)",
    )
    parser.add_argument("--on-exhausted", choices=["dlq", "block"], help="after the last attempt [default: dlq]")
    parser.add_argument(
        "--assignment-strategy",
        choices=["cooperative-sticky", "range", "roundrobin"],
        help="the pods' partition.assignment.strategy: cooperative (incremental) or eager rebalances "
        "[default: cooperative-sticky]",
    )
    parser.add_argument(
        "--handler", help="run your own handler (pkg.module:function) on the order events instead of the example"
    )
    parser.add_argument("--no-ui", action="store_true", help="plain log lines instead of the live view (CI)")
    parser.add_argument("--quick", action="store_true", help="a shortened run (4 partitions, 12k events)")
    parser.add_argument("--output-dir", type=Path, help="where demo.png and report.json go [default: demo-results]")


EXAMPLE_HANDLER = "keyorder_example.orders:handle"


def validate(options: DevOptions) -> None:
    """Refuse bad flags with one clear line (``DevFlagError``) before anything starts."""
    problems = []
    if options.partitions < 1:
        problems.append(f"--partitions must be at least 1, got {options.partitions}")
    if options.spike < 0:
        problems.append(f"--spike must be >= 0, got {options.spike}")
    if options.keys < 1:
        problems.append(f"--keys must be at least 1, got {options.keys}")
    if not 0.0 <= options.hot_key_share <= 0.95:
        problems.append(f"--hot-key-share must be between 0 and 0.95, got {options.hot_key_share}")
    if options.max_workers < options.initial_workers:
        problems.append(f"--max-workers must be at least {options.initial_workers}, got {options.max_workers}")
    if options.handler is not None and (":" not in options.handler or options.handler.count(":") != 1):
        problems.append(f"--handler must look like package.module:function, got {options.handler!r}")
    if problems:
        raise DevFlagError("; ".join(problems))


class DevFlagError(ValueError):
    """A ``keyorder dev`` flag is out of range."""


def _apply_flags(args: argparse.Namespace) -> DevOptions:
    options = replace(QUICK) if args.quick else DevOptions()
    for name in (
        "partitions",
        "spike",
        "rate",
        "latency_min_ms",
        "latency_max_ms",
        "target_drain_seconds",
        "max_workers",
        "timeout",
        "compare",
        "seed",
        "keys",
        "hot_key_share",
        "poison_key",
        "on_exhausted",
        "assignment_strategy",
        "handler",
        "output_dir",
    ):
        if getattr(args, name, None) is not None:
            setattr(options, name, getattr(args, name))
    options.ui = not args.no_ui
    return options


def replayable(options: DevOptions) -> bool:
    """Whether the simulator models this run (``groupsim.demo_replay``): the example's handler, evenly spread
    keys, no poison key, cooperative rebalancing, and the KEDA group sharing the cores (its calibration)."""
    return (
        options.handler is None
        and options.compare
        and not options.hot_key_share
        and not options.poison_key
        and options.assignment_strategy == "cooperative-sticky"
    )
