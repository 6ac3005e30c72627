"""How often flow control pauses a fast handler's partitions, at the rates ``keyorder bench --ceiling`` measured.

A development model, not a benchmark: the real ``core.flow.FlowControl`` (of this tree, and with
``--against REV`` of git revision ``REV`` too) decides for a modelled poll loop in virtual time, so
each run is deterministic and takes a second. What it models, from docs/performance.md ("A fast
handler's ceiling"):

* the workers finish ``--handled`` messages per second (110,000: the no-op row) while any are in
  flight, first in, first out;
* the loop reads up to ``--poll-batch`` (500) messages per call, at most ``FlowControl.capacity``,
  at ``--read`` messages per second (150,000: the raw loop); the client hands out one partition's
  fetched messages at a time, ``--message-set`` messages of it before the next partition's; every
  partition has a backlog;
* a hold waits for ``release_after`` completions, at most the hold and the poll timeout (0.1 s), as
  ``Runtime._read`` does; a paused partition's prefetch is dropped, and after its resume it delivers
  nothing for a refetch time drawn between ``--refetch`` bounds (17 ms to 400 ms in the probe's
  timeline);
* commits are confirmed at once, every 20 ms under commit pressure, else every second.

It prints, per partition count and flow control: pauses per second, the share of the time the loop
held, the workers' idle share and the messages handled per second.

    .venv/bin/python -m tools.flow_pauses
    .venv/bin/python -m tools.flow_pauses --against 783766e --against 783766e^
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import subprocess
import sys
import tempfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from keyorder.core import flow as this_flow

FLOW = "consumer/keyorder/core/flow.py"
POLL_TIMEOUT = 0.1
EARLY_COMMIT_SPACING = 0.02
COMMIT_INTERVAL = 1.0


def flow_at(revision: str) -> ModuleType:
    """The flow module as it was at ``revision``."""
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(
        ["git", "show", f"{revision}:{FLOW}"], cwd=root, check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="keyorder-flow-")) / "flow_at_revision.py"
    path.write_text(source)
    name = f"flow_at_{len(sys.modules)}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Rates:
    handled: float
    read: float
    poll_batch: int
    message_set: int
    refetch: tuple[float, float]
    seconds: float


@dataclass(frozen=True)
class Outcome:
    pauses_per_second: float
    held_share: float
    idle_share: float
    handled_per_second: float


class Pod:
    """The modelled loop's state: in flight (first in, first out), finished but uncommitted, the client's queue."""

    def __init__(self, partitions: int, rates: Rates, seed: int) -> None:
        self.rates = rates
        self.random = random.Random(seed)
        self.partitions = list(range(partitions))
        self.inflight = dict.fromkeys(self.partitions, 0)
        self.finished = dict.fromkeys(self.partitions, 0)  # not yet committed
        self.queue: deque[list[int]] = deque()  # [partition, count] in the order read
        self.delivers_from = dict.fromkeys(self.partitions, 0.0)  # a resumed partition's refetch
        self.current, self.left_in_set = 0, rates.message_set
        self.now = self.idle = 0.0
        self.handled = 0
        self._credit = 0.0

    def run_workers(self, seconds: float) -> None:
        """The workers finish messages for ``seconds``, first in, first out."""
        total = sum(self.inflight.values())
        busy = min(seconds, total / self.rates.handled)
        self.idle += seconds - busy
        self._credit += busy * self.rates.handled
        count, self._credit = int(self._credit), self._credit - int(self._credit)
        count = min(count, total)
        self.handled += count
        while count:
            entry = self.queue[0]
            taken = min(count, entry[1])
            entry[1] -= taken
            self.inflight[entry[0]] -= taken
            self.finished[entry[0]] += taken
            count -= taken
            if not entry[1]:
                self.queue.popleft()
        self.now += seconds

    def until_finished(self, count: int) -> float:
        return count / self.rates.handled if sum(self.inflight.values()) >= count else float("inf")

    def read(self, most: int, paused: set[int]) -> int:
        """Up to ``most`` messages from the partitions delivering now, one partition's message set at a time."""
        taken = 0
        for _ in range(2 * len(self.partitions)):
            partition = self.current
            if partition in paused or self.delivers_from[partition] > self.now or not self.left_in_set:
                self.current = (partition + 1) % len(self.partitions)
                self.left_in_set = self.rates.message_set
                continue
            count = min(most - taken, self.left_in_set)
            self.left_in_set -= count
            self.inflight[partition] += count
            self.queue.append([partition, count])
            taken += count
            if taken == most:
                break
        return taken

    def loads(self, load: type) -> tuple[dict[int, object], object]:
        loads = {p: load(self.inflight[p], self.inflight[p] + self.finished[p]) for p in self.partitions}
        return loads, load(
            sum(self.inflight.values()), sum(self.inflight[p] + self.finished[p] for p in self.partitions)
        )


