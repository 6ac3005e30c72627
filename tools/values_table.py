"""The chart's values table, generated from the `# --` comments in values.yaml.

Every key in values.yaml carries a `# -- description` comment (continued by plain `#` lines).
A key whose children have no comments of their own is one value (its default is shown whole, as
``podSecurityContext`` is). ``README.md`` of the chart holds the table between markers; rewrite it:

    .venv/bin/python -m tools.values_table

and a test fails when the table is stale or a key has no comment.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[1] / "charts" / "keyorder-operator"
START = "<!-- generated from values.yaml comments by `python -m tools.values_table`; a test fails on drift -->\n"
END = "<!-- end of generated values table -->"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z_][\w-]*):")


@dataclass
class Entry:
    path: str
    description: str | None
    line: int


def entries(text: str) -> list[Entry]:
    """Every mapping key of values.yaml with its dotted path and its `# --` comment (or None)."""
    result: list[Entry] = []
    stack: list[tuple[int, str]] = []
    comment: list[str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment = [stripped[4:].strip()]
            continue
        if stripped.startswith("#") and comment is not None:
            comment.append(stripped[1:].strip())
            continue
        match = KEY.match(line)
        if not match:
            if not stripped:
                comment = None
            continue
        indent = len(match.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = ".".join([name for _, name in stack] + [match.group("key")])
        result.append(Entry(path, " ".join(comment) if comment else None, number))
        stack.append((indent, match.group("key")))
        comment = None
    return result


def _lookup(values: dict, path: str):
    node = values
    for name in path.split("."):
        node = node[name]
    return node


def documented_values(text: str) -> list[Entry]:
    """The rows of the table: commented keys with no commented children (leaves or whole blocks)."""
    all_entries = entries(text)
    commented = [entry for entry in all_entries if entry.description]
    return [entry for entry in commented if not any(other.path.startswith(entry.path + ".") for other in commented)]


def undocumented(text: str) -> list[str]:
    """Keys without a comment that are not inside a value documented as a whole."""
    all_entries = entries(text)
    rows = {entry.path for entry in documented_values(text)}
    missing = []
    for entry in all_entries:
        if entry.description is None and not any(entry.path.startswith(row + ".") for row in rows):
            missing.append(f"line {entry.line}: {entry.path}")
    return missing


def table(text: str) -> str:
    """One row per value; a group of values (e.g. ``monitoring.podMonitor``) gets a row without a default."""
    values = yaml.safe_load(text)
    rows = {entry.path for entry in documented_values(text)}
    lines = ["| value | default | description |", "|---|---|---|"]
    for entry in entries(text):
        if not entry.description:
            continue
        default = f"`{json.dumps(_lookup(values, entry.path), separators=(', ', ': '))}`" if entry.path in rows else ""
        description = entry.description.replace("|", "\\|")
        lines.append(f"| `{entry.path}` | {default} | {description} |")
    return "\n".join(lines) + "\n"


def render_readme(readme: str, values_text: str) -> str:
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(readme):
        raise ValueError("charts/keyorder-operator/README.md lost its generated-table markers")
    return pattern.sub(lambda _match: START + table(values_text) + END, readme)


def main() -> int:
    readme = CHART / "README.md"
    readme.write_text(render_readme(readme.read_text(), (CHART / "values.yaml").read_text()))
    print(f"updated {readme}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
