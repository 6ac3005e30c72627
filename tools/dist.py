"""Build keyorder's release artefacts together, from one version, and check each (``make dist``).

A release is four artefacts that must agree: the wheel and the sdist (PyPI), the Helm chart (its
``appVersion`` is the image tag it installs) and the image. Built one by one, by hand, they drift: a chart
packaged from an edited tree, an image without its version, a wheel whose metadata misses a dependency
and only fails on a user's machine. This builds all of them from a clean checkout of ``HEAD`` (a
temporary git worktree, so uncommitted changes never slip into a release and the working tree is never
touched), with the one version of pyproject.toml (tests/packaging/test_version.py keeps the others equal
to it), and checks each the way its user will meet it:

- the wheel and sdist (``python -m build``: the sdist first, the wheel built from it) -> the wheel
  installs into a clean venv, dependencies from the index, and ``keyorder --version`` prints the version;
- the chart (Helm's own packaging, ``helm_python.package``) -> the packaged ``.tgz`` renders with the
  real Helm engine (``helm template`` of the archive) and installs the image of that version;
- the runtime and catch-up images (``tools/image.py``, buildah) -> tagged with the version and carrying
  the OCI labels (``org.opencontainers.image.version``, ``.licenses``, ``.revision``, and ``.source`` when a
  source URL is known), read back with ``buildah inspect``.

The files land in ``dist/`` (emptied first; gitignored); the images stay in buildah's local store under
``localhost/keyorder:VERSION`` and ``localhost/keyorder-catchup:VERSION``, to push from there. Images need
root and buildah (``make`` installs it as root); without them this stops and says so, as a release
without its image is not a release.

    python -m tools.dist                                   # everything (make dist)
    python -m tools.dist --source-url https://github.com/OWNER/keyorder
    python -m tools.dist --skip-image                      # wheel, sdist and chart only (no root needed)
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml

from tools import image

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
CHART = Path("charts") / "keyorder-operator"
"""The chart, relative to the checkout."""
RELEASE, NAMESPACE = "keyorder", "keyorder-system"
"""The release and namespace the packaged chart is rendered for (as the install guide names them)."""


class DistError(RuntimeError):
    """A build or a check failed; the message names the artefact and what was wrong."""


def say(message: str) -> None:
    print(f"dist: {message}", flush=True)


def _run(command: Sequence[str], what: str, cwd: Path | None = None, timeout: float = 1800) -> str:
    try:
        done = subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as error:
        raise DistError(f"{what}: no result within {timeout:.0f} s") from error
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise DistError(f"{what} failed (exit {done.returncode}):\n{tail}")
    return done.stdout


def _git(*arguments: str) -> str:
    return _run(["git", *arguments], f"git {' '.join(arguments)}", cwd=ROOT, timeout=120).strip()


def source_url(given: str | None) -> str | None:
    """The repository's URL for ``org.opencontainers.image.source``: the flag, else the ``origin`` remote's
    URL when it is one (``https://...``); None when neither is known."""
    if given:
        return given
    remote = subprocess.run(
        ["git", "remote", "get-url", "origin"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    url = remote.stdout.strip() if remote.returncode == 0 else ""
    return url.removesuffix(".git") if url.startswith(("https://", "http://")) else None


@contextmanager
def clean_checkout(revision: str) -> Iterator[Path]:
    """A temporary git worktree of ``revision`` (removed afterwards): what a fresh clone would hold."""
    with tempfile.TemporaryDirectory(prefix="keyorder-dist-") as parent:
        tree = Path(parent) / "tree"
        _git("worktree", "add", "--quiet", "--detach", str(tree), revision)
        try:
            yield tree
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def build_python(tree: Path, version: str) -> tuple[Path, Path]:
    """The sdist, then the wheel built from it (``python -m build``), into ``dist/``."""
    if importlib.util.find_spec("build") is None:
        raise DistError("python -m build is not installed: `make dist` installs it (the `test` extra)")
    _run([sys.executable, "-m", "build", "--outdir", str(DIST), str(tree)], "python -m build (sdist, then wheel)")
    wheels = sorted(DIST.glob(f"keyorder-{version}-*.whl"))
    sdists = sorted(DIST.glob(f"keyorder-{version}.tar.gz"))
    if len(wheels) != 1 or len(sdists) != 1:
        found = ", ".join(path.name for path in sorted(DIST.iterdir())) or "nothing"
        raise DistError(f"expected one keyorder-{version} wheel and sdist in dist/, found: {found}")
    with zipfile.ZipFile(wheels[0]) as wheel, tarfile.open(sdists[0]) as sdist:
        if f"keyorder-{version}.dist-info/licenses/LICENSE" not in wheel.namelist():
            raise DistError(f"{wheels[0].name} carries no LICENSE (pyproject's license-files)")
        if f"keyorder-{version}/LICENSE" not in sdist.getnames():
            raise DistError(f"{sdists[0].name} carries no LICENSE")
    return wheels[0], sdists[0]


def check_wheel(wheel: Path, version: str) -> None:
    """Install the wheel into a fresh venv (its dependencies from the index) and run ``keyorder --version``."""
    with tempfile.TemporaryDirectory(prefix="keyorder-dist-venv-") as venv:
        _run([sys.executable, "-m", "venv", venv], "creating a clean venv", timeout=300)
        python = Path(venv) / "bin" / "python"
        _run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)],
            f"pip install {wheel.name} into a clean venv",
        )
        printed = _run([str(Path(venv) / "bin" / "keyorder"), "--version"], "keyorder --version", timeout=120)
    if printed.strip() != f"keyorder {version}":
        raise DistError(
            f"the installed wheel's `keyorder --version` printed {printed.strip()!r}, not 'keyorder {version}'"
        )


