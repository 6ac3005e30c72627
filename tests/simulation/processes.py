"""The process executor's worker processes, simulated: the real child code, a simulated operating system.

The pod's side of the process executor (``keyorder.engine.process_pool``: the pool and ``_Child``'s
``run``, ``await_ready``, ``kill``, ``close``) is code under test and runs unchanged. So does the
child's: ``keyorder.engine.process_child.serve`` with its batch loop (``run_batch``) and its writes to
the real shared-memory progress block (``Progress`` over a memfd, mapped twice as the pod and
the child map it). What is simulated is what the operating system provides between them, so that
a seed decides when the child runs and when it dies: while a message runs, between two messages
of a batch, or while it waits for the next batch (idle) — the case behind issue 36's first defect.

A **fake**, copying the code of the parts it stands in for:

* ``SimulatedConnection`` stands in for ``multiprocessing.connection.Connection`` over a socket
  pair (CPython ``Lib/multiprocessing/connection.py``, ``_ConnectionBase.recv``/``send``/``poll``
  and ``Connection._recv``): ``recv`` returns what the peer sent before it closed, then raises
  ``EOFError`` (``_recv`` reads 0 bytes: "EOFError"); ``poll`` answers True at end of file (the
  socket is readable); ``send`` on a socket whose peer is closed fails with ``BrokenPipeError``
  (Linux ``net/unix/af_unix.c``, ``unix_stream_sendmsg``: ``EPIPE`` once the peer has shut down);
  using a closed end raises ``OSError("handle is closed")`` (``_check_closed``).
* ``loading_for`` stands in for the time a worker process takes to load: ``serve`` runs the loader the pod
  gives it (``keyorder.adapters.handlers.load_for_worker_process``, which imports the handler's module, CPython
  ``Lib/importlib/__init__.py`` ``import_module``, and resolves its hooks; then ``Lifecycle.setup`` runs the
  set-up hook) before it sends ``("ready", ...)``, which ``_Child.await_ready`` waits for. The fake loader
  returns the handler after that many virtual seconds; a SIGKILL meanwhile stops the process there, and the pod
  reads end of file, as from a real process killed while it imports.
* ``SimulatedProcess`` stands in for ``subprocess.Popen`` (CPython ``Lib/subprocess.py``): ``poll``
  and ``returncode`` (``-SIGKILL`` after ``kill``), ``wait(timeout)`` raising
  ``TimeoutExpired``. SIGKILL stops the process where it is (``Simulation.freeze``: not one more
  line runs) and the kernel closes its end of the socket, which the pod then reads as end of file.
"""

from __future__ import annotations

import itertools
import signal
import subprocess
from collections import deque
from collections.abc import Callable
from typing import Any

from keyorder.engine.process_child import Init, Loader, Progress, serve
from keyorder.engine.process_pool import _Child
from keyorder.engine.worker_pools import NO_HOOKS, Lifecycle
from tests.simulation.scheduler import SimThread, Simulation, _Managed

_pids = itertools.count(40_000)


class SimulatedConnection:
    """One end of a simulated socket pair carrying ``multiprocessing.connection`` frames."""

    def __init__(self, simulation: Simulation) -> None:
        self._simulation = simulation
        self._inbox: deque[Any] = deque()
        self._readers: list[_Managed] = []
        self.peer: SimulatedConnection | None = None
        self.closed = False

    def send(self, obj: Any) -> None:
        if self.closed:
            raise OSError("handle is closed")
        peer = self.peer
        assert peer is not None
        if peer.closed:
            raise BrokenPipeError(32, "Broken pipe")
        peer._inbox.append(obj)
        self._simulation._wake_all(peer._readers)

    def poll(self, timeout: float | None = 0.0) -> bool:
        if self.closed:
            raise OSError("handle is closed")
        simulation = self._simulation
        deadline = None if timeout is None else simulation.now + max(timeout, 0.0)
        while not self._readable():
            if deadline is not None and simulation.now >= deadline:
                return False
            simulation._block(self._readers, deadline)
        return True

    def recv(self) -> Any:
        self.poll(None)
        if self._inbox:
            return self._inbox.popleft()
        raise EOFError

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._inbox.clear()
        if self.peer is not None:
            self._simulation._wake_all(self.peer._readers)

    def _readable(self) -> bool:
        return bool(self._inbox) or self.peer is None or self.peer.closed


