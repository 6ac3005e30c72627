"""Every command, file and manifest in the user guides is exercised, so the guides cannot drift.

For each guide in ``GUIDES``:

* ``sh`` blocks: every command goes to the checker of its program, and a command no checker knows
  fails the test (a new kind of command needs a checker). ``keyorder`` commands are parsed by the
  real CLI and their settings loaded by ``keyorder run``'s own configuration; one followed by a
  ``text`` block is run for real and must print exactly that text (start-up errors, exit 2).
  ``python -m pytest`` runs the guide's own tests, ``pip install`` installs the guide's project,
  ``docker build`` is checked against the guide's Dockerfile (no Docker engine here), ``kubectl``
  against the files and resource types that exist, ``kafka-consumer-groups.sh`` against a table of
  that tool's options (no Kafka distribution here: the table is named as a stand-in).
* ``yaml`` blocks: every manifest is validated, Kubernetes kinds by kubernetes-validate (strict),
  OrderedConsumers by the CRD's schema and the operator's own spec model, PodMonitors by the
  chart tests' minimal schema, KEDA ScaledObjects (no schema offline) for consistency with the
  Deployment they scale; a keyorder pod's environment is loaded as ``keyorder run`` would.
* files (a block whose first line is ``# file: NAME``) are written out: the handler tutorial's
  project is built from them, installed, tested, and its handler paths loaded by keyorder's loader.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from dockerfile_parse import DockerfileParser
from openapi_schema_validator import OAS30Validator

from keyorder.cli import build_parser
from keyorder.config import load_run_config
from keyorder_operator.main import check_operator_args
from keyorder_operator.spec import parse_spec
from tests.packaging.conftest import KUBERNETES_VERSIONS, ROOT
from tests.packaging.monitoring_schemas import MINIMAL_MONITORING_SCHEMAS

GUIDES = ["handler-tutorial.md", "comparison.md", "migration.md", "troubleshooting.md", "without-operator.md"]
CRD = yaml.safe_load((ROOT / "crds" / "orderedconsumers.keyorder.dev.yaml").read_text())
CRD_SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
KUBECTL_TYPES = {
    *CRD["spec"]["names"].get("shortNames", []),
    CRD["spec"]["names"]["plural"],
    CRD["spec"]["names"]["singular"],
    *("pod", "pods", "deployment", "deployments", "scaledobject", "scaledobjects", "podmonitor", "job", "jobs"),
}
KUBECTL_FLAGS_WITH_VALUE = {"-n", "--namespace", "-l", "--selector", "-f", "--filename", "--replicas", "-o"}
KUBECTL_FLAGS = {"--previous", "--server-side"}
KAFKA_CONSUMER_GROUPS_OPTIONS = {
    "--bootstrap-server": True,
    "--group": True,
    "--topic": True,
    "--describe": False,
    "--state": False,
    "--members": False,
    "--offsets": False,
    "--list": False,
    "--reset-offsets": False,
    "--to-earliest": False,
    "--to-current": False,
    "--dry-run": False,
    "--execute": False,
}
"""Stand-in for Apache Kafka's kafka-consumer-groups.sh (option -> takes a value), from its --help."""


@dataclass
class Block:
    language: str
    text: str
    line: int


@dataclass
class Guide:
    name: str
    blocks: list[Block]
    files: dict[str, str] = field(default_factory=dict)

    @classmethod
    def read(cls, name: str) -> Guide:
        text = (ROOT / "docs" / name).read_text()
        blocks = [
            Block(match.group(1), match.group(2), text[: match.start()].count("\n") + 1)
            for match in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.M | re.S)
        ]
        files = {}
        for block in blocks:
            first, _, rest = block.text.partition("\n")
            if first.startswith("# file: "):
                files[first.removeprefix("# file: ").strip()] = rest
        return cls(name, blocks, files)

    def commands(self) -> list[tuple[str, str | None]]:
        """(command, the output the guide shows for it or None), for every command of every sh block."""
        found = []
        for index, block in enumerate(self.blocks):
            if block.language != "sh":
                continue
            following = self.blocks[index + 1] if index + 1 < len(self.blocks) else None
            joined = block.text.replace("\\\n", " ")
            lines = [line.strip() for line in joined.splitlines() if line.split("#")[0].strip()]
            for line in lines:
                output = following.text if following and following.language == "text" and len(lines) == 1 else None
                found.append((line, output))
        return found


GUIDE_OBJECTS = {name: Guide.read(name) for name in GUIDES}
ALL_COMMANDS = [
    (name, command, output) for name, guide in GUIDE_OBJECTS.items() for command, output in guide.commands()
]


def split_command(command: str) -> tuple[dict[str, str], list[str]]:
    """Leading NAME=value assignments, then the argv."""
    words = shlex.split(command, comments=True)
    env = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words


def clean_environment(extra: dict[str, str]) -> dict[str, str]:
    environ = {name: value for name, value in os.environ.items() if not name.startswith("KEYORDER_")}
    return {**environ, "PYTHONPATH": os.pathsep.join(sys.path), **extra}


