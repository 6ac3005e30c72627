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

# Spark's own master patterns (``SparkMasterRegex`` in apache/spark
# core/src/main/scala/org/apache/spark/SparkContext.scala), matched whole as Scala's regex patterns are:
#   LOCAL_N_REGEX          = """local\[([0-9]+|\*)\]"""
#   LOCAL_N_FAILURES_REGEX = """local\[([0-9]+|\*)\s*,\s*([0-9]+)\]"""
#   LOCAL_CLUSTER_REGEX    = """local-cluster\[\s*([0-9]+)\s*,\s*([0-9]+)\s*,\s*([0-9]+)\s*]"""
# ``SparkContext.createTaskScheduler`` gives ``local`` and ``local[n]`` MAX_LOCAL_TASK_FAILURES (1) attempts
# per task, ``local[n,f]`` f attempts, whatever spark.task.maxFailures says; ``local-cluster`` (executors in
# their own JVMs, like a standalone cluster) and every cluster master read spark.task.maxFailures.
_LOCAL_N = re.compile(r"local\[([0-9]+|\*)\]")
_LOCAL_N_FAILURES = re.compile(r"local\[([0-9]+|\*)\s*,\s*([0-9]+)\]")
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*([0-9]+)\s*,\s*([0-9]+)\s*,\s*([0-9]+)\s*]")


@dataclass(frozen=True)
class SparkMaster:
    """What a master URL means for the job, as Spark's ``createTaskScheduler`` reads it (``parse_master``)."""

    url: str
    in_driver: bool
    """Every task runs in the driver's JVM (``local`` forms; not ``local-cluster``, whose executors are JVMs
    of their own that register like a cluster's)."""
    slots: int | None
    """Task slots the URL fixes (``local[4]``: 4, ``local-cluster[2,3,1024]``: 6); None when the URL does
    not say (``local[*]``, cluster masters)."""
    task_attempts: int | None
    """Attempts per task the URL fixes whatever spark.task.maxFailures says (``local``/``local[n]``: 1,
    ``local[n,f]``: f); None when spark.task.maxFailures decides."""
    all_cores: bool = False
    """``local[*]``: the node's cores (``local_master`` turns it into the container's)."""


def parse_master(master: str) -> SparkMaster:
    """``master`` as Spark reads it (pure). Spark does not strip the URL; this does, as ``spark-submit``'s
    shell would have."""
    url = master.strip()
    if url == "local":
        return SparkMaster(url, in_driver=True, slots=1, task_attempts=1)
    if match := _LOCAL_N.fullmatch(url):
        every = match.group(1) == "*"
        return SparkMaster(url, True, None if every else int(match.group(1)), 1, all_cores=every)
    if match := _LOCAL_N_FAILURES.fullmatch(url):
        every = match.group(1) == "*"
        # TaskSetManager aborts when a task's failures reach f: f=0 also allows one attempt
        attempts = max(int(match.group(2)), 1)
        return SparkMaster(url, True, None if every else int(match.group(1)), attempts, all_cores=every)
    if match := _LOCAL_CLUSTER.fullmatch(url):
        return SparkMaster(url, in_driver=False, slots=int(match.group(1)) * int(match.group(2)), task_attempts=None)
    return SparkMaster(url, in_driver=False, slots=None, task_attempts=None)


def is_local_master(master: str) -> bool:
    """``local``, ``local[n]``, ``local[*]`` or ``local[n,f]``: every task in the driver's JVM."""
    return parse_master(master).in_driver


def local_master(master: str, cpu_limit: float | None, available: int) -> str:
    """``local[*]`` (or ``local[*,f]``) as ``local[n]``: n the CPU limit rounded up, else the CPUs this
    process may run on; any other master unchanged."""
    if not parse_master(master).all_cores:
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
    parsed = parse_master(master)
    if parsed.in_driver or parsed.slots is not None:
        return parsed.slots, parsed.url  # None for local[*]: the JVM's count (``defaultParallelism``)
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
    settle: float = 10.0
    """Seconds without a new registration that end a wait with no expected count. 3 s cut a standalone
    cluster's 4 cores to 2 in a full test run on a loaded machine: its second worker's executor registered
    more than 3 s after the first (`test_spark_submit_on_a_standalone_cluster...`). Executors of one
    application start in parallel, so a longer quiet only costs its length, once, before the first wave."""
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
