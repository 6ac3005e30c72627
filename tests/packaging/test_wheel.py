"""The wheel ships exactly the project's packages: ``keyorder``, ``keyorder_operator``, ``keyorder_example``.

Builds the real wheel with pip (from a copy of the sources, so the checkout stays clean) and lists
its top-level entries. Without the explicit package list in pyproject.toml, setuptools' namespace
discovery also shipped ``examples/handler`` as a stray top-level ``handler`` package.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_wheel_ships_only_the_project_packages(tmp_path: Path) -> None:
    source = tmp_path / "source"
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for folder in ("consumer", "operator", "examples"):
        shutil.copytree(ROOT / folder, source / folder, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", str(tmp_path / "dist"),
         str(source)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    (wheel,) = (tmp_path / "dist").glob("keyorder-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(".dist-info")}
    assert top_level == {"keyorder", "keyorder_operator", "keyorder_example"}
    assert "keyorder/core/lanes.py" in names and "keyorder/devtools/bench.py" in names, "subpackages are shipped"
    assert "keyorder_operator/kubernetes_types.json" in names, "`keyorder crd` needs the embedded Kubernetes schemas"
    assert not any(name.startswith(("tests/", "tools/")) for name in names)
