"""``keyorder catchup --preflight``: each check's verdict from what was found, and the command on this machine."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from keyorder.catchup.preflight import (
    Check,
    JavaRun,
    exit_status,
    handler_check,
    import_packages,
    java_check,
    java_major,
    packages_check,
    run_java,
)

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"pyspark": "4.0.1", "pandas": "2.2.3", "pyarrow": "18.1.0"}


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15\nOpenJDK Runtime Environment', 17),
        ('java version "1.8.0_292"\nJava(TM) SE Runtime Environment', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "22-ea" 2024-03-19', 22),
        ("Error: could not create the Java Virtual Machine.", None),
        ('openjdk version "" 2024', None),
    ],
)
def test_the_java_major_version_is_read_from_java_version(output: str, major: int | None) -> None:
    assert java_major(output) == major


def test_java_17_or_later_passes() -> None:
    check = java_check(JavaRun("/jre/bin/java", 0, 'openjdk version "17.0.15" 2025-04-15\n'))
    assert check == Check("java", True, 'Java 17 (/jre/bin/java: openjdk version "17.0.15" 2025-04-15)')


@pytest.mark.parametrize(
    ("run", "why"),
    [
        (JavaRun("java", error="FileNotFoundError: java"), "java could not run: FileNotFoundError: java"),
        (JavaRun("java", 1, "Error: could not create the Java Virtual Machine.\n"), "exited with 1: Error: could not"),
        (JavaRun("java", 0, 'java version "1.8.0_292"\n'), "is Java 8; Spark 4 needs Java 17+"),
        (JavaRun("java", 0, 'openjdk version "11.0.2"\n'), "is Java 11; Spark 4 needs Java 17+"),
        (JavaRun("java", 0, "something else\n"), "names no version: something else"),
    ],
)
def test_java_fails_when_missing_broken_or_too_old(run: JavaRun, why: str) -> None:
    check = java_check(run)
    assert not check.ok and why in check.detail, check
    assert check.line().startswith("FAIL java: ")


def test_pyspark_4_and_the_drivers_packages_pass() -> None:
    assert packages_check(PACKAGES, {}) == Check("pyspark", True, "pyspark 4.0.1, pandas 2.2.3, pyarrow 18.1.0")


@pytest.mark.parametrize(
    ("found", "errors", "why"),
    [
        ({"pandas": "2.2.3"}, {"pyspark": "ModuleNotFoundError: No module named 'pyspark'"}, "named 'pyspark'"),
        ({**PACKAGES, "pyspark": "3.5.3"}, {}, "pyspark 3.5.3; keyorder catchup needs PySpark 4"),
        ({**PACKAGES, "pyspark": None}, {}, "pyspark (no version)"),
        ({"pyspark": "4.0.1"}, {"pyarrow": "ImportError: libarrow.so"}, "pyarrow: ImportError: libarrow.so"),
    ],
)
def test_pyspark_fails_when_missing_too_old_or_a_package_does_not_import(found, errors, why: str) -> None:
    check = packages_check(found, errors)
    assert not check.ok and why in check.detail, check


def test_the_handler_must_be_given_and_load() -> None:
    assert handler_check("orders.handler:handle", None) == Check("handler", True, "orders.handler:handle loads")
    assert handler_check(None, None) == Check("handler", False, "none given (--handler or KEYORDER_HANDLER)")
    failed = handler_check("orders.handler:handle", "handler 'orders.handler:handle': module 'orders' not found")
    assert not failed.ok and "module 'orders' not found" in failed.detail


def test_any_failed_check_exits_2_as_the_drivers_refusals() -> None:
    passed = Check("java", True, "Java 17")
    assert exit_status([passed, passed]) == 0
    assert exit_status([passed, Check("handler", False, "x")]) == 2


def test_java_is_run_for_real_and_a_missing_java_home_is_reported() -> None:
    found = run_java(os.environ)
    assert java_check(found).ok, found  # `make test` installs a Java 17 runtime
    missing = run_java({"JAVA_HOME": "/nonexistent", "PATH": os.environ.get("PATH", "")})
    assert missing.command == "/nonexistent/bin/java" and missing.error is not None


def test_a_package_that_fails_to_import_is_named() -> None:
    found, errors = import_packages(("json", "keyorder_no_such_package"))
    assert list(found) == ["json"]
    assert "keyorder_no_such_package" in errors["keyorder_no_such_package"]


def run_catchup(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``keyorder catchup ARGS`` in a process of its own, with ``env`` as its only ``KEYORDER_*`` variables."""
    return subprocess.run(
        [sys.executable, "-m", "keyorder.catchup", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={
            **{name: value for name, value in os.environ.items() if not name.startswith("KEYORDER_")},
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            **env,
        },
        check=False,
    )


def preflight(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return run_catchup(tmp_path, "--preflight", *args, **env)


def test_the_command_prints_one_line_per_check_and_exits_0_when_all_pass(tmp_path: Path) -> None:
    done = preflight(tmp_path, "--handler", "tests.unit.catchup_handlers:slow")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == ["ok   java", "ok   pyspark", "ok   handler", "ok   environment"]


def test_the_command_exits_2_naming_what_failed_without_kafka_or_spark(tmp_path: Path) -> None:
    fake_java = tmp_path / "jre" / "bin" / "java"  # a FAKE Java 11: prints what an old runtime prints
    fake_java.parent.mkdir(parents=True)
    fake_java.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    fake_java.chmod(fake_java.stat().st_mode | stat.S_IXUSR)
    # the handler from the environment, as the operator's probe Job passes it
    done = preflight(tmp_path, JAVA_HOME=str(tmp_path / "jre"), KEYORDER_HANDLER="tests.unit.catchup_handlers:nope")
    assert done.returncode == 2
    lines = done.stdout.splitlines()
    assert lines[0].startswith("FAIL java:") and "is Java 11" in lines[0], lines
    assert lines[1].startswith("ok   pyspark:"), lines
    assert lines[2].startswith("FAIL handler:") and "has no attribute 'nope'" in lines[2], lines


def test_the_preflight_fails_a_batch_size_or_an_unknown_variable_the_job_would_refuse(tmp_path: Path) -> None:
    done = preflight(tmp_path, "--handler", "tests.unit.catchup_handlers:slow", KEYORDER_BATCH_MAX_MESSAGES="100")
    assert done.returncode == 2
    assert done.stdout.splitlines()[3].startswith("FAIL environment: KEYORDER_BATCH_MAX_MESSAGES=100"), done.stdout
    done = preflight(tmp_path, "--handler", "tests.unit.catchup_handlers:slow", KEYORDER_TASK_WORKER="64")
    assert done.returncode == 2
    assert "KEYORDER_TASK_WORKER: did you mean KEYORDER_TASK_WORKERS?" in done.stdout, done.stdout
