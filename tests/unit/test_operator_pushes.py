"""The worker count is pushed only to the pods that need it: a steady poll pushes nothing."""

from __future__ import annotations

from keyorder_operator.pod_admin import ADDRESS, needing_push


def test_only_pods_at_another_count_or_without_a_report_are_pushed():
    reports = [{ADDRESS: "10.0.0.1", "workers": 8}, {ADDRESS: "10.0.0.2", "workers": 4}]
    addresses = ["10.0.0.1", "10.0.0.2", "10.0.0.3"]  # .3 is new (or did not answer)
    assert needing_push(addresses, reports, 8) == ["10.0.0.2", "10.0.0.3"]
    assert needing_push(addresses[:1], reports, 8) == []  # steady: nothing to push
    assert needing_push(addresses, [], 8) == addresses  # no report at all: push to every ready pod
