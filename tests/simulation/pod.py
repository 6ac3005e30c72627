"""One simulated pod: the real runtime and pool of a ``RunConfig``, on the simulation and its broker.

The composition mirrors ``keyorder.pod.Pod`` (``runtime_settings(config)``, the pool of the
configured executor with the retry policy and the dead-letter sink, the source wired to
``poll_loop.record_commit_outcomes``), with the simulation's seams in place of the real world: the
pools and ``Completions`` take their threads, locks, conditions and events from the simulation
(``threads=``), the runtime and pools its clock and sleep, the process executor its simulated
worker processes (``processes.child_factory``), and the source is a ``SimulatedSource`` built from
the consumer properties ``config.consumer_properties`` gives, which is also where keyorder refuses
a configuration it cannot run safely.

A pod session ends in one of three ways: its poll loop returns after ``stop`` is set (SIGTERM), it
raises (a fatal source error: the pod exits and is restarted), or ``crash`` stops every one of its
threads and worker processes where they are (SIGKILL: nothing more runs, nothing is committed or
left; the broker notices when the session times out).
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from keyorder.config import RunConfig, consumer_properties, kafka_properties
from keyorder.contracts import SourceError
from keyorder.engine.poll_loop import ConsumerRuntime
from keyorder.engine.process_pool import ProcessWorkerPool
from keyorder.engine.worker_pools import AsyncWorkerPool, Completions, ThreadWorkerPool, WorkerPool
from keyorder.pod import runtime_settings
from tests.simulation.broker import SimulatedBroker, SimulatedSource
from tests.simulation.eventloop import event_loop_factory
from tests.simulation.processes import SimulatedChild, child_factory, loading_for
from tests.simulation.scheduler import SimThread, Simulation, Terminated
from tests.simulation.workload import (
    Journal,
    Plan,
    SimulatedDeadLetters,
    make_async_batch_handler,
    make_async_handler,
    make_batch_handler,
    make_handler,
)


class PodThreads:
    """The simulation's Threads kit for one pod, remembering every thread the pod starts (to check that
    none is left behind, and to stop them all on a crash)."""

    def __init__(self, simulation: Simulation, prefix: str) -> None:
        self.simulation = simulation
        self.prefix = prefix
        self.started: list[SimThread] = []
        self.Lock = simulation.Lock
        self.Condition = simulation.Condition
        self.Event = simulation.Event

    def Thread(self, *args: Any, name: str | None = None, **kwargs: Any) -> SimThread:
        thread = self.simulation.Thread(*args, name=f"{self.prefix}/{name or 'thread'}", **kwargs)
        self.started.append(thread)
        return thread


@dataclass
class Ending:
    """How and when a pod session ended."""

    at: float
    how: str
    """``stopped`` (after SIGTERM), ``exited`` (its loop raised) or ``crashed`` (SIGKILL)."""
    error: BaseException | None = None
    lanes_left: int = 0
    """Deliveries still queued in the lanes, not running: ``stop`` hands back everything queued, so none should be.
    (A head still running when ``stop`` gave up, its worker past the grace inside the handler or its dead-letter
    write, cancelled on asyncio, is abandoned by design: the pod says so, and the commit stays below it.)"""
    threads_left: list[str] = field(default_factory=list)
    processes_left: list[int] = field(default_factory=list)


class SimPod:
    """One pod session: its runtime, pool, source and stop signal."""

    def __init__(
        self,
        simulation: Simulation,
        broker: SimulatedBroker,
        journal: Journal,
        plan: Plan,
        config: RunConfig,
        session: int,
        generation: int = 0,
    ) -> None:
        self.simulation = simulation
        self.config = config
        self.session = session
        self.name = f"pod{session}"
        properties = consumer_properties(config, kafka_properties(config, environ={}))
        if generation and properties.get("group.instance.id"):  # a rolling restart's new pod has a new name
            properties["group.instance.id"] = f"{properties['group.instance.id']}-{generation}"
        self.threads = PodThreads(simulation, self.name)
        self.completions = Completions(threads=self.threads)  # type: ignore[arg-type]
        # the jitter's random source is the run's, not an unseeded one (config.retry_policy's): replayable
        retry = dataclasses.replace(config.retry_policy(), random=random.Random(simulation.rng.random()).random)
        dead_letters = (
            SimulatedDeadLetters(journal, plan, simulation, session) if config.on_exhausted == "dlq" else None
        )
        batch = config.batch_limits()
        make = make_batch_handler if batch.enabled else make_handler
        handler = make(journal, plan, simulation, session)
        self.children: list[SimulatedChild] = []
        pool: WorkerPool
        shared: dict[str, Any] = {"clock": simulation.clock, "threads": self.threads, "batch": batch}
        arguments = (config.workers, retry, dead_letters, self.completions)
        if config.executor == "process":
            pool = ProcessWorkerPool(
                functools.partial(loading_for, handler, simulation, plan.handler.process_start),
                *arguments,
                **shared,
                handler_timeout=config.handler_timeout,
                start_child=child_factory(simulation, self.children),
            )
        elif config.executor == "async":
            make_async = make_async_batch_handler if batch.enabled else make_async_handler
            async_handler = make_async(journal, plan, simulation, session)
            pool = AsyncWorkerPool(async_handler, *arguments, **shared, event_loop=event_loop_factory(simulation))
        else:
            pool = ThreadWorkerPool(handler, *arguments, **shared)
        self.pool = pool
        self.source = SimulatedSource(broker, properties, session, self.name)
        self.runtime = ConsumerRuntime(
            runtime_settings(config),
            self.source,
            pool,
            config.ordering,
            self.completions,
            clock=simulation.clock,
            sleep=simulation.sleep,
        )
        self.source.on_commit_result = self.runtime.record_commit_outcomes
        self.stop = simulation.Event()
        self.stop_requested_at: float | None = None
        self.ending: Ending | None = None
        self.on_end: list[Callable[[SimPod], None]] = []
        self.poll_thread: SimThread | None = None

    def start(self) -> None:
        self.poll_thread = self.simulation.spawn(self._run, name=f"{self.name}/poll")

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self.runtime.run(self.stop)  # type: ignore[arg-type]
        except SourceError as fatal:  # a fatal client error: the pod exits, and is restarted
            error = fatal
        except Terminated:
            raise
        except BaseException as unexpected:  # a bug: the checks report it
            error = unexpected
        if self.ending is not None:  # crashed: the simulation unwinds a frozen thread at its end, nothing more
            return
        ending = Ending(self.simulation.clock(), "stopped" if error is None else "exited", error)
        lanes = self.pool.lane_summary()
        ending.lanes_left = lanes.queued - lanes.running
        ending.threads_left = [thread.name for thread in self.threads.started if thread.is_alive()]
        ending.processes_left = [child.process.pid for child in self.children if child.process.poll() is None]
        self.ending = ending
        if not self.source.closed:  # the process exits without leaving: the group notices at the session timeout
            self.source.freeze()
            for child in self.children:
                child.process.kill()  # type: ignore[union-attr]
            for thread in self.threads.started:
                if thread.is_alive():
                    self.simulation.freeze(thread)
        for listener in self.on_end:
            listener(self)

    @property
    def running(self) -> bool:
        return self.ending is None

    @property
    def stopping(self) -> bool:
        return self.stop_requested_at is not None or self.runtime.stopping

    def sigterm(self) -> None:
        if self.ending is None and self.stop_requested_at is None:
            self.stop_requested_at = self.simulation.clock()
            self.stop.set()

    def crash(self) -> None:
        """SIGKILL: every thread and worker process of the pod stops where it is, for good."""
        if self.ending is not None:
            return
        self.source.freeze()
        for child in self.children:
            child.process.kill()  # type: ignore[union-attr]
        for thread in [*self.threads.started, self.poll_thread]:
            if thread is not None and thread.is_alive():
                self.simulation.freeze(thread)
        self.ending = Ending(self.simulation.clock(), "crashed")
        for listener in self.on_end:
            listener(self)
