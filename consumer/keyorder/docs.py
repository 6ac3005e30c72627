"""Regenerates the parts of the docs that are derived from code (``make docs``).

The configuration table comes from ``RunConfig``; a test fails when the committed docs differ
from what this module would write, so the docs cannot silently drift from the code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from keyorder.config import reference_markdown

START = "<!-- generated from keyorder.config.RunConfig: `make docs` rewrites this table; a test fails on drift -->\n"
END = "<!-- end of generated table -->"


def render_configuration(text: str) -> str:
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError("docs/configuration.md lost its generated-table markers")
    return pattern.sub(lambda _match: START + reference_markdown() + END, text)


def main(root: Path = Path()) -> int:
    path = root / "docs" / "configuration.md"
    path.write_text(render_configuration(path.read_text()))
    print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
