"""Fixtures for operator tests: kmock's Kubernetes emulator on a free port, served from its own thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.operator.emulator import Emulator, older_crd, register_crd
from tests.operator.harness import RunningEmulator, serve_emulator


def fail_on_refusals(refused: list[dict]) -> None:
    if refused:
        lines = [
            f"{r['method']} {r['path']} -> verb {r['verb']!r} on {r['group'] or 'core'}/{r['resource']}"
            f"{' in ' + r['namespace'] if r['namespace'] else ' (cluster scope)'}: {r['message']}"
            for r in refused
        ]
        pytest.fail(f"the chart's RBAC refused {len(refused)} request(s) of the operator:\n" + "\n".join(lines))


@pytest.fixture
def kube() -> Iterator[RunningEmulator]:
    """A fresh emulator (built-in resources + the OrderedConsumer CRD) with JSON helpers; stopped at teardown.

    ``kube.url`` is the API address (pass it to ``run_kopf``); ``kube.create/get/list/patch/delete`` talk
    to it over HTTP from the test thread, as an admin; ``kube.emulator`` is the kmock object (touch it only
    through ``kube.call_in_loop``). The operator's requests (``run_kopf``, ``api_client``, a kubeconfig from
    ``write_kubeconfig``) are authorised by the Helm chart's RBAC: any it refused fails the test at teardown,
    with each refused request (method, path, verb, resource), for the chart to grant it or the operator to
    stop making it.
    """
    with serve_emulator() as running:
        yield running
        refused = running.refused()
    fail_on_refusals(refused)


@pytest.fixture
def kube_older_crd() -> Iterator[RunningEmulator]:
    """As ``kube``, but the OrderedConsumer CRD is ``emulator.older_crd()`` (no CEL rules, no name constraints):
    for a test of what the operator does with a spec the current CRD would refuse."""

    def with_older_crd(emulator: Emulator) -> None:
        register_crd(emulator, older_crd())

    with serve_emulator(with_older_crd) as running:
        yield running
        refused = running.refused()
    fail_on_refusals(refused)
