"""Fixtures for operator tests: kmock's Kubernetes emulator on a free port, served from its own thread."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.operator.harness import RunningEmulator, serve_emulator


@pytest.fixture
def kube() -> Iterator[RunningEmulator]:
    """A fresh emulator (built-in resources + the OrderedConsumer CRD) with JSON helpers; stopped at teardown.

    ``kube.url`` is the API address (pass it to ``run_kopf``); ``kube.create/get/list/patch/delete`` talk
    to it over HTTP from the test thread; ``kube.emulator`` is the kmock object (touch it only through
    ``kube.call_in_loop``).
    """
    with serve_emulator() as running:
        yield running
