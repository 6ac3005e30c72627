"""``python -m keyorder.catchup [flags]``, and the application file for ``spark-submit``
(``.../site-packages/keyorder/catchup/__main__.py``): the same as ``keyorder catchup [flags]``."""

from __future__ import annotations

import sys

from keyorder.cli import main

if __name__ == "__main__":
    sys.exit(main(["catchup", *sys.argv[1:]]))
