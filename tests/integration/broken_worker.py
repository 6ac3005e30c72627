"""``keyorder run`` with an INJECTED DEFECT, for the broken-worker test: nothing else is changed.

The dead-letter write of a message whose key is ``KEYORDER_TEST_BREAK_KEY`` raises
``InjectedWorkerBug``, a ``BaseException``: the worker treats only ``Exception`` from a sink as a
failed write, so this stands for a bug that kills the worker thread itself. Usage, as ``keyorder``:
``python -m tests.integration.broken_worker run ...``.
"""

from __future__ import annotations

import os
import sys

from keyorder import cli
from keyorder.adapters.dead_letters import KafkaDeadLetterSink


class InjectedWorkerBug(BaseException):
    """Not an ``Exception``: nothing on the worker's path catches it as a handler or sink failure."""


_publish = KafkaDeadLetterSink.publish


def _broken_publish(self, message, error, attempts):  # type: ignore[no-untyped-def]
    if message.key == os.environ["KEYORDER_TEST_BREAK_KEY"].encode():
        raise InjectedWorkerBug(f"injected: the worker breaks on {message.topic}[{message.partition}]@{message.offset}")
    return _publish(self, message, error, attempts)


KafkaDeadLetterSink.publish = _broken_publish  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(cli.main(sys.argv[1:]))
