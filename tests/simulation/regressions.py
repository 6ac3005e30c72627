"""Named regression plans (filled in below)."""

from __future__ import annotations

REGRESSIONS: dict = {}
