"""A local-process stand-in for the operator's Deployment: ``keyorder run`` subprocesses.

``keyorder dev`` drives these with the operator's own policy (``keyorder_operator.policy``) and
the operator's own worker push (``keyorder_operator.pod_admin``), so the laptop demo exercises the
same scaling code as the cluster, only with processes instead of pods. Scale-in sends SIGTERM
(the pod then finishes its in-flight work and commits, as in Kubernetes).
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


@dataclass
class LocalPod:
    process: subprocess.Popen
    port: int
    log_path: Path


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
        """Start or stop processes (newest first) until ``replicas`` run."""
        while len(self.pods) < replicas:
            self.pods.append(self._start())
        while len(self.pods) > replicas:
            self._stop(self.pods.pop())

    @staticmethod
    def _stop(pod: LocalPod, timeout: float = 40.0) -> None:
        if pod.process.poll() is None:
            pod.process.send_signal(signal.SIGTERM)
            try:
                pod.process.wait(timeout)
            except subprocess.TimeoutExpired:
                pod.process.kill()
                pod.process.wait(10)

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
        return [f"127.0.0.1:{pod.port}" for pod in ready]

    def crashed(self) -> list[str]:
        return [
            f"{pod.log_path.name}: exit {pod.process.returncode}" for pod in self.pods if pod.process.poll() is not None
        ]

    def stop_all(self) -> None:
        for pod in self.pods:
            if pod.process.poll() is None:
                pod.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 40
        for pod in self.pods:
            try:
                pod.process.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                pod.process.kill()
                pod.process.wait(10)
        self.pods.clear()
