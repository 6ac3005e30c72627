"""A local-process stand-in for the operator's Deployment: ``keyorder run`` subprocesses.

``keyorder dev`` drives these with the operator's own policy (``keyorder_operator.policy``) and
the operator's own worker push (``keyorder_operator.pod_admin``), so the laptop demo exercises the
same scaling code as the cluster, only with processes instead of pods. Scale-in sends SIGTERM
(the pod then finishes its in-flight work and commits, as in Kubernetes) and returns at once, as a
Deployment's scale does: the stopping processes are waited for (and killed past their grace) in the
background of later calls, so a scale-in never holds up the caller's next poll.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from keyorder.devtools.embedded import free_port

STOP_GRACE_SECONDS = 40.0
"""How long a stopping process may finish its in-flight work and commit before it is killed (SIGKILL)."""


@dataclass
class LocalPod:
    process: subprocess.Popen
    port: int
    log_path: Path
    kill_at: float | None = None
    """Set when it was sent SIGTERM: the ``time.monotonic()`` after which it is killed."""

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class LocalPods:
    """A group of ``keyorder run`` processes sharing a configuration, scaled by ``scale(n)``."""

    def __init__(self, workdir: Path, settings: Mapping[str, str], name: str = "pod") -> None:
        self.workdir = workdir
        self.settings = dict(settings)
        self.name = name
        self.token = secrets.token_urlsafe(24)
        self.token_file = workdir / f"{name}-admin-token"
        self.token_file.write_text(self.token)
        self.token_file.chmod(0o600)
        self.pods: list[LocalPod] = []
        self.stopping: list[LocalPod] = []
        """Sent SIGTERM by a scale-in, not yet exited."""
        self.failed_stops: list[str] = []
        """Stopped processes that exited with an error on their SIGTERM, or were killed past their grace."""
        self._started = 0

    @property
    def replicas(self) -> int:
        return len(self.pods)

    def _start(self) -> LocalPod:
        port = free_port()
        self._started += 1
        log_path = self.workdir / f"{self.name}-{self._started}.log"
        environment = {
            **os.environ,
            **self.settings,
            "KEYORDER_HTTP_PORT": str(port),
            "KEYORDER_HTTP_HOST": "127.0.0.1",
            "KEYORDER_ADMIN_TOKEN_FILE": str(self.token_file),
        }
        with log_path.open("w") as log_file:
            process = subprocess.Popen(
                [sys.executable, "-m", "keyorder.cli", "run"],
                env=environment,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        return LocalPod(process, port, log_path)

    def scale(self, replicas: int) -> None:
        """Start processes, or send the newest ones SIGTERM, until ``replicas`` run; does not wait for the
        stopping ones (``reap`` does, and ``stop_all``)."""
        while len(self.pods) < replicas:
            self.pods.append(self._start())
        while len(self.pods) > replicas:
            pod = self.pods.pop()
            if pod.process.poll() is None:
                pod.process.send_signal(signal.SIGTERM)
            pod.kill_at = time.monotonic() + STOP_GRACE_SECONDS
            self.stopping.append(pod)
        self.reap()

    def reap(self) -> None:
        """Forget the stopping processes that exited, noting in ``failed_stops`` those that exited with an
        error; kill those past their grace (noted too)."""
        for pod in list(self.stopping):
            code = pod.process.poll()
            if code is None and pod.kill_at is not None and time.monotonic() > pod.kill_at:
                pod.process.kill()
                pod.process.wait(10)
                self.failed_stops.append(f"{pod.log_path.name}: killed {STOP_GRACE_SECONDS:g} s after SIGTERM")
                self.stopping.remove(pod)
            elif code is not None:
                if code not in (0, -signal.SIGTERM):  # -SIGTERM: stopped before it set its handler (starting)
                    self.failed_stops.append(f"{pod.log_path.name}: exit {code} on SIGTERM")
                self.stopping.remove(pod)

    def addresses(self) -> set[str]:
        """``127.0.0.1:<port>`` of the processes kept by the last ``scale`` (ready or not)."""
        return {pod.address for pod in self.pods}

    def ready_addresses(self) -> list[str]:
        """``127.0.0.1:<port>`` of the processes whose ``/readyz`` answers 200."""
        ready = []
        for pod in self.pods:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{pod.port}/readyz", timeout=1) as response:
                    if json.loads(response.read()).get("status") == "ready":
                        ready.append(pod)
            except OSError:
                continue
        return [pod.address for pod in ready]

    def crashed(self) -> list[str]:
        """The kept processes that exited, and the stopped ones that failed their stop (``failed_stops``)."""
        self.reap()
        dead = [
            f"{pod.log_path.name}: exit {pod.process.returncode}" for pod in self.pods if pod.process.poll() is not None
        ]
        return dead + self.failed_stops

    def stop_all(self, grace: float | None = None) -> None:
        """SIGTERM to every process, and wait for all of them (the stopping ones too), killing those past
        their grace (``STOP_GRACE_SECONDS``, or ``grace`` for a group whose last commits do not matter)."""
        for pod in self.pods:
            if pod.process.poll() is None:
                pod.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + (STOP_GRACE_SECONDS if grace is None else grace)
        for pod in [*self.pods, *self.stopping]:
            try:
                pod.process.wait(max(min(deadline, pod.kill_at or deadline) - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pod.process.kill()
                pod.process.wait(10)
        self.pods.clear()
        self.stopping.clear()
