"""Regenerates the parts of the docs that are derived from code (``make docs``).

The settings tables of ``keyorder run`` (docs/configuration.md) and ``keyorder catchup``
(docs/catchup.md) come from their pydantic models; a test fails when the committed docs differ
from what this module would write, so the docs cannot silently drift from the code.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from pydantic import BaseModel

from keyorder.config import RunConfig, reference_markdown

END = "<!-- end of generated table -->"


def start_marker(model: type[BaseModel]) -> str:
    return (
        f"<!-- generated from {model.__module__}.{model.__name__}: `make docs` rewrites this table; "
        "a test fails on drift -->\n"
    )


def render_table(text: str, model: type[BaseModel]) -> str:
    start = start_marker(model)
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(END), re.DOTALL)
    if not pattern.search(text):
        raise ValueError(f"lost the generated-table markers of {model.__name__}")
    return pattern.sub(lambda _match: start + reference_markdown(model) + END, text)


def generated_tables() -> dict[str, type[BaseModel]]:
    from keyorder.catchup.settings import CatchupConfig

    return {"docs/configuration.md": RunConfig, "docs/catchup.md": CatchupConfig}


def main(root: Path = Path()) -> int:
    for relative, model in generated_tables().items():
        path = root / relative
        path.write_text(render_table(path.read_text(), model))
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
