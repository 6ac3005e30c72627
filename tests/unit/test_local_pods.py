"""``LocalPods`` (the demo's stand-in for a Deployment): a scale-in returns at once, as a Deployment's does,
and a stopped process that fails its stop is still reported (it was forgotten once it had exited)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from keyorder.devtools import local_pods
from keyorder.devtools.local_pods import LocalPod, LocalPods
from tests.support import wait_for

pytestmark = pytest.mark.timeout(60)

ON_SIGTERM_EXIT = "import signal, sys; signal.signal(signal.SIGTERM, lambda *_: sys.exit({code}))"
IGNORE_SIGTERM = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)"


def stand_in(tmp_path: Path, name: str, script: str) -> LocalPod:
    """A process kept by ``LocalPods`` in place of ``keyorder run``, once ``script`` (its signal set-up) ran."""
    ready = f"{script}; print('ready', flush=True); import time; time.sleep(60)"
    process = subprocess.Popen(
        [sys.executable, "-c", ready], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    process.stdout.close()
    return LocalPod(process, 0, tmp_path / f"{name}.log")


def test_a_stopped_process_that_exits_with_an_error_on_sigterm_is_reported(tmp_path: Path) -> None:
    pods = LocalPods(tmp_path, {})
    pods.pods = [stand_in(tmp_path, "pod-1", ON_SIGTERM_EXIT.format(code=0))]
    pods.pods.append(stand_in(tmp_path, "pod-2", ON_SIGTERM_EXIT.format(code=3)))
    pods.pods.append(stand_in(tmp_path, "pod-3", "pass"))  # no handler yet (a pod still starting): -SIGTERM
    try:
        pods.scale(1)  # returns at once: pod-2 and pod-3 stop in the background
        assert pods.replicas == 1
        expected = ["pod-2.log: exit 3 on SIGTERM"]  # pod-3's -SIGTERM is a clean stop
        wait_for(lambda: pods.crashed() == expected and not pods.stopping, 30, "pod-2 and pod-3 to exit")  # hang guard
        assert pods.crashed() == expected, "reported on every call, not once"
    finally:
        pods.stop_all()


def test_a_stopped_process_past_its_grace_is_killed_and_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(local_pods, "STOP_GRACE_SECONDS", 0.2)
    pods = LocalPods(tmp_path, {})
    pods.pods = [stand_in(tmp_path, "pod-1", IGNORE_SIGTERM)]
    stubborn = pods.pods[0].process
    try:
        pods.scale(0)
        wait_for(lambda: pods.crashed(), 30, "the kill past the grace")  # hang guard
        assert pods.crashed() == ["pod-1.log: killed 0.2 s after SIGTERM"]
        assert stubborn.returncode == -9
    finally:
        pods.stop_all()
