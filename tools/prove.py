"""Show that a test can fail: run it against a build broken on purpose (a patch in ``tools/proofs/``).

A test of a promise is only worth its name if it fails when the promise is broken. Each
``tools/proofs/NAME.patch`` breaks exactly one promise, and ``tools/proofs/INDEX.md`` names the test
that must catch it. This applies the patch to a clean copy of ``HEAD`` (a temporary git worktree,
so the working tree is never touched), runs that one test there against the copy's code (it goes
first on ``PYTHONPATH``, ahead of the editable install, and the pods the test starts inherit it),
and reports whether the test failed, as it must. The patches live on ``main`` so they keep
applying as the code moves; one that no longer applies is reported, to be made again.

    .venv/bin/python -m tools.prove --list
    .venv/bin/python -m tools.prove broken-worker [NAME ...]
    .venv/bin/python -m tools.prove all        # every proof, one after the other (minutes)
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROOFS = ROOT / "tools" / "proofs"
ROW = re.compile(r"^\|\s*([\w-]+)\s*\|\s*`?([^|`]+?)`?\s*\|\s*(.+?)\s*\|\s*$")


def index() -> dict[str, tuple[str, str]]:
    """NAME -> (pytest node id, what the patch breaks), from ``tools/proofs/INDEX.md``."""
    proofs = {}
    for line in (PROOFS / "INDEX.md").read_text().splitlines():
        match = ROW.match(line)
        if match and match.group(1) not in ("proof",) and not set(match.group(1)) <= {"-"}:
            proofs[match.group(1)] = (match.group(2), match.group(3))
    return proofs


def prove(name: str, node: str, timeout: float) -> tuple[bool, str]:
    """Apply ``name``'s patch to a worktree of HEAD and run ``node`` there: ``(failed as it must, why)``."""
    patch = PROOFS / f"{name}.patch"
    if not patch.exists():
        return False, f"no {patch.relative_to(ROOT)}"
    with tempfile.TemporaryDirectory(prefix=f"keyorder-proof-{name}-") as parent:
        tree = Path(parent) / "tree"
        subprocess.run(["git", "worktree", "add", "-q", "--detach", str(tree), "HEAD"], cwd=ROOT, check=True)
        try:
            applied = subprocess.run(["git", "apply", str(patch)], cwd=tree, capture_output=True, text=True)
            if applied.returncode:
                return False, f"the patch no longer applies (make it again): {applied.stderr.strip()}"
            paths = [str(tree / "consumer"), str(tree / "operator"), str(tree)]
            environment = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
            try:
                run = subprocess.run(
                    [sys.executable, "-m", "pytest", node, "-n", "0", "-p", "no:cacheprovider", "-q", "-x"],
                    cwd=tree,
                    env=environment,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                return False, f"the test did not finish within {timeout:.0f} s"
            tail = [line[:200] for line in run.stdout.splitlines() if line.startswith(("E ", "FAILED", "ERROR"))][:3]
            if run.returncode == 1:
                return True, "; ".join(tail) or "failed"
            if run.returncode == 0:
                return False, "the test PASSED against the broken build"
            return False, f"pytest exited {run.returncode} (not a test failure): {run.stdout[-500:]}{run.stderr[-500:]}"
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=False)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.prove", description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", help="proofs to run (see --list), or 'all'")
    parser.add_argument("--list", action="store_true", help="list the proofs and their tests")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one test may take [default: 600]")
    args = parser.parse_args(argv)
    proofs = index()
    if args.list or not args.names:
        for name, (node, what) in proofs.items():
            print(f"{name:28} {node}\n{'':28} {what}")
        return 0
    names = list(proofs) if args.names == ["all"] else args.names
    unknown = [name for name in names if name not in proofs]
    if unknown:
        print(f"unknown proof(s): {', '.join(unknown)}; --list shows them")
        return 2
    failures = 0
    for name in names:
        print(f"{name}: running {proofs[name][0]} against the broken build ...", flush=True)
        proven, why = prove(name, proofs[name][0], args.timeout)
        failures += not proven
        print(f"  {'PROVEN: the test failed' if proven else 'NOT PROVEN'}: {why}", flush=True)
    print(f"{len(names) - failures} of {len(names)} proofs hold")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
