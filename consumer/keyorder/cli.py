"""The ``keyorder`` command line: ``run`` (a pod) and ``dev`` (the local demo).

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from keyorder import __version__
from keyorder.config import ConfigError, RunConfig, env_name, flag_name, load_run_config
from keyorder.dead_letters import DeadLetterError
from keyorder.handlers import HandlerLoadError
from keyorder.logs import configure_logging
from keyorder.source import SourceError
from keyorder.workers import WorkerCrashed

EXIT_CONFIG = 2
log = logging.getLogger("keyorder")


def add_settings_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> None:
    """One flag per field of a settings model, its help text naming the default and the variable."""
    for name, field in model.model_fields.items():
        default = field.default if field.default is not PydanticUndefined else None
        if field.default_factory is not None:
            default = None
        shown = f" [default: {default.value if hasattr(default, 'value') else default}]" \
            if default is not None else " [required]" if field.is_required() else ""
        help_text = f"{field.description}{shown} (env {env_name(name)})".replace("%", "%%")
        if (field.json_schema_extra or {}).get("repeatable"):
            parser.add_argument(flag_name(name), dest=name, action="append", metavar="NAME=VALUE",
                                help=help_text)
        else:
            parser.add_argument(flag_name(name), dest=name, metavar=name.upper(), help=help_text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="keyorder", description="Key-ordered Kafka consumers that scale "
                                     "past the partition count.")
    parser.add_argument("--version", action="version", version=f"keyorder {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run a consumer pod", description="Consume topics and call the "
                              "handler per message, in key order, with W key workers.")
    add_settings_flags(run, RunConfig)
    dev = commands.add_parser("dev", help="local demo: embedded broker, producer, pod, order check")
    from keyorder.dev import add_dev_flags

    add_dev_flags(dev)
    bench = commands.add_parser("bench", help="benchmark key mode against the partition-ordered baseline",
                                description="Throughput of key-ordered workers against the partition-ordered "
                                "baseline and the ideal, on the embedded broker.")
    from keyorder.bench import add_bench_flags

    add_bench_flags(bench)
    operator = commands.add_parser("operator", help="run the Kubernetes operator (kopf)",
                                   description="Reconcile OrderedConsumer resources and autoscale them by lag.")
    from keyorder_operator.main import add_operator_flags

    add_operator_flags(operator)
    catchup = commands.add_parser("catchup", help="drain or replay a backlog in key order on Spark",
                                  description="Read a fenced offset range per partition with Spark, call the "
                                  "handler for every message in key order, then commit the fence for the group.")
    from keyorder.catchup.command import add_catchup_flags

    add_catchup_flags(catchup)
    catchup_bench = commands.add_parser("catchup-bench", help="benchmark catch-up on Spark against a live pod",
                                        description="Drain one backlog with a keyorder pod and with keyorder "
                                        "catchup on local Spark, same handler; report throughput and the crossover.")
    from keyorder.catchup.bench import add_catchup_bench_flags

    add_catchup_bench_flags(catchup_bench)
    crd = commands.add_parser("crd", help="print the OrderedConsumer CRD generated from the spec models")
    crd.add_argument("--output", type=Path, help="write to this file instead of standard output")
    return parser


def run_command(flags: dict[str, Any]) -> int:
    from keyorder.pod import Pod

    try:
        config = load_run_config(flags)
    except ConfigError as error:
        print(f"keyorder run: {error}", file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(config.log_level, config.log_format)
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
    except (SourceError, WorkerCrashed) as error:
        log.error("stopped on a fatal error: %s", error)
        return 1
    return 0


COMMANDS = {
    "dev": "keyorder.dev:dev_command",
    "operator": "keyorder_operator.main:operator_command",
    "catchup": "keyorder.catchup.command:catchup_command",
    "catchup-bench": "keyorder.catchup.bench:catchup_bench_command",
    "bench": "keyorder.bench:bench_command",
}
"""Subcommand -> ``module:function(args)``, imported only when run (pods never load Spark or kopf)."""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        return run_command(vars(args))
    if args.command == "crd":
        from keyorder_operator.crd import crd_yaml

        if args.output:
            args.output.write_text(crd_yaml())
        else:
            sys.stdout.write(crd_yaml())
        return 0
    module, _, function = COMMANDS[args.command].partition(":")
    return getattr(importlib.import_module(module), function)(args)


if __name__ == "__main__":
    sys.exit(main())