def simulate(flow_module: ModuleType, partitions: int, rates: Rates, seed: int = 36) -> Outcome:
    """The modelled loop for ``rates.seconds`` of virtual time under ``flow_module``'s flow control (default limits)."""
    pod = Pod(partitions, rates, seed)
    flow = flow_module.FlowControl(flow_module.FlowLimits())
    pauses, held = 0, 0.0
    next_commit, next_early = COMMIT_INTERVAL, 0.0
    while pod.now < rates.seconds:
        loads, load = pod.loads(flow_module.Load)
        pressure = flow.commit_pressure(loads, load)
        periodic = pod.now >= next_commit
        if periodic or (pressure and pod.now >= next_early):  # first in, first out: all finished ones commit
            pod.finished = dict.fromkeys(pod.partitions, 0)
            next_commit = pod.now + COMMIT_INTERVAL if periodic else next_commit
            next_early = pod.now + EARLY_COMMIT_SPACING
            loads, load = pod.loads(flow_module.Load)
        decision = flow.decide(loads, load, pod.now)
        pauses += len(decision.to_pause)
        for partition in decision.to_resume:
            pod.delivers_from[partition] = pod.now + pod.random.uniform(*rates.refetch)
        if decision.hold is not None or flow.all_paused(partitions):
            wait = min(POLL_TIMEOUT, pod.until_finished(decision.release_after))
            if decision.hold is not None:
                wait = min(wait, decision.hold)
                held += wait
            pod.run_workers(max(wait, 1e-6))  # a clock's resolution
            continue
        taken = pod.read(min(rates.poll_batch, flow.capacity(load)), flow.paused)
        if taken:
            pod.run_workers(taken / rates.read)
        else:  # nothing delivered yet: the call waits out its timeout, or the first refetch
            timeout = 0.005 if flow.paused else POLL_TIMEOUT
            first = min((pod.delivers_from[p] for p in pod.partitions if p not in flow.paused), default=pod.now)
            pod.run_workers(max(min(timeout, first - pod.now), 1e-6))
    return Outcome(pauses / pod.now, held / pod.now, pod.idle / pod.now, pod.handled / pod.now)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", action="append", default=[], metavar="REV", help="also flow.py of this revision")
    parser.add_argument("--partitions", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--handled", type=float, default=110_000.0)
    parser.add_argument("--read", type=float, default=150_000.0)
    parser.add_argument("--poll-batch", type=int, default=500)
    parser.add_argument("--message-set", type=int, default=1_000)
    parser.add_argument("--refetch", type=float, nargs=2, default=(0.017, 0.4), metavar=("LOW", "HIGH"))
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    rates = Rates(args.handled, args.read, args.poll_batch, args.message_set, tuple(args.refetch), args.seconds)
    flows = [("this tree", this_flow)] + [(revision, flow_at(revision)) for revision in args.against]
    print(f"{'flow control':>12} {'partitions':>10} {'pauses/s':>9} {'held':>6} {'idle':>6} {'handled/s':>10}")
    for partitions in args.partitions:
        for name, module in flows:
            outcome = simulate(module, partitions, rates)
            print(
                f"{name:>12} {partitions:>10} {outcome.pauses_per_second:>9.2f} {outcome.held_share:>6.1%} "
                f"{outcome.idle_share:>6.1%} {outcome.handled_per_second:>10,.0f}"
            )


if __name__ == "__main__":
    main()
