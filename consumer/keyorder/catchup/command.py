"""``keyorder catchup``: parse the settings, print the plan, run the job, print and write the report.

Exit status: 0 when every message in range was handled in order (and the fence committed when
that was asked), 1 when the job or a wave's audit failed (the waves before it stay committed; the
failed one is not: run it again), 2 on invalid settings or a runtime that cannot run it (a Spark session
without the settings the job needs included: running it again fails the same way), 3 when the group or
the topics are not as a run needs them for now (members still in the group, a broker that could not say
for now, a partition the ``--until`` offsets do not name: ``plan.PassingPlanError``; nothing was handled or
committed, run it again later), 128 + the signal's number when SIGTERM (143) or SIGINT (130) stopped it: the
running wave's Spark jobs were cancelled and that wave not committed (the waves before it stay
committed), Spark was stopped (its executors with it) and the report written; a second signal
exits at once with the same status (``keyorder.catchup.signals``). On 2 and 3 the reason is also left,
as JSON, where Kubernetes reads a container's termination message (``keyorder.catchup.exits``): the
operator retries a 3 after a back-off and names the setting to change on a 2.

``--preflight`` only checks that this runtime can run a catch-up (a Java 17+ runtime, PySpark 4 and the
driver's packages, the handler and its hooks load, no ``KEYORDER_*`` variable the job would refuse:
``keyorder.catchup.preflight``), one line per check, without Kafka or Spark: 0 when all pass, 2 otherwise.
It reads ``--handler`` or ``KEYORDER_HANDLER``, and the hooks and the rest from the environment only.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from keyorder.catchup.exits import EXIT_FAILED, RUNTIME, Refusal, RefusalKind, write_termination_message
from keyorder.catchup.layout import ORDER_GUARANTEE
from keyorder.config import ConfigError, add_settings_flags, load_config

log = logging.getLogger("keyorder.catchup")


def add_catchup_flags(parser: argparse.ArgumentParser) -> None:
    from keyorder.catchup.settings import CatchupConfig

    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the plan (ranges, waves, splits, key counts, hottest "
        "keys, skew, achievable parallelism) and exit without handling or committing anything "
        "(also while the group has live members)",
    )
    parser.add_argument(
        "--preflight",
        action="store_true",
        help="only check that this runtime can run a catch-up: a Java 17+ runtime, PySpark 4 and the driver's "
        "packages import, the handler (--handler / KEYORDER_HANDLER) loads; one line per check, exit 0 when all "
        "pass, 2 otherwise; touches neither Kafka nor Spark (the operator runs it before it stops the pods)",
    )
    add_settings_flags(parser, CatchupConfig)


def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def print_plan(plan: Any, statistics: Any, key_partitions: int, cores: int, layouts: list[Any]) -> None:
    from rich.table import Table

    console = _console()
    table = Table(title="catch-up plan", title_justify="left")
    for column in ("partition", "start", "fence", "offsets", "splits"):
        table.add_column(column, justify="left" if column == "partition" else "right")
    splits: dict[tuple[str, int], int] = {}
    for split in plan.splits:
        splits[(split.topic, split.partition)] = splits.get((split.topic, split.partition), 0) + 1
    for r in plan.ranges:
        table.add_row(
            r.name(), f"{r.start:,}", f"{r.end:,}", f"{r.offsets:,}", str(splits.get((r.topic, r.partition), 0))
        )
    console.print(table)
    for note in plan.notes:
        console.print(f"note: {note}")
    console.print(
        f"{len(plan.waves)} wave{'s' if len(plan.waves) != 1 else ''}; commit "
        + ("each wave after its audit, the last one at the fence" if plan.commit else "nothing")
    )
    console.print(f"order: {ORDER_GUARANTEE}")
    reasons = [layout.reason for layout in layouts]
    if reasons and len(set(reasons)) == 1:
        console.print(f"layout: {reasons[0]}")
    else:
        for number, reason in enumerate(reasons, 1):
            console.print(f"layout of wave {number}: {reason}")
    if statistics is not None:
        hottest = statistics.hottest[0][1] if statistics.hottest else 0
        console.print(
            f"messages {statistics.messages:,} over {statistics.distinct_keys:,} keys (a key counted once per "
            f"partition it sits in); hottest key has "
            f"{hottest:,} (skew {statistics.skew:.1f}x the mean)"
        )
        console.print("hottest keys: " + ", ".join(f"{key} ({count:,})" for key, count in statistics.hottest))
        achievable = min(statistics.max_parallelism, key_partitions, cores) if statistics.hottest else 0
        console.print(
            f"achievable parallelism ~{achievable:.1f} (keys allow {statistics.max_parallelism:.1f}, "
            f"{key_partitions} key partitions, {cores} cores)"
        )


def print_outcome(outcome: Any) -> None:
    from rich.table import Table

    console = _console()
    report = outcome.report()
    table = Table(title="catch-up: planned vs done", title_justify="left")
    columns = ["partition", "planned offsets", "read", "processed", "dead-lettered", "violations"]
    if report["skipped"]:
        columns.insert(3, "skipped (done before)")
    for column in columns:
        table.add_column(column, justify="left" if column == "partition" else "right")
    for row in report["partitions"]:
        table.add_row(
            f"{row['topic']}[{row['partition']}]",
            f"{row['planned_offsets']:,}",
            f"{row['read']:,}",
            *([f"{row['skipped']:,}"] if report["skipped"] else []),
            f"{row['processed']:,}",
            f"{row['dead_lettered']:,}",
            str(row["violations"]),
        )
    console.print(table)
    rate = report["messages_per_second"]
    console.print(
        f"{report['processed']:,} processed, {report['dead_lettered']:,} dead-lettered in "
        f"{report['seconds']:.1f}s ({rate:,.0f} msg/s)"
        if rate
        else "nothing to do"
    )
    if report["skipped"]:
        console.print(
            f"{report['skipped']:,} messages skipped: the group's consumers had finished them (commit metadata), "
            "as a pod taking the partitions over would skip them"
        )
    for problem in report["problems"]:
        console.print(f"[red]problem:[/red] {problem}")
    if report["wave_retries"]:
        retried = [f"{w['wave'] + 1} ({w['attempts']} attempts)" for w in report["waves"] if w["attempts"] > 1]
        console.print(
            f"[yellow]note:[/yellow] waves run again after a failure: {', '.join(retried)}; messages a failed "
            "attempt had handled were handled again (see docs/catchup.md)"
        )
    if report["task_reruns"]:
        console.print(
            f"[yellow]note:[/yellow] {report['task_reruns']} handler task(s) were re-run after an executor was "
            "lost: their keys may have been handled twice (see docs/catchup.md)"
        )
    if outcome.error:
        console.print(f"[red]failed:[/red] {outcome.error}")
    if outcome.ok:
        console.print(
            f"fence {'committed' if outcome.committed else 'not committed (as asked)'}: "
            + ", ".join(f"{tp}={offset}" for tp, offset in report["fence"].items())
        )
    elif outcome.stopped:
        console.print(
            f"{outcome.stopped}: {report['waves_committed']} of {report['waves_planned']} waves committed, the "
            "interrupted one not: run the job again, it resumes at the first uncommitted wave"
        )
    elif report["waves_committed"]:
        console.print(
            f"{report['waves_committed']} of {report['waves_planned']} waves committed; the failed wave was not: "
            "fix the cause and run the job again, it resumes at the first uncommitted wave"
        )
    else:
        console.print("nothing was committed: fix the cause and run the job again (it is safe to rerun)")


def exit_status(outcome: Any, signum: int | None) -> int:
    """The command's status after a run (pure): 128 + the signal's number if it stopped the run (a signal
    after the last wave changes nothing), else 0 or 1."""
    from keyorder.catchup.signals import signal_exit_status

    if outcome.stopped is not None and signum is not None:
        return signal_exit_status(signum)
    return 0 if outcome.ok else EXIT_FAILED


def preflight_command(args: argparse.Namespace, environ: Mapping[str, str]) -> int:
    from keyorder.catchup.preflight import exit_status as preflight_status
    from keyorder.catchup.preflight import preflight

    checks = preflight(args.handler or environ.get("KEYORDER_HANDLER"), environ)
    for check in checks:
        print(check.line(), flush=True)
    return preflight_status(checks)


def refusal_of(error: Exception) -> Refusal:
    """What a refusal before the first wave says to whoever runs the command (pure): passing for a state of
    the group or the topics (``PassingPlanError``), else the setting or the runtime to change."""
    from keyorder.catchup.job import SparkSettingsError, SparkStartError
    from keyorder.catchup.plan import PassingPlanError, PlanError

    if isinstance(error, PassingPlanError):
        return Refusal(RefusalKind.PASSING, str(error))
    if isinstance(error, PlanError) and error.setting is not None:
        return Refusal(RefusalKind.SETTINGS, str(error), error.setting)
    if isinstance(error, SparkStartError):  # no Java, or a master Spark cannot reach
        return Refusal(RefusalKind.SETTINGS, str(error), RUNTIME)
    if isinstance(error, SparkSettingsError):
        return Refusal(RefusalKind.SETTINGS, str(error), "--spark-conf")
    return Refusal(RefusalKind.SETTINGS, str(error))


def refuse(refusal: Refusal) -> int:
    """Say why the command refused to run, on stderr and in the termination message; its exit status."""
    print(f"keyorder catchup: {refusal.reason}", file=sys.stderr)
    if refusal.kind is RefusalKind.PASSING:
        print("keyorder catchup: nothing was handled or committed; this passes: run it again later", file=sys.stderr)
    write_termination_message(refusal)
    return refusal.exit_status


def driver_load_refusal(config: Any) -> Refusal | None:
    """Load the handler and its hooks on the driver, as each Spark task will, before the group is touched and
    Spark starts: one that cannot be called as catch-up calls it (``HandlerContractError``: a batch handler, a
    hook with arguments) is refused, not found by every task of the first wave and its retries. An import that
    fails here is only a warning: the executors may have what the driver lacks (``spark.executorEnv.*``,
    ``spark.submit.pyFiles``), as before the driver loaded it."""
    from keyorder.adapters.handlers import HandlerContractError, HandlerLoadError, load_for_catchup

    try:
        load_for_catchup(config.handler, config.handler_setup, config.handler_teardown)
    except HandlerContractError as error:
        return Refusal(RefusalKind.SETTINGS, str(error), error.setting)
    except HandlerLoadError as error:
        log.warning("the handler does not load on the driver (each Spark task loads it on its executor): %s", error)
    return None


def catchup_command(args: argparse.Namespace) -> int:
    if args.preflight:
        return preflight_command(args, os.environ)
    from keyorder.catchup.preflight import DRIVER_PACKAGES

    for module in DRIVER_PACKAGES:
        try:
            __import__(module)
        except ImportError:
            return refuse(
                Refusal(
                    RefusalKind.SETTINGS,
                    f"{module} is not installed: pip install 'keyorder[catchup]' (and a Java 17+ runtime)",
                    RUNTIME,
                )
            )
    from keyorder.catchup.job import CatchupJob, SparkSettingsError, SparkStartError
    from keyorder.catchup.offsets import CatchupKafkaError
    from keyorder.catchup.plan import PlanError
    from keyorder.catchup.settings import CatchupConfig, environment_problem
    from keyorder.catchup.signals import StopSignals, signal_exit_status
    from keyorder.logs import configure_logging

    try:
        config = load_config(CatchupConfig, vars(args))
    except ConfigError as error:
        return refuse(Refusal(RefusalKind.SETTINGS, str(error)))
    problem = environment_problem(os.environ)
    if problem is not None:
        variable, reason = problem
        return refuse(Refusal(RefusalKind.SETTINGS, reason, variable or None))
    configure_logging(config.log_level, config.log_format)
    refusal = driver_load_refusal(config)
    if refusal is not None:
        return refuse(refusal)
    try:
        job = CatchupJob(config)
    except (ConfigError, CatchupKafkaError) as error:
        return refuse(Refusal(RefusalKind.SETTINGS, str(error)))
    try:
        # SIGTERM/SIGINT cancel the running wave and commit nothing more; the block ends before Spark stops
        with StopSignals(job.cancel) as stop:
            try:
                plan = job.plan(preview=args.plan)
                if stop.signum is not None:  # stopped while planning: do not start Spark
                    print(f"keyorder catchup: {stop.reason} before Spark started; nothing was handled", file=sys.stderr)
                    return signal_exit_status(stop.signum)
                spark = job.spark
            except CatchupKafkaError as error:
                print(f"keyorder catchup: {error}", file=sys.stderr)
                return EXIT_FAILED
            except (PlanError, SparkStartError, SparkSettingsError) as error:
                return refuse(refusal_of(error))
            layouts = [job.wave_layout(plan, wave) for wave in plan.waves]
            if args.plan:
                statistics = job.key_statistics(plan)
                print_plan(plan, statistics, job.key_partitions(), spark.sparkContext.defaultParallelism, layouts)
                return signal_exit_status(stop.signum) if stop.signum is not None else 0
            print_plan(plan, None, job.key_partitions(), spark.sparkContext.defaultParallelism, layouts)
            _console().print(f"Spark UI: {spark.sparkContext.uiWebUrl or 'disabled'}")
            outcome = job.run(plan)
            print_outcome(outcome)
            if config.report is not None:
                config.report.write_text(json.dumps(outcome.report(), indent=2) + "\n")
                _console().print(f"report written to {config.report}")
            return exit_status(outcome, stop.signum)
    finally:
        job.close()  # stops Spark, which deletes the executors (on Kubernetes, their pods)
