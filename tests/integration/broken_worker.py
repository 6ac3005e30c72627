"""``keyorder run`` with an INJECTED DEFECT, for the broken-worker test: nothing else is changed.

The dead-letter write of a message whose key is ``KEYORDER_TEST_BREAK_KEY`` raises
``InjectedWorkerBug``, a ``BaseException``: the worker treats only ``Exception`` from a sink as a
failed write, so this stands for a bug that kills the worker thread itself. Usage, as ``keyorder``:
``python -m tests.integration.broken_worker run ...``.

With ``KEYORDER_TEST_BREAK_AFTER_PARTITION`` set, the write first waits (up to a minute) until the handler
``tests.integration.file_handler:handle_timed`` has recorded a message of that partition: the test then knows
the pod finished work there before the bug, whichever partition librdkafka handed out first. (Without it the
breaker, first in its partition, broke the worker at once; when the client handed out that partition's records
first, the workers' first calls, oldest first, were all of it, and nothing of the other had finished.)
"""

from __future__ import annotations

import os
import sys
import time

from keyorder import cli
from keyorder.adapters.dead_letters import KafkaDeadLetterSink
from tests.integration.file_handler import read_timed


class InjectedWorkerBug(BaseException):
    """Not an ``Exception``: nothing on the worker's path catches it as a handler or sink failure."""


_publish = KafkaDeadLetterSink.publish


def _await_a_record_of_the_other_partition() -> None:
    partition = os.environ.get("KEYORDER_TEST_BREAK_AFTER_PARTITION")
    if partition is None:
        return
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if any(record[2] == int(partition) for record in read_timed(os.environ["KEYORDER_TEST_RECORD_FILE"])):
            return
        time.sleep(0.05)


def _broken_publish(self, message, error, attempts):  # type: ignore[no-untyped-def]
    if message.key == os.environ["KEYORDER_TEST_BREAK_KEY"].encode():
        _await_a_record_of_the_other_partition()
        raise InjectedWorkerBug(f"injected: the worker breaks on {message.topic}[{message.partition}]@{message.offset}")
    return _publish(self, message, error, attempts)


KafkaDeadLetterSink.publish = _broken_publish  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
