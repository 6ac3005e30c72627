"""The operator command's wiring decisions that need no cluster."""

from __future__ import annotations

from keyorder_operator.main import peering_priority


def test_peering_replicas_never_tie_unless_told() -> None:
    priorities = {peering_priority(None, "keyorder") for _ in range(20)}
    assert len(priorities) > 1 and all(priority > 0 for priority in priorities)  # ties pause every replica
    assert peering_priority(7, "keyorder") == 7
    assert peering_priority(None, None) == 0  # standalone: peering is off
