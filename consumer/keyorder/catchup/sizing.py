"""How many cores a catch-up run really gets, and so how many key partitions (handler tasks) it cuts.

Two numbers went wrong without it. ``local[*]`` means the *node's* cores to the JVM, also in a
container whose CPU limit is 2: a Job pod on a 64-core node ran 64 Python workers of 16 threads
each. And on a cluster, ``defaultParallelism`` is the cores registered *so far*, at least 2: a job
that plans while its executors still pull their image cut every wave into 2 tasks.

So ``local_master`` turns ``local[*]`` into ``local[n]`` with n from the container's CPU limit, and
``expected_cores`` reads the cores the job asked for from its Spark settings (executors x cores,
``spark.cores.max``, or ``local[n]``). ``RegistrationWait`` decides, from what is registered and the
time, whether to wait for more executors and what the key partitions are. All pure; the job polls
Spark and sleeps.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

_LOCAL = re.compile(r"^local(?:\[(\*|\d+)(?:,\s*\d+)?\])?$")


def is_local_master(master: str) -> bool:
    """``local``, ``local[n]``, ``local[*]`` or ``local[n,f]``: every task in the driver's JVM."""
    return _LOCAL.match(master.strip()) is not None


def local_master(master: str, cpu_limit: float | None, available: int) -> str:
    """``local[*]`` (or ``local[*,f]``) as ``local[n]``: n the CPU limit rounded up, else the CPUs this
    process may run on; any other master unchanged."""
    match = _LOCAL.match(master.strip())
    if not match or match.group(1) != "*":
        return master
    cores = max(1, math.ceil(cpu_limit)) if cpu_limit else max(1, available)
    return master.strip().replace("*", str(cores), 1)


def _positive_int(value: str | None) -> int | None:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def expected_cores(master: str, conf: Mapping[str, str]) -> tuple[int | None, str]:
    """The task slots the job asked for and where that number comes from (``None``: the settings do not
    say, e.g. a standalone master without ``spark.cores.max``, which takes every free core)."""
    match = _LOCAL.match(master.strip())
    if match:
        slots = match.group(1)
        if slots is None:
            return 1, "local"
        if slots.isdigit():
            return int(slots), f"local[{slots}]"
        return None, "local[*]"
    cores_per_executor = _positive_int(conf.get("spark.executor.cores"))
    if str(conf.get("spark.dynamicAllocation.enabled", "false")).strip().lower() == "true":
        most = _positive_int(conf.get("spark.dynamicAllocation.maxExecutors"))
        if most is not None:
            cores = most * (cores_per_executor or 1)
            return cores, f"spark.dynamicAllocation.maxExecutors {most} x {cores_per_executor or 1} cores"
        return None, "dynamic allocation without maxExecutors"
    instances = _positive_int(conf.get("spark.executor.instances"))
    if instances is not None and not master.startswith("spark://"):  # standalone ignores instances
        cores = instances * (cores_per_executor or 1)
        return cores, f"spark.executor.instances {instances} x {cores_per_executor or 1} cores"
    cap = _positive_int(conf.get("spark.cores.max"))
    if cap is not None:
        return cap, f"spark.cores.max {cap}"
    return None, "the cluster's free cores"


@dataclass
class RegistrationWait:
    """Waits (at most ``timeout`` seconds) for the executors' cores before the first wave is cut.

    With an expected count it waits until that many cores registered. Without one it waits until a
    first executor registered and no more came for ``settle`` seconds. Either way the key partitions
    are ``tasks_per_core`` x the expected cores when known (tasks queue for late executors, which then
    take them), else x the cores registered.
    """

    expected: int | None
    started: float
    timeout: float = 120.0
    settle: float = 3.0
    tasks_per_core: int = 1

    def __post_init__(self) -> None:
        self._last_count = 0
        self._last_change = self.started

    def done(self, registered: int, now: float) -> bool:
        """Whether to stop waiting, given the cores registered at ``now``."""
        if registered != self._last_count:
            self._last_count, self._last_change = registered, now
        if now - self.started >= self.timeout:
            return True
        if self.expected is not None:
            return registered >= self.expected
        return registered > 0 and now - self._last_change >= self.settle

    def key_partitions(self, registered: int) -> int:
        return self.tasks_per_core * max(self.expected or registered, 1)

    def describe(self, registered: int, now: float) -> str:
        """For the log and the report: what the count is and what it was waiting for."""
        partitions = self.key_partitions(registered)
        waited = now - self.started
        if self.expected is None:
            return f"{partitions} key partitions: {registered} cores registered after {waited:.0f} s"
        if registered >= self.expected:
            return f"{partitions} key partitions: {self.expected} cores asked for, all registered after {waited:.0f} s"
        return (
            f"{partitions} key partitions: {self.expected} cores asked for, only {registered} registered after "
            f"{waited:.0f} s (the waves start anyway; late executors take the queued tasks)"
        )
