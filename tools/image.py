"""Build keyorder's images with buildah from a local, Debian-packaged base (``make image``).

The machines that build and test keyorder have no Docker engine and no image registry, but they
reach Debian's and PyPI's packages, and Debian's ``buildah`` builds the project's ``Dockerfile``
with chroot isolation. The base is therefore made here: ``debootstrap`` bookworm, then a
``python:3.11-slim`` stand-in from ``tools/python-local.Containerfile`` (Debian's python3, the
host's CA bundle for pip). Both are cached in buildah's image store under a tag derived from
their inputs, so only the first build on a machine pays for them; ``buildah bud --layers`` caches
the Dockerfile's own layers too. Production builds use the real ``python:3.11-slim-bookworm``
pinned by digest instead (docs/install.md).

    python -m tools.image                      # runtime and catchup images: localhost/keyorder:dev, -catchup:dev
    python -m tools.image --target runtime     # only one
    python -m tools.image --base-only          # only the cached base

``make image`` tags the images ``:dev``; a release build (``make dist``, ``tools/dist.py``) tags them with
the project's version (``release_tag``: pyproject.toml's ``version``, the one version of the wheel, the
chart's ``appVersion`` and the image; ``tests/packaging/test_version.py``) and adds the OCI labels.
``tests/packaging/test_image.py`` builds and runs the images through this module.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_CONTAINERFILE = Path(__file__).resolve().parent / "python-local.Containerfile"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_IMAGE = f"localhost/keyorder-debian:{DEBIAN_SUITE}"
TARGETS = {"runtime": "localhost/keyorder:dev", "catchup": "localhost/keyorder-catchup:dev"}
"""Dockerfile target -> the local tag it is built as."""
LICENSE = "Apache-2.0"
"""The image's ``org.opencontainers.image.licenses`` (the Dockerfile sets the same; pyproject's ``license``)."""
STORE = Path("/var/lib/containers/storage")
PRUNE_ABOVE_BYTES = 20 * 1024**3
"""Each source change leaves about 2 GB of superseded layers; above this, they are pruned after a build
(the tagged bases stay, so the next build redoes only the Dockerfile's layers)."""

ENV = {**os.environ, "BUILDAH_ISOLATION": "chroot"}
"""chroot isolation: no user namespaces or runc/crun sandbox needed, which a VM or a CI container may lack."""


class ImageError(RuntimeError):
    """A build step failed; the message names the step and carries its output's tail."""


def _run(command: Sequence[str], what: str, timeout: float = 1800) -> str:
    try:
        done = subprocess.run(list(command), env=ENV, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise ImageError(f"{what}: no result within {timeout:.0f} s") from error
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise ImageError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def unavailable() -> str | None:
    """Why images cannot be built on this machine (``None`` when they can): names the missing part."""
    for tool in ("buildah", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian package {tool!r}; `make test` installs it as root)"
    if os.geteuid() != 0:
        return "buildah with chroot isolation and debootstrap need root here (no rootless storage is set up)"
    try:
        _run(["buildah", "info"], "buildah info", timeout=60)
    except ImageError as error:
        return f"buildah cannot run here: {error}"
    return None


def image_exists(name: str) -> bool:
    done = subprocess.run(["buildah", "inspect", "--type", "image", name], env=ENV, capture_output=True, check=False)
    return done.returncode == 0


def python_base_tag() -> str:
    """The stand-in's tag: a digest of what it is made from, so a changed recipe or CA bundle rebuilds it."""
    digest = hashlib.sha256(PYTHON_CONTAINERFILE.read_bytes())
    digest.update(HOST_CA_BUNDLE.read_bytes())
    digest.update(DEBIAN_IMAGE.encode())
    return f"localhost/keyorder-python:3.11-local-{digest.hexdigest()[:12]}"


def ensure_debian() -> str:
    """A minimal bookworm root filesystem as an image (debootstrap, about 25 s, once per machine)."""
    if image_exists(DEBIAN_IMAGE):
        return DEBIAN_IMAGE
    with tempfile.TemporaryDirectory(prefix="keyorder-rootfs-", dir="/var/tmp") as rootfs:
        _run(
            ["debootstrap", "--variant=minbase", DEBIAN_SUITE, rootfs, DEBIAN_MIRROR],
            f"debootstrap {DEBIAN_SUITE}",
        )
        container = _run(["buildah", "from", "scratch"], "buildah from scratch").strip()
        try:
            _run(["buildah", "copy", container, rootfs, "/"], "buildah copy (the root filesystem)")
            _run(["buildah", "config", "--cmd", "/bin/bash", container], "buildah config")
            _run(["buildah", "commit", "--rm", container, DEBIAN_IMAGE], "buildah commit")
        except BaseException:
            subprocess.run(["buildah", "rm", container], env=ENV, capture_output=True, check=False)
            raise
    return DEBIAN_IMAGE


def ensure_python_base() -> str:
    """The python:3.11-slim stand-in (cached by a tag derived from its inputs)."""
    tag = python_base_tag()
    if image_exists(tag):
        return tag
    debian = ensure_debian()
    with tempfile.TemporaryDirectory(prefix="keyorder-base-") as context:
        shutil.copy(HOST_CA_BUNDLE, Path(context) / "host-ca.crt")
        _run(
            [
                "buildah",
                "bud",
                "--quiet",
                "--build-arg",
                f"DEBIAN_IMAGE={debian}",
                "-f",
                str(PYTHON_CONTAINERFILE),
                "-t",
                tag,
                context,
            ],
            "building the local python base",
        )
    return tag


def project_version(root: Path = ROOT) -> str:
    """The project's one version: ``version`` in pyproject.toml (the wheel's; the chart's appVersion and
    ``keyorder.__version__`` must equal it, which tests/packaging/test_version.py checks)."""
    return str(tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"])


def release_tag(target: str, version: str | None = None) -> str:
    """The tag a release build of ``target`` gets: its ``:dev`` tag with the project's version instead."""
    if target not in TARGETS:
        raise ImageError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    repository = TARGETS[target].rpartition(":")[0]
    return f"{repository}:{version or project_version()}"


def oci_labels(version: str, source: str | None = None, revision: str | None = None) -> dict[str, str]:
    """The OCI annotations a release image carries (image-spec annotations.md): the version and licence
    always, the source repository's URL and the commit when they are known."""
    labels = {"org.opencontainers.image.version": version, "org.opencontainers.image.licenses": LICENSE}
    if source:
        labels["org.opencontainers.image.source"] = source
    if revision:
        labels["org.opencontainers.image.revision"] = revision
    return labels


def build(target: str, tag: str | None = None, labels: Mapping[str, str] | None = None, context: Path = ROOT) -> str:
    """Build one Dockerfile target of ``context`` on the local base (layers cached); returns its tag.
    ``labels`` are set on the image (``buildah bud --label``) on top of the Dockerfile's ``LABEL``s."""
    if target not in TARGETS:
        raise ImageError(f"unknown target {target!r}; expected one of {', '.join(TARGETS)}")
    base = ensure_python_base()
    tag = tag or TARGETS[target]
    label_flags = [flag for name, value in (labels or {}).items() for flag in ("--label", f"{name}={value}")]
    _run(
        [
            "buildah",
            "bud",
            "--quiet",
            "--layers",
            "--target",
            target,
            "--build-arg",
            f"PYTHON_IMAGE={base}",
            *label_flags,
            "-t",
            tag,
            str(context),
        ],
        f"building the {target} image",
    )
    return tag


def image_labels(name: str) -> dict[str, str]:
    """The labels in an image's OCI configuration (``buildah inspect``; its ``--format`` has no ``json``)."""
    output = _run(["buildah", "inspect", "--type", "image", name], f"buildah inspect {name}", timeout=60)
    return dict(json.loads(output)["OCIv1"]["config"].get("Labels") or {})


def store_bytes() -> int:
    done = subprocess.run(["du", "-sb", str(STORE)], capture_output=True, text=True, check=False)
    return int(done.stdout.split()[0]) if done.returncode == 0 and done.stdout else 0


def prune_if_large(limit: int = PRUNE_ABOVE_BYTES) -> bool:
    """Remove untagged (superseded or cached) images once the store outgrows ``limit``; True if it did."""
    if store_bytes() <= limit:
        return False
    _run(["buildah", "rmi", "--prune"], "pruning superseded image layers")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.image", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", action="append", choices=sorted(TARGETS), help="repeatable; default: all")
    parser.add_argument("--base-only", action="store_true", help="only build (or find) the cached local base")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason is not None:
        print(f"cannot build images: {reason}", file=sys.stderr)
        return 2
    try:
        print(ensure_python_base())
        if not args.base_only:
            for target in args.target or list(TARGETS):
                print(build(target))
            if prune_if_large():
                print("pruned superseded layers (the store had grown above 20 GB)")
    except ImageError as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