def connection_pair(simulation: Simulation) -> tuple[SimulatedConnection, SimulatedConnection]:
    ours, theirs = SimulatedConnection(simulation), SimulatedConnection(simulation)
    ours.peer, theirs.peer = theirs, ours
    return ours, theirs


class SimulatedProcess:
    """A worker process: a managed thread running ``main``, with a pid, an exit status and SIGKILL."""

    def __init__(self, simulation: Simulation, name: str, main: Callable[[], int], connection: SimulatedConnection):
        self._simulation = simulation
        self._connection = connection
        self.pid = next(_pids)
        self.args = [name]
        self.returncode: int | None = None
        self.killed_while: str | None = None
        """What the process was doing when SIGKILL came ("idle", "in a batch"), for the run's report."""
        self.batches = 0
        self.busy = False
        """True while a batch is being run (between receiving it and sending its results)."""

        def run() -> None:
            status = 1
            try:
                status = main()
            finally:
                self._exit(status)

        self._thread: SimThread = simulation.spawn(run, name=name)

    def _exit(self, status: int) -> None:
        if self.returncode is None:
            self.returncode = status
        self._connection.close()  # the kernel closes the process's end of the socket

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._thread.join(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is not None:
            return
        self.killed_while = "in a batch" if self.busy else "idle"
        self.returncode = -signal.SIGKILL
        self._simulation.freeze(self._thread)
        self._connection.close()

    @property
    def alive(self) -> bool:
        return self.returncode is None


class SimulatedChild(_Child):
    """``process_pool._Child`` with a simulated process and socket; everything else is the real code."""

    def __init__(self, load: Loader, worker_id: int, simulation: Simulation, registry: list[SimulatedChild]) -> None:
        self._simulation = simulation
        super().__init__(load, worker_id)
        registry.append(self)

    def _start_process(self, progress_fd: int) -> tuple[Any, Any]:
        ours, theirs = connection_pair(self._simulation)
        child_progress = Progress(progress_fd)  # the child maps the descriptor it inherits
        process: SimulatedProcess

        class _Tracked:
            """The child's end as ``serve`` uses it, marking the process busy from a batch to its reply."""

            def recv(self) -> Any:
                frame = theirs.recv()
                process.busy = frame is not None and not isinstance(frame, Init)
                return frame

            def send(self, obj: Any) -> None:
                theirs.send(obj)
                if isinstance(obj, list):
                    process.busy = False
                    process.batches += 1

        def main() -> int:
            try:
                return serve(_Tracked(), child_progress)  # type: ignore[arg-type]
            finally:
                child_progress.close()

        process = SimulatedProcess(self._simulation, f"worker-process-{self.worker_id}", main, theirs)
        return process, ours


def loading_for(
    handler: Callable[[Any], None], simulation: Simulation, seconds: float
) -> tuple[Callable[[Any], None], Lifecycle]:
    """FAKE loader (bind with ``functools.partial``): the handler, after ``seconds`` of virtual time (the module
    docstring says what it stands in for)."""
    if seconds:
        simulation.sleep(seconds)
    return handler, NO_HOOKS


def child_factory(simulation: Simulation, registry: list[SimulatedChild]) -> Callable[[Loader, int], _Child]:
    """``ProcessWorkerPool(start_child=...)``: every child it starts is simulated and listed in ``registry``."""

    def start(load: Loader, worker_id: int) -> _Child:
        return SimulatedChild(load, worker_id, simulation, registry)

    return start


def live_processes(registry: list[SimulatedChild]) -> list[SimulatedProcess]:
    """The simulated worker processes that have not exited (what a fault may kill)."""
    return [child.process for child in registry if isinstance(child.process, SimulatedProcess) and child.process.alive]
