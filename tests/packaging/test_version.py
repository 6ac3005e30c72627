"""One version for the wheel, the chart's ``appVersion`` and the image tag.

The source is ``version`` in pyproject.toml (the wheel's). The others are copies a release bumps with
it: ``keyorder.__version__`` (what ``keyorder --version`` prints), the chart's ``appVersion`` (the image
tag the chart installs by default; ``image.tag`` in values.yaml stays empty so that it applies), and the
tag ``tools/image.py`` gives a release build (``make dist``). Each test names the file that disagrees.
The guides' ``keyorder:X.Y.Z`` image references are checked too, so a bump cannot leave the install
steps pointing at the previous release. Offline and fast: files and one ``keyorder --version`` process.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
import yaml

import keyorder
from tools import image

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "keyorder-operator"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
"""The one version: pyproject.toml's."""

IMAGE_REFERENCE = re.compile(r"\bkeyorder(?:-catchup)?:(\d+\.\d+\.\d+(?:[-+][0-9A-Za-z.-]*[0-9A-Za-z])?)")
"""``keyorder:0.1.0`` or ``keyorder-catchup:0.1.0`` (with or without a registry in front), the version captured."""


def test_the_version_is_a_release_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", VERSION), f"pyproject.toml version {VERSION!r} is not MAJOR.MINOR.PATCH"


def test_the_package_says_the_pyproject_version():
    assert keyorder.__version__ == VERSION, (
        f"consumer/keyorder/__init__.py __version__ is {keyorder.__version__!r}, pyproject.toml says {VERSION!r}"
    )
    assert metadata.version("keyorder") == VERSION, (
        f"the installed keyorder's metadata says {metadata.version('keyorder')!r}, pyproject.toml {VERSION!r}: "
        "reinstall (make test does when pyproject.toml changed)"
    )


def test_keyorder_version_prints_it():
    command = Path(sys.executable).with_name("keyorder")  # the console script, as a user runs it
    done = subprocess.run([str(command), "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"keyorder {VERSION}"


def test_the_charts_app_version_and_default_image_tag_are_it():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION, (
        f"charts/keyorder-operator/Chart.yaml appVersion is {chart['appVersion']!r}, pyproject.toml says {VERSION!r}"
    )
    tag = yaml.safe_load((CHART / "values.yaml").read_text())["image"]["tag"]
    assert tag in ("", VERSION), (
        f"charts/keyorder-operator/values.yaml image.tag is {tag!r}: leave it empty (the appVersion) or {VERSION!r}"
    )


@pytest.mark.parametrize("target", sorted(image.TARGETS))
def test_a_release_image_is_tagged_and_labelled_with_it(target):
    assert image.project_version() == VERSION
    tag = image.release_tag(target)
    assert tag.endswith(f":{VERSION}") and tag.rpartition(":")[0] == image.TARGETS[target].rpartition(":")[0]
    labels = image.oci_labels(image.project_version(), source="https://example.invalid/keyorder", revision="abc123")
    assert labels["org.opencontainers.image.version"] == VERSION
    licence = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"]
    assert labels["org.opencontainers.image.licenses"] == licence
    assert f'org.opencontainers.image.licenses="{licence}"' in (ROOT / "Dockerfile").read_text()


def test_a_different_version_would_be_caught():
    """The checks above compare with pyproject's version, not with a constant: a bump is seen everywhere."""
    assert image.release_tag("runtime", "9.9.9") == "localhost/keyorder:9.9.9"
    assert IMAGE_REFERENCE.findall("docker push $REGISTRY/keyorder:0.0.9 && x") == ["0.0.9"]
    assert IMAGE_REFERENCE.findall("image: keyorder-catchup:1.2.3\n") == ["1.2.3"]
    assert IMAGE_REFERENCE.findall("`keyorder:dev`, then localhost/keyorder:0.2.0-rc.1.") == ["0.2.0-rc.1"]


GUIDES = [
    ROOT / "README.md",
    ROOT / "Dockerfile",
    *sorted((ROOT / "docs").glob("*.md")),
    CHART / "README.md",
    ROOT / "examples" / "handler" / "Dockerfile",
    *sorted((ROOT / "examples").glob("*.yaml")),
]


def test_the_guides_image_references_name_it():
    stale = [
        f"{path.relative_to(ROOT)}: keyorder:{found}"
        for path in GUIDES
        for found in IMAGE_REFERENCE.findall(path.read_text())
        if found != VERSION
    ]
    assert stale == [], f"image references to another version than {VERSION}: {stale}"
