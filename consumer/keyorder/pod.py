"""Composition root of a pod: turns a ``RunConfig`` into a running consumer with its HTTP port.

Keeping the wiring here (and only here) lets the CLI, the demo, the benchmark and the tests run
the very same pod, with only the handler and the stop signal differing.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from keyorder.adapters.cpu import pod_cpu_cores
from keyorder.adapters.dead_letters import KafkaDeadLetterSink
from keyorder.adapters.handlers import (
    check_input,
    is_async_callable,
    load_for_worker_process,
    load_handler,
    load_lifecycle,
)
from keyorder.adapters.http_server import PodHttpServer
from keyorder.adapters.kafka_source import KafkaSource
from keyorder.adapters.metrics import build_registry
from keyorder.config import (
    ConfigError,
    RunConfig,
    blame_kafka_property,
    consumer_properties,
    kafka_properties_with_origins,
    producer_properties,
    read_admin_token,
    redact,
)
from keyorder.contracts import DeadLetterError, DeadLetterSink, SourceError
from keyorder.core.flow import FlowLimits
from keyorder.core.retry import ExhaustedPolicy, RetryPolicy
from keyorder.engine.poll_loop import ConsumerRuntime, RuntimeSettings
from keyorder.engine.process_pool import ProcessWorkerPool
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions, ThreadWorkerPool, WorkerPool

log = logging.getLogger(__name__)


def runtime_settings(config: RunConfig) -> RuntimeSettings:
    """The poll loop's settings from a pod's configuration (the pod simulation builds its pods with it too)."""
    return RuntimeSettings(
        topics=tuple(config.topics),
        flow=FlowLimits(
            config.max_inflight,
            config.max_inflight_per_partition,
            config.max_uncommitted,
            config.resume_ratio,
            config.pause_after,
        ),
        poll_batch=config.poll_batch,
        commit_interval=config.commit_interval,
        revoke_drain_timeout=config.revoke_drain_timeout,
        shutdown_grace=config.shutdown_grace,
        max_workers=config.max_workers,
    )


class Pod:
    """One keyorder consumer process: runtime, workers, DLQ producer and HTTP server."""

    def __init__(
        self,
        config: RunConfig,
        handler: Callable[[Any], Any] | None = None,
        environ: Mapping[str, str] | None = None,
        serve_http: bool = True,
        dead_letters: DeadLetterSink | None = None,
    ) -> None:
        self.config = config
        self.completions = Completions()
        make_pool = self._pool_factory(config, handler)  # the handler first: a bad path is the likeliest mistake
        properties, origins = kafka_properties_with_origins(config, environ)
        admin_token = read_admin_token(config)  # now, so a bad file stops the start; the server re-reads it
        log.info("Kafka properties: %s", redact(properties))
        retry = config.retry_policy()
        if dead_letters is None and config.on_exhausted is ExhaustedPolicy.DLQ:
            try:
                dead_letters = KafkaDeadLetterSink(producer_properties(properties), config.dlq_topic)
            except DeadLetterError as error:  # built first: its errors would otherwise blame the DLQ alone
                raise blame_kafka_property(error, origins, "dead-letter producer") from error
        self._dead_letters = dead_letters
        self.pool = make_pool(retry, dead_letters)
        if self.pool.executor == "process" and config.workers > (cores := pod_cpu_cores()):
            log.warning(
                "%d worker processes on %.1f cores: a CPU-bound handler gains nothing from more processes than "
                "cores (keyorder_pod_cpu_cores)",
                config.workers,
                cores,
            )
        settings = runtime_settings(config)
        try:
            self.source = KafkaSource(consumer_properties(config, properties))
        except SourceError as error:
            raise blame_kafka_property(error, origins, "consumer") from error
        self.runtime = ConsumerRuntime(settings, self.source, self.pool, config.ordering, self.completions)
        self.source.on_commit_result = self.runtime.record_commit_outcomes
        self.registry = build_registry(self.runtime, self.pool)
        self.http = (
            PodHttpServer(
                self.runtime,
                self.registry,
                config.http_host,
                config.http_port,
                None if admin_token is None else functools.partial(read_admin_token, config),
            )
            if serve_http
            else None
        )

    def _pool_factory(
        self, config: RunConfig, handler: Callable[[Any], Any] | None
    ) -> Callable[[RetryPolicy, DeadLetterSink | None], WorkerPool]:
        """Load and check the handler and its hooks; the pool of the configured executor, given the
        retry policy and the dead-letter sink (``auto``: thread or async, by the handler).

        The process executor does not import the handler here (a model or a large library would sit in
        memory once more): each worker process does, and ``start`` reports a bad path."""
        if config.executor == "process":
            if handler is not None:
                raise ConfigError("the process executor imports the handler by its path (--handler) in each process")
            load = functools.partial(
                load_for_worker_process,
                config.handler,
                config.handler_setup,
                config.handler_teardown,
                config.log_level,
                config.log_format,
                config.gc_threshold,
                config.batch_limits().enabled,
            )
            return functools.partial(
                ProcessWorkerPool,
                load,
                config.workers,
                completions=self.completions,
                handler_timeout=config.handler_timeout,
                batch=config.batch_limits(),
            )
        function = handler if handler is not None else load_handler(config.handler).function
        check_input(config.handler, function, config.batch_limits().enabled)
        is_async = is_async_callable(function)
        if config.executor != "auto" and (config.executor == "async") != is_async:
            kind = "an async def" if is_async else "a plain"
            raise ConfigError(
                f"--executor {config.executor} / KEYORDER_EXECUTOR: the handler {config.handler!r} is {kind} "
                f"function; use --executor {'async' if is_async else 'thread'} or process"
            )
        lifecycle = load_lifecycle(config.handler_setup, config.handler_teardown, is_async)
        pool_type = AsyncWorkerPool if is_async else ThreadWorkerPool
        return functools.partial(
            pool_type,
            function,
            config.workers,
            completions=self.completions,
            lifecycle=lifecycle,
            batch=config.batch_limits(),
        )

    @property
    def http_port(self) -> int | None:
        return self.http.port if self.http else None

    def run(self, stop: threading.Event) -> None:
        """Consume until ``stop`` is set; returns after the graceful shutdown."""
        if self.http:
            self.http.start()
            log.info("metrics and health on http://%s:%d", self.config.http_host, self.http.port)
        try:
            self.runtime.run(stop)
        finally:
            if self._dead_letters is not None:
                self._dead_letters.close()
            if self.http:
                self.http.stop()

    def start_in_thread(self, stop: threading.Event) -> threading.Thread:
        """Run in a background thread (tests, demo, bench); waits until the loop has started."""
        thread = threading.Thread(target=self.run, args=(stop,), name="keyorder-poll", daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while not self.runtime.started.wait(0.05):
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the pod did not start")
        return thread
