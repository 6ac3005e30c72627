"""What one catch-up Spark task holds in its Python workers, in bytes: one set of figures for the job's
Spark settings, the reader, the handler loop and the executor memory the operator asks for.

A task runs two Python workers beside the executor's JVM, both in the executor's memory overhead:

* the reader's (the data source, ``datasource.read_task``): its open consumers' pre-fetch queues,
  one fetch response each and the chunks waiting to be interleaved, at most ``READER_TASK_BYTES``
  (``datasource.reader_shares`` shares it out);
* the handler's (``mapInArrow``, ``apply.TaskRunner``): one Arrow input batch, at most
  ``ARROW_BATCH_BYTES`` (the job sets Spark's ``spark.sql.execution.arrow.maxBytesPerBatch`` to it;
  a single larger message still comes alone), one slice of it as Python objects (``SLICE_BYTES``)
  and the look-ahead (``--task-lookahead-mb``, its messages' estimated memory);

plus each worker's interpreter and libraries (``WORKER_BASE_MIB``). ``task_python_mib`` adds them up;
``executor_memory_overhead_mib`` is what an executor of ``cores`` task slots needs beside its JVM
heap. docs/catchup.md ("Memory") gives the formula, the figures and how the peak was measured.

Pure, and free of Spark and Kafka imports: the operator imports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from keyorder.config import env_name

MIB = 1 << 20
WORKER_BASE_MIB = 192
"""A Python worker's own memory: the interpreter with pyspark, pyarrow, pandas and confluent-kafka loaded
and the handler's threads started. Measured as the base of ``devtools.catchup_task_memory`` (peak RSS after a
warm-up task on 16 threads): 135 MiB on the development machine, at least 164 MiB on the CI machine (same
Python and libraries; the allocator's per-thread arenas differ by machine), which failed a bound of 160.
Rounded up with room for that spread; the handler's own libraries come on top."""
READER_TASK_BYTES = 64 * MIB
"""What a reader task's consumers and chunks hold at most (``datasource.reader_shares``)."""
ARROW_BATCH_BYTES = 8 * MIB
"""Spark's ``spark.sql.execution.arrow.maxBytesPerBatch`` for the job's session: the largest Arrow batch
``mapInArrow`` hands a task (Spark 4's ``BatchedPythonArrowInput`` cuts by it; rows are cut at
``spark.sql.execution.arrow.maxRecordsPerBatch``, 10,000, too)."""
ARROW_BATCH_CONF = "spark.sql.execution.arrow.maxBytesPerBatch"
SLICE_BYTES = 1 * MIB
"""Most bytes of an input batch's keys and values the handler loop turns into Python objects at once."""
ALLOCATOR_SLACK_BYTES = 4 * MIB
"""Room for the allocator's free lists and the worker threads' arenas around the terms above (the measured
growth of a task with 100 KB values came within 1 MiB of the terms' sum; catchup_task_memory)."""
SPARK_OVERHEAD_MIB = 384
"""The executor JVM's own overhead (Spark's minimum ``spark.executor.memoryOverhead``)."""
LOOKAHEAD_ENV = env_name("task_lookahead_mb")
"""The variable ``keyorder catchup`` reads ``--task-lookahead-mb`` from."""


def handler_growth_bytes(lookahead_mb: int, batch_bytes: int = ARROW_BATCH_BYTES) -> int:
    """What the handler's worker holds above its own base while a task runs: the look-ahead, one Arrow input
    batch, one slice of it as Python objects, the allocator's slack."""
    return (lookahead_mb << 20) + batch_bytes + SLICE_BYTES + ALLOCATOR_SLACK_BYTES


def handler_worker_mib(lookahead_mb: int, batch_bytes: int = ARROW_BATCH_BYTES) -> int:
    """MiB the handler's Python worker holds at most."""
    return WORKER_BASE_MIB + -(-handler_growth_bytes(lookahead_mb, batch_bytes) // MIB)


def reader_worker_mib() -> int:
    """MiB the reader's Python worker holds at most."""
    return WORKER_BASE_MIB + -(-(READER_TASK_BYTES + ALLOCATOR_SLACK_BYTES) // MIB)


def task_python_mib(lookahead_mb: int, batch_bytes: int = ARROW_BATCH_BYTES) -> int:
    """MiB one task's two Python workers hold at most: two interpreters, the reader's bytes, one Arrow
    batch, one slice and the look-ahead (each worker with the allocator's slack)."""
    return handler_worker_mib(lookahead_mb, batch_bytes) + reader_worker_mib()


def executor_memory_overhead_mib(cores: int, lookahead_mb: int, batch_bytes: int = ARROW_BATCH_BYTES) -> int:
    """``spark.executor.memoryOverhead`` for an executor running ``cores`` tasks at once."""
    return SPARK_OVERHEAD_MIB + cores * task_python_mib(lookahead_mb, batch_bytes)


DRIVER_MEMORY_MIB = 1024
"""Spark's ``spark.driver.memory`` by default: the driver JVM's heap."""


def local_pod_memory_mib(
    cores: int, lookahead_mb: int, batch_bytes: int = ARROW_BATCH_BYTES, driver_memory_mib: int = DRIVER_MEMORY_MIB
) -> int:
    """MiB a Job pod on a local master needs, where every task runs beside the driver: the driver JVM (its
    heap and Spark's minimum overhead), the driver's own Python process (``keyorder catchup``: one more
    interpreter with the same libraries), and ``cores`` tasks' Python workers (``task_python_mib``)."""
    return driver_memory_mib + SPARK_OVERHEAD_MIB + WORKER_BASE_MIB + cores * task_python_mib(lookahead_mb, batch_bytes)


_BYTE_UNITS = {"b": 0, "k": 10, "kb": 10, "m": 20, "mb": 20, "g": 30, "gb": 30, "t": 40, "tb": 40, "p": 50, "pb": 50}


def spark_bytes(value: str, default_unit: str = "b") -> int | None:
    """A Spark size setting in bytes (``8m``, ``64k``, ``1g``; a bare number in ``default_unit``), as
    ``JavaUtils.byteStringAs`` in apache/spark common/utils reads it (binary units, case-insensitive, whole
    numbers only); ``None`` if it is not one."""
    found = re.fullmatch(r"([0-9]+)([a-z]*)", value.strip().lower())
    if not found or (found.group(2) or default_unit) not in _BYTE_UNITS:
        return None
    return int(found.group(1)) << _BYTE_UNITS[found.group(2) or default_unit]


def effective_batch_bytes(spark_conf: Mapping[str, str]) -> int:
    """The Arrow batch bound a job with these settings runs with: ``ARROW_BATCH_CONF`` when given as a size
    (a bare number is bytes, as Spark reads it), else ``ARROW_BATCH_BYTES`` (``job.memory_settings``)."""
    given = spark_bytes(spark_conf.get(ARROW_BATCH_CONF, ""))
    return given if given else ARROW_BATCH_BYTES


def lookahead_from_env(env: Iterable[tuple[str, str | None]], default: int) -> int:
    """The look-ahead (MiB) a job with this environment runs with: ``LOOKAHEAD_ENV`` when set to a number,
    else ``default``. A value the job would refuse (not a whole number) leaves ``default``: that job ends
    at start-up with the variable named, before any executor starts."""
    values: Mapping[str, str | None] = dict(env)
    value = values.get(LOOKAHEAD_ENV)
    if value is None:
        return default
    try:
        return max(int(value.strip()), 1)
    except ValueError:
        return default
