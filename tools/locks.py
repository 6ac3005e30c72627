"""The image's pinned dependency lists, derived from the installed distributions' metadata.

``requirements/image.txt`` pins every distribution ``keyorder`` needs at run time (its
dependencies without extras, transitively, for Linux and this Python); ``requirements/catchup.txt``
adds what its ``catchup`` extra needs (PySpark with pandas and pyarrow) for the image's catchup
target. The Dockerfile installs exactly these, with ``--require-hashes``: every pin carries the
sha256 of each file pip may pick for it in the image (CPython 3.11 on glibc, ``PLATFORMS``; the
source archive of a distribution without wheels, PySpark). Regenerate after changing dependencies:

    .venv/bin/python -m tools.locks

A pin whose version did not change keeps the hashes it has (no network needed); a new or changed one
gets them from ``pip download`` of its files from the package index, for every platform. Tests fail
when a list misses a needed distribution, pins a version outside pyproject's range, or has a pin
without its hashes (tests/packaging/test_dockerfile.py).
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename

ROOT = Path(__file__).resolve().parents[1]
IMAGE_LOCK = ROOT / "requirements" / "image.txt"
CATCHUP_LOCK = ROOT / "requirements" / "catchup.txt"
BUILD_LOCK = ROOT / "requirements" / "build.txt"
PYTHON_VERSION = "3.11"
"""The image's Python (its base, python:3.11-slim-bookworm)."""
PLATFORMS = ("x86_64", "aarch64")
"""The image's CPU architectures: a pin carries the hashes of its wheels for both."""
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([0-9][0-9A-Za-z.+!-]*)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def read_lock(path: Path) -> dict[str, tuple[str, list[str]]]:
    """Canonical name -> (version, sha256 hashes) of a lock file (``name==version \\`` and ``--hash=`` lines)."""
    pins: dict[str, tuple[str, list[str]]] = {}
    text = path.read_text() if path.exists() else ""
    for requirement in re.sub(r"\\\n", " ", text).splitlines():
        words = requirement.split()
        if not words or words[0].startswith("#"):
            continue
        match = _PIN.fullmatch(words[0])
        if match is None:
            raise ValueError(f"{path.name}: not pinned with ==: {requirement!r}")
        hashes = [_HASH.fullmatch(word) for word in words[1:]]
        if not all(hashes):
            raise ValueError(f"{path.name}: only --hash=sha256:... may follow a pin: {requirement!r}")
        pins[canonicalize_name(match.group(1))] = (match.group(2), [h.group(1) for h in hashes if h])
    return pins


def _file_project(filename: str) -> str:
    if filename.endswith(".whl"):
        return canonicalize_name(parse_wheel_filename(filename)[0])
    return canonicalize_name(parse_sdist_filename(filename)[0])


def download_hashes(pins: dict[str, str]) -> dict[str, list[str]]:
    """The sha256 of every file pip picks for ``pins`` on each of ``PLATFORMS`` (a wheel, else the source
    archive), downloaded from the package index with ``pip download``."""
    found: dict[str, set[str]] = {name: set() for name in pins}
    requirements = [f"{name}=={version}" for name, version in sorted(pins.items())]
    with tempfile.TemporaryDirectory(prefix="keyorder-locks-") as directory:
        for platform in PLATFORMS:
            target = Path(directory) / platform
            tags = [f"--platform={tag}_{platform}" for tag in ("manylinux_2_28", "manylinux_2_17", "manylinux2014")]
            command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--prefer-binary"]
            command += ["--implementation=cp", f"--python-version={PYTHON_VERSION}", "--abi=cp311", "--abi=abi3"]
            subprocess.run(
                [*command, "--abi=none", *tags, "--dest", str(target), *requirements],
                check=True,
            )
            for file in target.iterdir():
                found[_file_project(file.name)].add(hashlib.sha256(file.read_bytes()).hexdigest())
    missing = sorted(name for name, hashes in found.items() if not hashes)
    if missing:
        raise RuntimeError(f"no file downloaded for {', '.join(missing)}")
    return {name: sorted(hashes) for name, hashes in found.items()}


def with_hashes(pins: dict[str, str], previous: dict[str, tuple[str, list[str]]], fetch=download_hashes) -> dict:
    """``pins`` with their hashes: kept from ``previous`` (the lock as it was) where the version is the same
    and it had some, else fetched."""
    kept = {name: previous[name][1] for name, version in pins.items() if previous.get(name, ("", []))[0] == version}
    kept = {name: hashes for name, hashes in kept.items() if hashes}
    new = {name: version for name, version in pins.items() if name not in kept}
    fetched = fetch(new) if new else {}
    return {name: (version, kept.get(name) or fetched[name]) for name, version in pins.items()}


def _requires(name: str, extras: frozenset[str]) -> list[Requirement]:
    environments = [{**default_environment(), "extra": extra} for extra in (extras or {""})]
    result = []
    for text in metadata.requires(name) or []:
        requirement = Requirement(text)
        if requirement.marker is None or any(requirement.marker.evaluate(env) for env in environments):
            result.append(requirement)
    return result


def closure(roots: list[str]) -> dict[str, str]:
    """Canonical name -> installed version of ``roots`` (requirement strings, extras allowed) and
    everything they need."""
    found: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    pending = [(Requirement(root).name, frozenset(Requirement(root).extras)) for root in roots]
    while pending:
        name, extras = pending.pop()
        key = canonicalize_name(name)
        if (key, extras) in seen:
            continue
        seen.add((key, extras))
        found[key] = metadata.version(name)
        for requirement in _requires(name, extras):
            pending.append((requirement.name, frozenset(requirement.extras)))
    return found


def image_pins() -> dict[str, str]:
    pins = closure(["keyorder"])
    del pins["keyorder"]  # installed from the source tree by the Dockerfile
    return pins


def catchup_pins() -> dict[str, str]:
    base = image_pins()
    return {
        name: version
        for name, version in closure(["keyorder[catchup]"]).items()
        if name not in base and name != "keyorder"
    }


def render(pins: dict[str, tuple[str, list[str]]], purpose: str) -> str:
    header = (
        f"# {purpose}\n# Generated by `python -m tools.locks` from the installed metadata; every line is pinned "
        "with == and\n# carries the sha256 of each file the image may install (pip install --require-hashes).\n"
    )
    lines = []
    for name, (version, hashes) in sorted(pins.items()):
        lines.append(" \\\n".join([f"{name}=={version}", *(f"    --hash=sha256:{h}" for h in hashes)]) + "\n")
    return header + "".join(lines)


def main() -> int:
    IMAGE_LOCK.write_text(
        render(
            with_hashes(image_pins(), read_lock(IMAGE_LOCK)),
            "Runtime dependencies of the keyorder image (keyorder run | operator).",
        )
    )
    CATCHUP_LOCK.write_text(
        render(
            with_hashes(catchup_pins(), read_lock(CATCHUP_LOCK)),
            "Added by the image's catchup target: PySpark for `keyorder catchup` (on top of image.txt).",
        )
    )
    print(f"wrote {IMAGE_LOCK} and {CATCHUP_LOCK}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
