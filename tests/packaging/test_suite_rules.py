"""The suite's own rules, checked on its source: no test asserts a duration, a rate or a latency.

Why: on a shared 2-core machine a timed assertion fails for a slow neighbour, not for a defect, and a
red CI must mean a defect. Speed is measured by ``keyorder bench`` and ``keyorder catchup-bench``
(docs/performance.md). A time bound may stay only as a hang guard, and then it says so: ``# hang
guard`` on the assertion or in the comment right above it (or a name containing ``hang_guard``),
so ``grep -rn "hang guard" tests`` lists them all. ``wait_for``/``wait_until`` timeouts are hang
guards by definition and are not asserts. An assertion that an event did not come too *soon* (a
scale-down not before its window ended, a first poll not before its moment) cannot fail for a slow
neighbour, since slowness only delays events: it says so with ``# event order`` and is allowed too.

What counts as timed: an ``assert`` that compares a clock reading (``time.monotonic()``,
``time.time()``, ``time.perf_counter()``), a name assigned one in the same function or a sum or
difference of those, or a name that says it is a measurement (``elapsed``, ``took``, ``duration``,
``throughput``).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CLOCKS = {("time", "monotonic"), ("time", "time"), ("time", "perf_counter")}
MEASUREMENT = re.compile(r"(^|_)(elapsed|took|duration|throughput)(_|$)")


def _is_time(expression: ast.AST, timed_names: set[str]) -> bool:
    """A clock reading, a name holding one, or sums and differences of them (``now - start``)."""
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Attribute):
        owner = expression.func.value
        return isinstance(owner, ast.Name) and (owner.id, expression.func.attr) in CLOCKS
    if isinstance(expression, ast.Name):
        return expression.id in timed_names or bool(MEASUREMENT.search(expression.id))
    if isinstance(expression, ast.BinOp) and isinstance(expression.op, ast.Add | ast.Sub):
        return _is_time(expression.left, timed_names) or _is_time(expression.right, timed_names)
    return False


def _compares_time(test: ast.AST, timed_names: set[str]) -> bool:
    for node in ast.walk(test):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_is_time(sub, timed_names) for operand in operands for sub in ast.walk(operand)):
                return True
    return False


def timed_assertions(path: Path) -> list[str]:
    """``path:line`` of every assert that compares a time and does not name itself a hang guard."""
    source = path.read_text()
    lines = source.splitlines()
    found = []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        timed: set[str] = set()
        for _ in range(2):  # names assigned a clock reading, then differences of those
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and _is_time(node.value, timed):
                    timed |= {target.id for target in node.targets if isinstance(target, ast.Name)}
        for node in ast.walk(function):
            if not isinstance(node, ast.Assert) or not _compares_time(node.test, timed):
                continue
            first = node.lineno - 1
            while first > 0 and lines[first - 1].strip().startswith("#"):  # the comment block right above
                first -= 1
            text = "\n".join(lines[first : (node.end_lineno or node.lineno)])
            if not any(marker in text for marker in ("hang guard", "hang_guard", "event order")):
                found.append(f"{path.relative_to(TESTS.parent)}:{node.lineno}: {lines[node.lineno - 1].strip()}")
    return found


def test_no_test_asserts_a_duration_except_as_a_named_hang_guard():
    offenders = [hit for path in sorted(TESTS.rglob("test_*.py")) for hit in timed_assertions(path)]
    assert not offenders, "timed assertions (move the figure to a benchmark, or name a hang guard):\n" + "\n".join(
        offenders
    )


def test_the_rule_catches_a_timed_assertion(tmp_path):
    """The checker itself can fail: a test that asserts a duration is found, a named hang guard is not."""
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import time\n"
        "def test_fast():\n"
        "    start = time.monotonic()\n"
        "    took = time.monotonic() - start\n"
        "    assert took < 0.5\n"
        "def test_guarded():\n"
        "    start = time.monotonic()\n"
        "    assert time.monotonic() - start < 60  # hang guard: the run must end\n"
        "def test_ordered():\n"
        "    start = time.monotonic()\n"
        "    # event order: not before the start\n"
        "    assert time.monotonic() >= start\n"
    )
    global TESTS
    saved, TESTS = TESTS, tmp_path.parent
    try:
        assert [hit.split(":")[1] for hit in timed_assertions(sample)] == ["5"]
    finally:
        TESTS = saved