# ---------------------------------------------------------------- the tutorial's project


@pytest.fixture(scope="module")
def tutorial_project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The handler tutorial's files written out, and its package installed (pip, no network)."""
    project = tmp_path_factory.mktemp("orders-handler")
    for name, text in GUIDE_OBJECTS["handler-tutorial.md"].files.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    installed = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            installed,
            ".",
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    return project, installed


def handler_paths(guide: Guide) -> set[str]:
    text = "\n".join(block.text for block in guide.blocks)
    return set(re.findall(r"--handler ([\w.]+:\w+)", text)) | set(re.findall(r"\bhandler: ([\w.]+:\w+)", text))


def test_the_tutorials_handlers_load_with_keyorders_own_loader(tutorial_project):
    _, installed = tutorial_project
    paths = handler_paths(GUIDE_OBJECTS["handler-tutorial.md"])
    assert paths == {"orders_handler.handler:handle"}
    script = "from keyorder.adapters.handlers import load_handler\nimport sys\n" + "".join(
        f"print(load_handler({path!r}).is_async)\n" for path in [*sorted(paths), "orders_handler.notify:handle"]
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        env=clean_environment({"PYTHONPATH": os.pathsep.join([str(installed), *sys.path])}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"], "handle is plain, notify.handle is async"


# ---------------------------------------------------------------- commands


def check_keyorder(guide: Guide, env: dict[str, str], argv: list[str], output: str | None) -> None:
    if output is not None:  # the guide shows what it prints: run it for real
        result = subprocess.run(
            [sys.executable, "-m", "keyorder.cli", *argv[1:]],
            env=clean_environment(env),
            capture_output=True,
            text=True,
            timeout=60,
            cwd=ROOT,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip() == output.strip()
        return
    command = argv[1]
    args = build_parser(command).parse_args(argv[1:])
    if command == "run":
        load_run_config(vars(args), environ=env)
        assert args.handler in handler_paths(guide)
    elif command == "operator":
        check_operator_args(args)


def check_kubectl(guide: Guide, argv: list[str]) -> None:
    verb, words = argv[1], argv[2:]
    assert verb in {"get", "describe", "logs", "apply", "delete", "scale", "rollout"}, verb
    positional, files = [], []
    index = 0
    while index < len(words):
        word = words[index]
        name, equals, value = word.partition("=")
        if name in KUBECTL_FLAGS_WITH_VALUE:
            if not equals:
                index += 1
                value = words[index]
            if name in {"-f", "--filename"}:
                files.append(value)
                assert value in guide.files or (ROOT / value).is_file(), (
                    f"kubectl -f {value}: no such file in the guide"
                )
            if name == "--replicas":
                assert int(value) >= 0
        elif word.startswith("-"):
            assert word in KUBECTL_FLAGS, f"unknown kubectl flag {word}"
        else:
            positional.append(word)
        index += 1
    if verb == "rollout":
        assert positional.pop(0) in {"status", "restart"}
    if verb == "apply":
        assert files and not positional
        return
    kind = positional[0].split("/")[0] if positional else ""
    assert kind in KUBECTL_TYPES, f"kubectl {verb}: unknown resource type {kind!r}"


def check_kafka_consumer_groups(argv: list[str]) -> None:
    words = argv[1:]
    assert "--bootstrap-server" in words and "--group" in words
    while words:
        word = words.pop(0)
        assert word in KAFKA_CONSUMER_GROUPS_OPTIONS, f"kafka-consumer-groups.sh has no option {word}"
        if KAFKA_CONSUMER_GROUPS_OPTIONS[word]:
            assert words and not words.pop(0).startswith("-"), f"{word} takes a value"


def check_docker(guide: Guide, argv: list[str], built: set[str]) -> None:
    verb, *rest = argv[1:]
    if verb == "push":
        (image,) = rest
        assert image in built, f"docker push {image}: the guide never builds it"
        return
    assert verb == "build"
    assert rest[-1] == ".", "the guide's project folder is the context"
    dockerfile = DockerfileParser(fileobj=BytesIO(guide.files["Dockerfile"].encode()))
    declared = {
        instruction["value"].split("=")[0]
        for instruction in dockerfile.structure
        if instruction["instruction"] == "ARG"
    }
    for index, word in enumerate(rest):
        if word == "--build-arg":
            assert rest[index + 1].split("=")[0] in declared, f"the Dockerfile declares no ARG {rest[index + 1]}"
        if word == "-t":
            built.add(rest[index + 1])
    for instruction in dockerfile.structure:
        if instruction["instruction"] == "COPY":
            *sources, _ = instruction["value"].split()
            for source in sources:
                assert any(name == source or name.startswith(source) for name in guide.files), f"COPY {source}"


@pytest.mark.parametrize(("guide_name", "command", "output"), ALL_COMMANDS, ids=[c for _, c, _ in ALL_COMMANDS])
def test_every_command_in_the_guides_is_checked(guide_name, command, output, request):
    guide = GUIDE_OBJECTS[guide_name]
    env, argv = split_command(command)
    program = argv[0]
    if program == "keyorder":
        check_keyorder(guide, env, argv, output)
    elif program == "kubectl":
        check_kubectl(guide, argv)
    elif program == "kafka-consumer-groups.sh":
        check_kafka_consumer_groups(argv)
    elif program == "docker":
        built: set[str] = set()
        for other, _ in guide.commands():  # the images the guide builds, up to this command
            _, other_argv = split_command(other)
            if other_argv[:2] == ["docker", "build"]:
                check_docker(guide, other_argv, built)
            if other == command:
                break
        check_docker(guide, argv, built)
    elif argv[:4] == ["python", "-m", "pytest", "tests"]:
        project, installed = request.getfixturevalue("tutorial_project")  # built once, by pip (slow)
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
            cwd=project,
            env=clean_environment({"PYTHONPATH": os.pathsep.join([str(installed), *sys.path])}),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert result.returncode == 0 and "4 passed" in result.stdout, result.stdout + result.stderr
    elif argv[:3] == ["pip", "install", "-e"]:
        assert argv[3] == "." and "pyproject.toml" in guide.files  # installed by the tutorial_project fixture
    else:
        pytest.fail(f"{guide_name}: no checker for {command!r}")


def test_the_guides_have_commands_and_outputs():
    assert len(ALL_COMMANDS) >= 25
    assert sum(output is not None for _, _, output in ALL_COMMANDS) >= 4, "shown error messages are checked"


# ---------------------------------------------------------------- manifests and files


def keda_consistent(scaled_object: dict[str, Any], documents: list[dict[str, Any]]) -> None:
    """KEDA's CRDs are not available offline: check the ScaledObject against the Deployment it scales."""
    assert scaled_object["apiVersion"] == "keda.sh/v1alpha1"
    spec = scaled_object["spec"]
    (deployment,) = [doc for doc in documents if doc["kind"] == "Deployment"]
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    env = {item["name"]: item["value"] for item in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    (trigger,) = spec["triggers"]
    metadata = trigger["metadata"]
    assert trigger["type"] == "kafka"
    assert metadata["consumerGroup"] == env["KEYORDER_GROUP_ID"]
    assert metadata["topic"] in env["KEYORDER_TOPICS"].split(",")
    assert metadata["bootstrapServers"] == env["KEYORDER_BOOTSTRAP_SERVERS"]
    assert metadata["offsetResetPolicy"] == "earliest", "keyorder's auto.offset.reset"
    assert int(metadata["lagThreshold"]) > 0


def check_keyorder_pod(deployment: dict[str, Any]) -> None:
    """A Deployment that runs `keyorder run`: its environment is a valid keyorder configuration."""
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    if container.get("args") != ["run"]:
        return
    env = {item["name"]: item["value"] for item in container["env"]}
    config = load_run_config({}, environ=env)
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert config.shutdown_grace < grace, "in-flight messages must finish before the kubelet kills the pod"
    probes = {container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]}
    assert probes == {"/readyz", "/healthz"}


MANIFEST_BLOCKS = [
    (name, block.line, block.text)
    for name, guide in GUIDE_OBJECTS.items()
    for block in guide.blocks
    if block.language == "yaml"
]


@pytest.mark.parametrize(
    ("guide_name", "line", "text"), MANIFEST_BLOCKS, ids=[f"{n}:{ln}" for n, ln, _ in MANIFEST_BLOCKS]
)
def test_every_manifest_in_the_guides_is_valid(guide_name, line, text):
    documents = [doc for doc in yaml.safe_load_all(text) if doc]
    every = [
        doc
        for block in GUIDE_OBJECTS[guide_name].blocks
        if block.language == "yaml"
        for doc in yaml.safe_load_all(block.text)
        if doc
    ]
    assert documents
    for doc in documents:
        kind = doc["kind"]
        if kind == CRD["spec"]["names"]["kind"]:
            assert doc["apiVersion"] == f"{CRD['spec']['group']}/{CRD['spec']['versions'][0]['name']}"
            OAS30Validator(CRD_SCHEMA).validate(doc)
            parse_spec(doc["spec"])  # the operator's own model: cross-field rules included
        elif kind in MINIMAL_MONITORING_SCHEMAS:
            jsonschema.validate(doc, MINIMAL_MONITORING_SCHEMAS[kind])
        elif kind == "ScaledObject":
            keda_consistent(doc, every)
        else:
            for version in KUBERNETES_VERSIONS:
                kubernetes_validate.validate(doc, version, strict=True)
            if kind == "Deployment":
                check_keyorder_pod(doc)


def test_other_files_of_the_guides_parse():
    for guide in GUIDE_OBJECTS.values():
        for block in guide.blocks:
            if block.language == "toml":
                tomllib.loads(block.text)
            elif block.language == "python":
                compile(block.text, f"{guide.name}:{block.line}", "exec")
            else:
                assert block.language in {"sh", "text", "yaml", "dockerfile"}, f"{guide.name}:{block.line}"
