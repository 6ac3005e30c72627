"""The pod's setting of Python's cyclic garbage collector (``--gc-threshold``), off by default: why it exists,
and why it is not on.

CPython runs a young-generation collection after every 700 container objects allocated and not yet
freed (``gc.get_threshold()[0]``). A pod allocates several per message (the ``Message``, its
``Delivery``, a batch's lists) and keeps them while the message is in flight, so at tens of thousands of
messages a second it collects a few hundred times a second, holding the GIL the poll loop and the
workers share. In ``keyorder bench``'s fast rows the collector took 4 to 9% of a run (0.16 s of 2.2 s
for the no-op batch row, 0.37 s of 4.0 s for the recording row under one lock).

A first threshold of 10,000 removes nearly all of it: most messages are freed by their reference counts
before a pass sees them (the pod makes no reference cycles per message, failed ones included: a
handler's error is kept without its traceback, ``tests/unit/test_failure_garbage.py``). Taking turns in
one process, the key-ordered fast rows ran 8 to 34% faster with it; but the partition-ordered no-op row
ran 15 to 27% slower (40,000 against 47,000-55,000 msg/s; with the collector off altogether, the same),
though its collections took 0.007 s instead of 0.17 s. Not understood yet: a likely cause is that a
faster poll thread fills the partitions' in-flight bounds sooner against only 4 busy workers, and flow
control holds and pauses more. Until that is understood the pod keeps Python's setting (0), and the flag
is there for a user who measures their own pod (docs/performance.md, *Batch handlers*). Reference cycles
a handler makes wait longer for a pass under a higher threshold: lower it if they hold large messages.

The setting is the process's, so it is applied by what owns the process: ``keyorder run`` and each
worker process of the process executor, not by ``Pod`` (tests and tools build pods in processes of
their own).
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def set_first_threshold(threshold: int) -> None:
    """Set the young generation's threshold to ``threshold`` (0: leave Python's), keeping the older two."""
    if threshold <= 0:
        return
    _first, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)
    log.debug("garbage collector thresholds: %s", gc.get_threshold())
