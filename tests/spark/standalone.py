"""A real Spark standalone cluster on loopback: one master and workers in their own JVMs.

Started from the installed pyspark's ``bin/spark-class`` (no download), every process bound to
127.0.0.1 (``--host`` and ``SPARK_LOCAL_IP``: without them a worker registers on a non-loopback
address), on free ports, and stopped by PID. Executors then run in the workers' JVMs with their
own Python workers, which is what a real cluster does to the handler, its environment and its
Kafka configuration.

The cluster requires Spark authentication, as a secured one does (docs/security.md, "Catch-up's Spark
traffic"): master and workers read ``spark.authenticate`` and the cluster's ``secret`` from a
properties file only this user can read; the workers hand the secret to the executors they launch,
and an application connects only with the same secret (``spark.authenticate.secret``).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

import pyspark

from tests.support import free_port

SPARK_HOME = Path(pyspark.__file__).parent


def spark_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of the cluster's processes: loopback only, no PYTHONPATH leaking the repo in."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PYSPARK", "SPARK_", "PYTHON")) and name != "KEYORDER_TEST_RECORD_DIR"
    }
    env.update({"SPARK_HOME": str(SPARK_HOME), "SPARK_LOCAL_IP": "127.0.0.1", **(extra or {})})
    return env


class StandaloneCluster:
    """``with StandaloneCluster(workers=2, log_dir=...) as cluster: cluster.master_url``."""

    def __init__(self, log_dir: Path, workers: int = 2, cores: int = 1, memory: str = "1g") -> None:
        self.log_dir = log_dir
        self.workers = workers
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.master_url = f"spark://127.0.0.1:{self.port}"
        self.processes: list[subprocess.Popen] = []
        self.secret = secrets.token_hex(32)
        """The secret master, workers and applications share: give it as spark.authenticate.secret."""
        self.properties = log_dir / "spark-daemons.conf"

    def _start(self, name: str, *args: str) -> None:
        log = open(self.log_dir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process below
        process = subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=spark_env(),
            start_new_session=True,
        )
        process.log = log  # type: ignore[attr-defined]
        self.processes.append(process)

    def state(self) -> dict:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as response:
            return json.loads(response.read())

    def alive_workers(self) -> list[dict]:
        try:
            return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]
        except OSError:
            return []

    def __enter__(self) -> StandaloneCluster:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(self.properties, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as properties:
            properties.write(f"spark.authenticate true\nspark.authenticate.secret {self.secret}\n")
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--properties-file",
            str(self.properties),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for index in range(self.workers):
            self._start(
                f"worker-{index}",
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--properties-file",
                str(self.properties),
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
                "--cores",
                str(self.cores),
                "--memory",
                self.memory,
                "--work-dir",
                str(self.log_dir / f"work-{index}"),
            )
        deadline = time.monotonic() + 90
        while len(self.alive_workers()) < self.workers:
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                self.__exit__(None, None, None)
                logs = "\n".join(
                    (self.log_dir / f).read_text()[-1500:] for f in os.listdir(self.log_dir) if f.endswith(".log")
                )
                raise RuntimeError(f"the standalone cluster did not start with {self.workers} workers:\n{logs}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc: object) -> None:
        for process in reversed(self.processes):  # workers first, then the master
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
            process.log.close()  # type: ignore[attr-defined]
        self.processes.clear()
