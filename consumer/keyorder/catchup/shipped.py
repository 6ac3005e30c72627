"""Kafka properties reach the executors as a Spark file, not inside task closures.

A task's closure (the pickled ``mapInArrow`` function, the Python data source's reader) travels
with every task, is kept by Spark wherever tasks are kept (task sets, event logs of failed tasks,
a heap dump of the driver) and was, before issue 37, where the reader's and the dead-letter
producer's Kafka properties (SASL passwords, TLS keys) lived. Instead the driver writes them once
per run into a file only its user can read and registers it with ``SparkContext.addFile``: the
executors fetch it over Spark's own RPC (authenticated and encrypted by
``settings.SPARK_SECURITY_DEFAULTS``) into their work directory, and the tasks carry its name
alone and read it with ``SparkFiles.get`` when they need a Kafka client. The name carries a
random part, so a run never reads another run's file in a shared session.

What is left (docs/security.md, "Catch-up's Spark traffic"): the file lies on the driver's and
each executor's disk for the run (the driver's copy is deleted by ``close``, the executors' with
their application directory), readable by whoever can read those processes' files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from typing import Any

READER = "reader"
PRODUCER = "producer"
"""The two property sets in the file: the source reader's and the dead-letter producer's."""


class ShippedProperties:
    """The driver's side: ``ShippedProperties(context, {READER: ..., PRODUCER: ...}).name`` for the tasks."""

    def __init__(self, context: Any, properties: dict[str, dict[str, str]]) -> None:
        self._directory = tempfile.mkdtemp(prefix="keyorder-catchup-")  # mode 0700
        self.name = f"keyorder-kafka-{uuid.uuid4().hex}.json"
        path = os.path.join(self._directory, self.name)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump(properties, file)
        context.addFile(path)

    def close(self) -> None:
        """Delete the driver's copy (call after the last wave: executors fetch it when their first task starts)."""
        shutil.rmtree(self._directory, ignore_errors=True)


def load(name: str, part: str) -> dict[str, str]:
    """On an executor (or the driver): the ``part`` properties of the shipped file ``name``."""
    from pyspark import SparkFiles

    if not name:
        raise ValueError("no Kafka properties were shipped to this task (the job passes their file's name)")
    with open(SparkFiles.get(name)) as file:
        shipped: dict[str, dict[str, str]] = json.load(file)
    return shipped[part]
