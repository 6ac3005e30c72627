"""A one-line progress display for long-running commands (``dev``, ``bench``).

On a terminal the line is rewritten in place; in CI logs (not a TTY) it is printed as a new line
at most every few seconds, so logs stay readable.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, interval: float = 2.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.interval = interval
        self._last = 0.0

    def show(self, text: str, force: bool = False) -> None:
        now = time.monotonic()
        if self.tty:
            self.stream.write("\r\033[K" + text)
            self.stream.flush()
        elif force or now - self._last >= self.interval:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last = now

    def done(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