def build_chart(tree: Path) -> Path:
    """``helm package`` of the chart, into ``dist/``."""
    import helm_python

    try:
        return Path(helm_python.package(tree / CHART, destination=DIST))
    except helm_python.HelmError as error:
        raise DistError(f"helm package {CHART} failed: {error}") from error


def check_chart(archive: Path, version: str) -> int:
    """Render the packaged chart (``helm template`` of the ``.tgz``) with its defaults; returns the number
    of manifests. Its appVersion and the operator's image must be the version."""
    import helm_python

    try:
        with helm_python.Chart.load(archive) as chart:
            app_version = chart.metadata.get("appVersion")
            rendered = chart.render({}, name=RELEASE, namespace=NAMESPACE)
    except helm_python.HelmError as error:
        raise DistError(f"the packaged chart {archive.name} does not render: {error}") from error
    if app_version != version:
        raise DistError(f"the packaged chart's appVersion is {app_version!r}, not {version!r}")
    manifests = [
        document
        for path, text in rendered.items()
        if not path.endswith("NOTES.txt")
        for document in yaml.safe_load_all(text)
        if document
    ]
    images = {
        container["image"]
        for manifest in manifests
        if manifest.get("kind") == "Deployment"
        for container in manifest["spec"]["template"]["spec"]["containers"]
    }
    if images != {f"keyorder:{version}"}:
        raise DistError(f"the packaged chart's Deployment runs {sorted(images)}, not keyorder:{version}")
    return len(manifests)


def build_and_check_images(tree: Path, version: str, labels: dict[str, str]) -> list[str]:
    """Build each image target from the clean checkout, tagged with the version and labelled; check the
    labels on the built image. Returns the tags."""
    reason = image.unavailable()
    if reason is not None:
        raise DistError(f"cannot build the images: {reason} (--skip-image builds the rest)")
    tags = []
    for target in image.TARGETS:
        started = time.monotonic()
        try:
            tag = image.build(target, image.release_tag(target, version), labels=labels, context=tree)
            found = image.image_labels(tag)
        except image.ImageError as error:
            raise DistError(str(error)) from error
        wrong = {name: found.get(name) for name, value in labels.items() if found.get(name) != value}
        if wrong:
            raise DistError(f"{tag} lacks the labels it was built with: {wrong} (wanted {labels})")
        say(f"image {tag}: built in {time.monotonic() - started:.0f} s; labels checked: {', '.join(sorted(labels))}")
        tags.append(tag)
    return tags


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.dist", description=__doc__.split("\n\n")[0])
    parser.add_argument("--source-url", help="org.opencontainers.image.source (default: the origin remote's URL)")
    parser.add_argument("--skip-image", action="store_true", help="build and check the wheel, sdist and chart only")
    args = parser.parse_args(argv)
    try:
        version = image.project_version(ROOT)
        revision = _git("rev-parse", "HEAD")
        changed = _git("status", "--porcelain", "--untracked-files=no").splitlines()
        say(f"keyorder {version} from HEAD {revision[:12]} (a clean checkout; the working tree is not used)")
        if changed:
            say(f"note: {len(changed)} uncommitted change(s) in the working tree are NOT in these artefacts")
        if DIST.exists():
            shutil.rmtree(DIST)
        DIST.mkdir()
        with clean_checkout(revision) as tree:
            wheel, sdist = build_python(tree, version)
            say(f"built {sdist.name} and {wheel.name} (from the sdist), each with the LICENSE")
            check_wheel(wheel, version)
            say(f"checked {wheel.name}: installs into a clean venv; `keyorder --version` prints 'keyorder {version}'")
            archive = build_chart(tree)
            count = check_chart(archive, version)
            say(f"checked {archive.name}: renders {count} manifests; the operator runs keyorder:{version}")
            tags: list[str] = []
            if args.skip_image:
                say("images skipped (--skip-image)")
            else:
                source = source_url(args.source_url)
                if source is None:
                    say("note: no source URL (no --source-url, no https origin remote): no ...image.source label")
                tags = build_and_check_images(tree, version, image.oci_labels(version, source, revision))
    except DistError as error:
        print(f"dist: FAILED: {error}", file=sys.stderr)
        return 1
    for path in sorted(DIST.iterdir()):
        say(f"{path.relative_to(ROOT)}  sha256:{_sha256(path)}")
    for tag in tags:
        say(f"image {tag} (buildah's local store: `buildah push {tag} docker://REGISTRY/...`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
