"""The Dockerfiles, read without a Docker engine (dockerfile-parse), and the pinned dependency lists.

Checks what an image review checks: multi-stage, a pinned slim base (a tag, never ``latest``),
a numeric non-root user and ``ENTRYPOINT ["keyorder"]`` (the catchup stage:
``keyorder-spark-entrypoint`` under tini) in every final stage, no compiler or package build in a final
stage, dependencies installed from lists pinned with ``==`` that cover
everything keyorder needs, and a build context that contains what the Dockerfile copies.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pytest
import yaml
from dockerfile_parse import DockerfileParser
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import keyorder
from keyorder.adapters.handlers import load_handler
from keyorder.message import Message
from tests.packaging.conftest import CHART, ROOT
from tools import locks

BUILD_TOOLS = re.compile(r"^(gcc|g\+\+|cpp|clang|make|cmake|build-essential|git|curl|wget|.*-dev)$")


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, instruction: str) -> list[str]:
        return [value for name, value in self.instructions if name == instruction]


def stages(path: Path) -> list[Stage]:
    parser = DockerfileParser(str(path))
    arguments: dict[str, str] = {}
    result: list[Stage] = []
    for item in parser.structure:
        instruction, value = item["instruction"], item["value"]
        if instruction == "ARG" and not result and "=" in value:
            name, default = value.split("=", 1)
            arguments[name] = default
        elif instruction == "FROM":
            words = value.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda match: arguments[match.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(result))
            result.append(Stage(name, base))
        elif instruction != "COMMENT" and result:
            result[-1].instructions.append((instruction, value))
    return result


def chain(stage: Stage, by_name: dict[str, Stage]) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    result = [stage]
    while result[-1].base in by_name:
        result.append(by_name[result[-1].base])
    return result


def final_stages(all_stages: list[Stage]) -> list[Stage]:
    used = {stage.base for stage in all_stages}
    for stage in all_stages:
        for value in stage.values("COPY"):
            used |= set(re.findall(r"--from=(\S+)", value))
    return [stage for stage in all_stages if stage.name not in used]


def installed_apt_packages(stage: Stage) -> list[str]:
    packages = []
    for command in stage.values("RUN"):
        for part in re.split(r"&&|;", command):
            words = shlex.split(part)
            if "apt-get" in words and "install" in words:
                packages += [word for word in words[words.index("install") + 1 :] if not word.startswith("-")]
    return packages


MAIN = stages(ROOT / "Dockerfile")
BY_NAME = {stage.name: stage for stage in MAIN}
FINAL = final_stages(MAIN)


def test_multi_stage_with_the_runtime_as_default_target():
    assert [stage.name for stage in MAIN] == [
        "dependencies",
        "catchup-dependencies",
        "venv-builder",
        "catchup-venv-builder",
        "builder",
        "catchup-builder",
        "base",
        "catchup",
        "runtime",
    ]
    assert {stage.name for stage in FINAL} == {"catchup", "runtime"}
    assert MAIN[-1].name == "runtime"  # `docker build .` builds the runtime image


def test_bases_are_pinned_slim_python_never_latest():
    external = {stage.base for stage in MAIN if stage.base not in BY_NAME}
    assert external == {"python:3.11-slim-bookworm"}
    for base in external:
        image, _, tag = base.partition("@")[0].rpartition(":")
        assert image and tag and tag != "latest", base


@pytest.mark.parametrize("stage", FINAL, ids=lambda stage: stage.name)
def test_final_stages_run_keyorder_as_a_numeric_non_root_user(stage):
    users = [user for s in chain(stage, BY_NAME) for user in reversed(s.values("USER"))]
    assert users, f"{stage.name} has no USER"
    uid, _, gid = users[0].partition(":")
    assert uid.isdigit() and int(uid) > 0 and (not gid or gid.isdigit()), users[0]
    # The catchup image also starts as a Spark executor or cluster-mode driver when Spark asks
    # (keyorder.catchup.entrypoint); everything else goes to keyorder.
    expected = ["keyorder-spark-entrypoint"] if stage.name == "catchup" else ["keyorder"]
    assert json.loads(stage.values("ENTRYPOINT")[-1])[-len(expected) :] == expected


def test_the_catchup_image_runs_under_an_init_that_passes_sigterm_to_the_driver():
    """Issue 27, defect 3: as PID 1 the driver ignored SIGTERM (the kernel drops a signal PID 1 has no
    handler for), so Kubernetes' stop waited for the SIGKILL: no SparkContext.stop, no report. tini is
    PID 1 and passes the signal to its child only (no ``-g``: the driver's JVM, in the same process
    group, must live until the driver has stopped Spark)."""
    stage = BY_NAME["catchup"]
    entrypoint = json.loads(stage.values("ENTRYPOINT")[-1])
    assert entrypoint == ["tini", "--", "keyorder-spark-entrypoint"]
    assert "tini" in installed_apt_packages(stage)


@pytest.mark.parametrize("stage", FINAL, ids=lambda stage: stage.name)
def test_final_stages_have_no_build_tools(stage):
    for s in chain(stage, BY_NAME):
        assert [p for p in installed_apt_packages(s) if BUILD_TOOLS.match(p)] == [], s.name
        for command in s.values("RUN"):
            assert not re.search(r"\bpip\b|\bsetuptools\b|\bwheel\b", command), f"{s.name} builds in a final stage"
        for value in s.values("COPY"):
            source = re.search(r"--from=(\S+)", value)
            assert source is None or source.group(1).endswith("builder"), value
    assert installed_apt_packages(BY_NAME["catchup"]) == ["openjdk-17-jre-headless", "tini"]


def test_dependencies_come_from_the_pinned_lists():
    runs = "\n".join(command for stage in MAIN for command in stage.values("RUN"))
    for lock in ("requirements/build.txt", "requirements/image.txt", "requirements/catchup.txt"):
        assert f"-r {lock}" in runs, f"{lock} is not what the Dockerfile installs"
    assert "--only-binary=:all: -r requirements/image.txt" in runs
    assert "pip check" in runs


def lock_lines(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)", line.strip())
            assert match, f"{path.name}: not pinned with ==: {line!r}"
            pins[canonicalize_name(match.group(1))] = match.group(2)
    return pins


@pytest.mark.parametrize("name", ["build.txt", "image.txt", "catchup.txt"])
def test_every_requirement_is_pinned(name):
    assert lock_lines(ROOT / "requirements" / name)


def test_image_lock_covers_every_runtime_dependency_within_pyproject_ranges():
    pins = lock_lines(locks.IMAGE_LOCK)
    needed = set(locks.image_pins())
    assert needed - set(pins) == set(), "requirements/image.txt misses dependencies: python -m tools.locks"
    assert set(pins) - needed == set(), "requirements/image.txt pins what keyorder does not need"
    for text in metadata.requires("keyorder"):
        requirement = Requirement(text)
        if requirement.marker is None:  # a runtime dependency, not an extra
            version = pins[canonicalize_name(requirement.name)]
            assert requirement.specifier.contains(version, prereleases=True), (requirement, version)


def test_catchup_lock_adds_the_catchup_extra_on_top_of_the_image():
    pins = lock_lines(locks.CATCHUP_LOCK)
    assert set(pins) == set(locks.catchup_pins()), "stale requirements/catchup.txt: python -m tools.locks"
    assert {"pyspark", "pandas", "pyarrow", "py4j"} <= set(pins)
    assert not set(pins) & set(lock_lines(locks.IMAGE_LOCK))
    for text in metadata.requires("keyorder"):
        requirement = Requirement(text)
        if (
            requirement.marker is not None
            and requirement.marker.evaluate({"extra": "catchup"})
            and canonicalize_name(requirement.name) in pins
        ):
            version = pins[canonicalize_name(requirement.name)]
            assert requirement.specifier.contains(version, prereleases=True), (requirement, version)


def test_build_context_holds_what_the_dockerfile_copies():
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", ".dockerignore should be an allowlist"
    allowed = [pattern[1:].rstrip("/") for pattern in patterns if pattern.startswith("!")]
    for stage in MAIN:
        for value in stage.values("COPY"):
            if "--from=" in value:
                continue
            *sources, _ = shlex.split(value)
            for source in sources:
                assert (ROOT / source).exists(), source
                assert any(
                    fnmatch.fnmatch(source.rstrip("/"), pattern) or source.startswith(pattern + "/")
                    for pattern in allowed
                ), f"{source} excluded by .dockerignore"
    assert not any(pattern.startswith("!") and (".venv" in pattern or ".git" in pattern) for pattern in patterns)


def test_versions_agree_across_image_chart_and_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == keyorder.__version__ == metadata.version("keyorder")
    handler = stages(ROOT / "examples" / "handler" / "Dockerfile")
    assert handler[0].base == f"keyorder:{keyorder.__version__}"
    assert f"image: keyorder:{keyorder.__version__}" in (ROOT / "examples" / "orderedconsumer-minimal.yaml").read_text()


# ---------------------------------------------------------------- the handler example


HANDLER_DIR = ROOT / "examples" / "handler"


def test_handler_image_is_from_keyorder_and_drops_root_again():
    (stage,) = stages(HANDLER_DIR / "Dockerfile")
    image, _, tag = stage.base.rpartition(":")
    assert image == "keyorder" and tag and tag != "latest"
    assert stage.values("USER")[-1] == "65532:65532"
    assert [p for p in installed_apt_packages(stage) if BUILD_TOOLS.match(p)] == []
    for value in stage.values("COPY"):
        *sources, _ = shlex.split(value)
        assert all((HANDLER_DIR / source).exists() for source in sources), value
    assert "/opt/keyorder/bin/pip install" in " ".join(stage.values("RUN"))


def test_handler_package_works_with_keyorder(monkeypatch):
    monkeypatch.syspath_prepend(str(HANDLER_DIR))
    loaded = load_handler("payments_handler.handler:handle")
    from payments_handler import handler

    def payment(offset: int, account: str, sequence: int, amount: int) -> Message:
        value = json.dumps({"sequence": sequence, "amount": amount}).encode()
        return Message(topic="payments", partition=0, offset=offset, key=account.encode(), value=value)

    for offset, (account, sequence, amount) in enumerate([("a", 1, 100), ("b", 1, 5), ("a", 2, -30), ("a", 2, -30)]):
        loaded.function(payment(offset, account, sequence, amount))  # the last one is a re-delivery
    assert handler.balances == {"a": 70, "b": 5}
    with pytest.raises(RuntimeError, match="sequence 4 after 2"):
        loaded.function(payment(9, "a", 4, 1))
    assert "payments_handler" in (HANDLER_DIR / "pyproject.toml").read_text()
