"""``keyorder catchup`` refuses, before it touches the group or starts Spark, an environment it cannot honour:
a ``KEYORDER_*`` typo, a pods' batch size above 1 (its handler takes a list, catch-up calls one per message),
and a handler it cannot call as it would (one that does not import on the driver is only a warning). Without
these a batch handler failed every message and, under the default ``--on-exhausted dlq``, the whole backlog
went to the dead-letter topic and the fence was committed."""

from __future__ import annotations

from pathlib import Path

import pytest

from keyorder.catchup.settings import BATCH_VARIABLE, environment_problem
from tests.unit.test_catchup_preflight import run_catchup


def test_a_catchup_setting_a_pods_setting_a_handlers_own_variable_and_a_kafka_property_are_accepted():
    environ = {
        "KEYORDER_TASK_WORKERS": "64",  # catch-up's own
        "KEYORDER_MAX_INFLIGHT": "5000",  # the pods': the Job shares spec.handler.env with them
        "KEYORDER_EXAMPLE_LATENCY_MS": "3",  # a handler's own prefix
        "KEYORDER_RDKAFKA_FETCH_MAX_BYTES": "1048576",
        BATCH_VARIABLE: "1",  # what the operator sets for a per-message handler
        "PATH": "/usr/bin",
    }
    assert environment_problem(environ) is None


def test_a_typo_is_refused_with_the_name_it_resembles():
    variable, reason = environment_problem({"KEYORDER_TASK_WORKER": "64"})
    assert variable == ""  # the reason names it
    assert "KEYORDER_TASK_WORKER: did you mean KEYORDER_TASK_WORKERS?" in reason


@pytest.mark.parametrize("size", ["100", "2", " 7 ", "many"])
def test_a_batch_size_above_one_is_refused_naming_the_variable_and_the_way_out(size: str):
    variable, reason = environment_problem({BATCH_VARIABLE: size})
    assert variable == BATCH_VARIABLE
    assert reason.startswith(f"{BATCH_VARIABLE}={size.strip()}: the pods run a batch handler")
    assert "per-message handler (--handler" in reason


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({BATCH_VARIABLE: "100"}, "calls its handler once per message"),
        ({"KEYORDER_HANDLER": "tests.unit.catchup_handlers:batch_of"}, "takes a list of messages (its annotation)"),
    ],
)
def test_the_command_refuses_before_kafka_or_spark_with_exit_2(tmp_path: Path, env: dict[str, str], says: str):
    environ = {
        "KEYORDER_HANDLER": "tests.unit.catchup_handlers:slow",
        "KEYORDER_TOPICS": "orders",
        "KEYORDER_GROUP_ID": "ledger",
        "KEYORDER_BOOTSTRAP_SERVERS": "127.0.0.1:9",  # nothing listens: a refusal must come before any connect
        **env,
    }
    done = run_catchup(tmp_path, **environ)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("keyorder catchup: ") and says in done.stderr, done.stderr
    assert "Spark" not in done.stdout, "refused before Spark started"


def test_the_driver_refuses_a_handler_it_cannot_call_and_only_warns_when_one_does_not_import(caplog):
    """An import that fails on the driver may work on the executors (``spark.executorEnv.*``, pyFiles): it was
    never loaded there before this check, so that is a warning; a handler of the wrong shape is refused."""
    from types import SimpleNamespace

    from keyorder.catchup.command import driver_load_refusal

    def config(handler: str, setup: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(handler=handler, handler_setup=setup, handler_teardown=None)

    assert driver_load_refusal(config("tests.unit.catchup_handlers:nope")) is None
    assert "the handler does not load on the driver" in caplog.text and "has no attribute 'nope'" in caplog.text
    refusal = driver_load_refusal(config("tests.unit.catchup_handlers:batch_of"))
    assert refusal is not None and refusal.setting == "--handler" and "takes a list of messages" in refusal.reason
    refusal = driver_load_refusal(config("tests.unit.catchup_handlers:slow", "tests.unit.catchup_handlers:open_async"))
    assert refusal is not None and refusal.setting == "--handler-setup", refusal
