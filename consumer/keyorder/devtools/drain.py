"""Reading a drain time from lag samples, the same way for every group the demo compares.

A group's spike is drained when its committed total reaches the spike's end. Groups are sampled at
different intervals (the autoscaled group every poll, a static one every 0.25 s), so the moment is
interpolated between the two samples around it rather than taken at the sample that saw it.
"""

from __future__ import annotations

from typing import Any


def crossing_seconds_before(previous: Any, sample: Any, threshold: int) -> float:
    """Seconds before ``sample`` at which the committed total crossed ``threshold``, interpolated
    linearly from ``previous`` (0 without one). Both groups' drain times are read this way, so one
    polled every 2 s and one sampled every 0.25 s are not judged by their sampling intervals."""
    if previous is None or sample.committed_total <= previous.committed_total:
        return 0.0
    beyond = (sample.committed_total - threshold) / (sample.committed_total - previous.committed_total)
    return min(max(beyond, 0.0), 1.0) * max(sample.at - previous.at, 0.0)
