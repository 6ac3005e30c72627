"""The Dockerfiles, read without a Docker engine (dockerfile-parse), and the pinned dependency lists.

Checks what an image review checks: multi-stage, a slim base pinned by digest, a numeric non-root
user and ``ENTRYPOINT ["keyorder"]`` (the catchup stage: ``keyorder-spark-entrypoint`` under tini) in
every final stage, no compiler or package build in a final stage, dependencies installed with
``--require-hashes`` from lists pinned with ``==`` and hashed that cover everything keyorder needs, builds
with build isolation from the hash-checked build tools only, Debian packages pinned to versions, and a
build context that contains what the Dockerfile copies (docs/security.md, "Supply chain").
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


def global_arguments(path: Path) -> dict[str, str]:
    """The ``ARG name=default`` lines before the first ``FROM``."""
    arguments = {}
    for item in DockerfileParser(str(path)).structure:
        if item["instruction"] == "FROM":
            break
        if item["instruction"] == "ARG" and "=" in item["value"]:
            name, default = item["value"].split("=", 1)
            arguments[name] = default
    return arguments


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


def test_the_base_is_slim_python_pinned_by_digest():
    """Issue 37, finding 8: the base was a tag, which its publisher (or whoever controls the registry's
    answer) can move to other content; a digest names the content itself."""
    external = {stage.base for stage in MAIN if stage.base not in BY_NAME}
    assert len(external) == 1
    (base,) = external
    reference, _, digest = base.partition("@")
    image, _, tag = reference.rpartition(":")
    assert image == "python" and tag == "3.11-slim-bookworm", base
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"the base is not pinned by digest: {base}"


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
    assert "tini" in [package.split("=")[0] for package in installed_apt_packages(stage)]


@pytest.mark.parametrize("stage", FINAL, ids=lambda stage: stage.name)
def test_final_stages_have_no_build_tools(stage):
    for s in chain(stage, BY_NAME):
        assert [p for p in installed_apt_packages(s) if BUILD_TOOLS.match(p)] == [], s.name
        for command in s.values("RUN"):
            assert not re.search(r"\bpip\b|\bsetuptools\b|\bwheel\b", command), f"{s.name} builds in a final stage"
        for value in s.values("COPY"):
            source = re.search(r"--from=(\S+)", value)
            assert source is None or source.group(1).endswith("builder"), value
    assert [p.split("=")[0] for p in installed_apt_packages(BY_NAME["catchup"])] == ["openjdk-17-jre-headless", "tini"]


def test_debian_packages_are_pinned_to_versions():
    """Every ``apt-get install`` names a version (``package=${VERSION}``, the ARG's default a Debian version)."""
    arguments = global_arguments(ROOT / "Dockerfile")
    for stage in MAIN:
        declared = {value.split("=")[0] for value in stage.values("ARG")}
        for package in installed_apt_packages(stage):
            name, _, version = package.partition("=")
            argument = re.fullmatch(r"\$\{(\w+)\}", version)
            assert argument, f"{stage.name}: {name} is not pinned to a version"
            assert argument.group(1) in declared, f"{stage.name} does not declare ARG {argument.group(1)}"
            assert re.fullmatch(r"[0-9][0-9A-Za-z.+~:-]*", arguments.get(argument.group(1), "")), argument.group(1)


def pip_commands(stage: Stage) -> list[list[str]]:
    """The pip invocations of a stage's RUN instructions, as words."""
    commands = []
    for command in stage.values("RUN"):
        for part in re.split(r"&&|;", command.replace("\\\n", " ")):
            words = shlex.split(part)
            if "pip" in words or any(word.endswith("/pip") for word in words) or words[1:3] == ["-m", "pip"]:
                commands.append(words)
    return commands


def test_dependencies_come_from_the_pinned_lists_with_their_hashes_checked():
    """Issue 37, finding 8: every pip command that fetches from the package index checks hashes; the rest install
    what those fetched (``--no-index``)."""
    runs = "\n".join(command for stage in MAIN for command in stage.values("RUN"))
    for lock in ("requirements/build.txt", "requirements/image.txt", "requirements/catchup.txt"):
        assert f"-r {lock}" in runs, f"{lock} is not what the Dockerfile installs"
    assert "--only-binary=:all: -r requirements/image.txt" in runs
    assert "pip check" in runs
    fetching = [words for stage in MAIN for words in pip_commands(stage) if "--no-index" not in words]
    assert fetching, "no pip command found"
    for words in fetching:
        if "check" not in words:
            assert "--require-hashes" in words, f"fetches from the index without checking hashes: {' '.join(words)}"


def test_builds_are_isolated_and_offline_with_the_hash_checked_build_tools():
    """Issue 37, finding 8: PySpark (a source archive) was built with --no-build-isolation, with whatever the
    build stage held. Now every build runs isolated, with no index, its build dependencies only from the
    hash-checked wheels of requirements/build.txt; only reading PySpark's metadata at download time runs
    without isolation (with those same wheels installed)."""
    for stage in MAIN:
        for words in pip_commands(stage):
            if "wheel" in words and "--only-binary=:all:" not in words:  # builds a wheel from a source
                assert "--no-build-isolation" not in words, " ".join(words)
                assert "--no-index" in words and "/wheels/build" in words, " ".join(words)
            if "--no-build-isolation" in words:
                assert words[words.index("pip") + 1] == "download" and "--require-hashes" in words, " ".join(words)


def lock_lines(path: Path) -> dict[str, str]:
    return {name: version for name, (version, _) in locks.read_lock(path).items()}


@pytest.mark.parametrize("lock", [locks.BUILD_LOCK, locks.IMAGE_LOCK, locks.CATCHUP_LOCK], ids=lambda p: p.name)
def test_every_requirement_is_pinned_with_its_hashes(lock):
    """Issue 37, finding 8: a pin without a hash lets the index serve any file under that version. With
    ``--require-hashes`` pip would refuse the build; this says which pin, before a build does."""
    pins = locks.read_lock(lock)
    assert pins
    unhashed = sorted(name for name, (_, hashes) in pins.items() if not hashes)
    assert unhashed == [], f"{lock.name}: pins without --hash=sha256: {unhashed} (python -m tools.locks)"


def test_a_pin_without_its_hash_is_found(tmp_path):
    lock = tmp_path / "image.txt"
    lock.write_text("# header\nattrs==26.1.0 \\\n    --hash=sha256:" + "a" * 64 + "\nidna==3.20\n")
    assert locks.read_lock(lock) == {"attrs": ("26.1.0", ["a" * 64]), "idna": ("3.20", [])}
    lock.write_text("attrs>=26\n")
    with pytest.raises(ValueError, match="not pinned with =="):
        locks.read_lock(lock)


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


def test_regenerating_the_locks_keeps_known_hashes_and_fetches_the_rest():
    previous = {"attrs": ("26.1.0", ["a" * 64]), "idna": ("3.19", ["b" * 64]), "yarl": ("1.25.1", [])}
    asked = []

    def fetch(pins):
        asked.append(pins)
        return {name: ["c" * 64, "d" * 64] for name in pins}

    hashed = locks.with_hashes({"attrs": "26.1.0", "idna": "3.20", "yarl": "1.25.1", "new": "1.0"}, previous, fetch)
    assert asked == [{"idna": "3.20", "yarl": "1.25.1", "new": "1.0"}]  # changed, unhashed, new
    assert hashed["attrs"] == ("26.1.0", ["a" * 64]) and hashed["idna"] == ("3.20", ["c" * 64, "d" * 64])
    rendered = locks.render(hashed, "purpose")
    assert "idna==3.20 \\\n    --hash=sha256:" + "c" * 64 + " \\\n    --hash=sha256:" + "d" * 64 + "\n" in rendered
