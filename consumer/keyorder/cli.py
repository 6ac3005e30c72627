"""The ``keyorder`` command line: one table of subcommands, each imported only when it runs.

``keyorder run`` (a pod) must start fast and load nothing it does not use, so no subcommand's
module is imported to build the parser: only the chosen subcommand gets its flags (and its
module). The pod's image therefore never loads the demo, the benchmarks, Spark or kopf.

Flags of ``run`` are generated from ``RunConfig`` so every option is also settable through its
``KEYORDER_*`` variable. Start-up errors (bad flag, bad handler path, bad Kafka property) exit
with status 2 and one message that names what is wrong.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from keyorder import __version__

EXIT_CONFIG = 2
log = logging.getLogger("keyorder")


@dataclass(frozen=True)
class Subcommand:
    """One ``keyorder`` subcommand; both functions are ``module:function`` paths, imported lazily."""

    help: str
    """One line in ``keyorder --help``."""
    description: str
    """The paragraph at the top of ``keyorder <command> --help``."""
    add_flags: str
    """``function(parser)`` that adds the subcommand's flags."""
    run: str
    """``function(args) -> exit status``."""


COMMANDS: dict[str, Subcommand] = {
    "run": Subcommand(
        "run a consumer pod",
        "Consume topics and call the handler per message, in key order, with W key workers.",
        "keyorder.cli:add_run_flags",
        "keyorder.cli:run_command",
    ),
    "operator": Subcommand(
        "run the Kubernetes operator (kopf)",
        "Reconcile OrderedConsumer resources and autoscale them by lag.",
        "keyorder_operator.main:add_operator_flags",
        "keyorder_operator.main:operator_command",
    ),
    "catchup": Subcommand(
        "drain or replay a backlog in key order on Spark",
        "Read a fenced offset range per "
        "partition with Spark, call the handler for every message in key order, then commit "
        "the fence for the group.",
        "keyorder.catchup.command:add_catchup_flags",
        "keyorder.catchup.command:catchup_command",
    ),
    "dev": Subcommand(
        "local demo: embedded broker, producer, pods, order check",
        "A backlog spike absorbed by autoscaling keyorder pods on one machine, audited.",
        "keyorder.devtools.demo:add_dev_flags",
        "keyorder.devtools.demo:dev_command",
    ),
    "bench": Subcommand(
        "benchmark key mode against the partition-ordered baseline",
        "Throughput of key-ordered "
        "workers against the partition-ordered baseline and the ideal, on the embedded broker.",
        "keyorder.devtools.bench:add_bench_flags",
        "keyorder.devtools.bench:bench_command",
    ),
    "rebalance-bench": Subcommand(
        "benchmark what a scale step costs the group, eager against cooperative rebalancing",
        "Grow a group of keyorder pods under a backlog (1 -> 2 -> 4 -> 8) once per assignment strategy, "
        "on the embedded broker; report per step the group-wide stall, the stall of pods that kept "
        "partitions and the longest partition wait.",
        "keyorder.devtools.rebalance_bench:add_rebalance_bench_flags",
        "keyorder.devtools.rebalance_bench:rebalance_bench_command",
    ),
    "catchup-bench": Subcommand(
        "benchmark catch-up on Spark against a live pod",
        "Drain one backlog with a "
        "keyorder pod and with keyorder catchup on local Spark, same handler; report "
        "throughput and the crossover.",
        "keyorder.devtools.catchup_bench:add_catchup_bench_flags",
        "keyorder.devtools.catchup_bench:catchup_bench_command",
    ),
    "simulate": Subcommand(
        "the autoscaler on a simulated consumer group: named scenarios, criteria, plots",
        "Drive the operator's own scaling policy poll by poll through a simulated group (spikes, noise, "
        "slow handlers, silent pods, hot and blocked keys, ...); print each scenario's criteria and plot it.",
        "keyorder.devtools.groupsim.command:add_simulate_flags",
        "keyorder.devtools.groupsim.command:simulate_command",
    ),
    "key-digest": Subcommand(
        "name a message key as an OrderedConsumer's status and Events do",
        "Print the keyed digest (key:...) that status and Events show instead of a key, given the "
        "resource's admin token (see docs/operator.md, 'Keys in status').",
        "keyorder_operator.key_names:add_key_digest_flags",
        "keyorder_operator.key_names:key_digest_command",
    ),
    "crd": Subcommand(
        "print the OrderedConsumer CRD generated from the spec models",
        "Print (or write) the OrderedConsumer CustomResourceDefinition.",
        "keyorder.cli:add_crd_flags",
        "keyorder.cli:crd_command",
    ),
}
"""Subcommand name -> what it is and where its code lives (pods never load Spark, kopf or devtools)."""


def resolve(path: str) -> Callable[..., Any]:
    """Import ``module:function`` and return the function."""
    module, _, function = path.partition(":")
    return getattr(importlib.import_module(module), function)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand listed; only ``command`` gets its flags (and imports its module)."""
    parser = argparse.ArgumentParser(
        prog="keyorder", description="Key-ordered Kafka consumers that scale past the partition count."
    )
    parser.add_argument("--version", action="version", version=f"keyorder {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, subcommand in COMMANDS.items():
        subparser = subparsers.add_parser(name, help=subcommand.help, description=subcommand.description)
        if name == command:
            resolve(subcommand.add_flags)(subparser)
    return parser


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    from keyorder.config import RunConfig, add_settings_flags

    add_settings_flags(parser, RunConfig)


def run_command(args: argparse.Namespace) -> int:
    from keyorder.adapters.handlers import HandlerLoadError
    from keyorder.collector import set_first_threshold
    from keyorder.config import ConfigError, load_run_config
    from keyorder.contracts import DeadLetterError, SourceError
    from keyorder.engine.worker_pools import HandlerSetupError, WorkerCrashed
    from keyorder.logs import configure_logging
    from keyorder.pod import Pod

    try:
        config = load_run_config(vars(args))
    except ConfigError as error:
        print(f"keyorder run: {error}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.log_level, config.log_format)
    set_first_threshold(config.gc_threshold)
    try:
        pod = Pod(config)
    except (ConfigError, HandlerLoadError, SourceError, DeadLetterError) as error:
        print(f"keyorder run: {error}", file=sys.stderr)
        return EXIT_CONFIG
    stop = threading.Event()

    def request_stop(signum: int, _frame: Any) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    try:
        pod.run(stop)
    except HandlerSetupError as error:
        if error.bad_input:  # a worker process of the process executor could not import the handler
            print(f"keyorder run: {error}", file=sys.stderr)
            return EXIT_CONFIG
        log.error("stopped: %s", error)
        return 1
    except (SourceError, WorkerCrashed) as error:
        log.error("stopped on a fatal error: %s", error)
        return 1
    return 0


def add_crd_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--output", type=Path, help="write to this file instead of standard output")


def crd_command(args: argparse.Namespace) -> int:
    from keyorder_operator.crd import crd_yaml

    if args.output:
        args.output.write_text(crd_yaml())
    else:
        sys.stdout.write(crd_yaml())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    command = next((argument for argument in arguments if argument in COMMANDS), None)
    args = build_parser(command).parse_args(arguments)
    return int(resolve(COMMANDS[args.command].run)(args))


if __name__ == "__main__":
    sys.exit(main())
