"""The pod's setting of Python's cyclic garbage collector: why a pod raises its first threshold.

CPython runs a young-generation collection after every 700 container objects allocated and not yet
freed (``gc.get_threshold()[0]``). A pod allocates several per message (the ``Message``, its
``Delivery``, a batch's lists) and keeps them while the message is in flight, so at tens of thousands of
messages a second it collects a few hundred times a second: each pass walks the young objects, moves
the survivors (the messages still in flight) on, and the survivors are walked again by the older
generations' passes. All of it holds the GIL the poll loop and the workers share. In a no-op batch
handler's run of ``keyorder bench`` the collector took about 9% of the run (0.16 of 1.8 s).

With the first threshold at ``DEFAULT_THRESHOLD`` most messages are freed by their reference counts
before any pass sees them (the pod makes no reference cycles per message), so passes are rare; in that
run a threshold of 10,000 took at most one pass (1 ms), and so did 25,000 and 100,000, each run a few
percent to 20% faster than at 700, the machine's noise included (docs/performance.md, *Batch handlers*).
The price is what the collector is for: reference cycles wait longer for a pass, up to about this many
objects of them, not 700. The pod makes none per message, failed ones included (a handler's error is kept
without its traceback, whose frames led back to the frame that caught it: ``tests/unit/test_failure_garbage.py``).
Cycles a handler makes itself wait as long: with large messages held by such cycles, lower the threshold.
``--gc-threshold`` (``KEYORDER_GC_THRESHOLD``) changes it; 0 keeps Python's own setting.

The setting is the process's, so it is applied by what owns the process: ``keyorder run`` and each
worker process of the process executor, not by ``Pod`` (tests and tools build pods in processes of
their own).
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

DEFAULT_THRESHOLD = 10_000
"""Container objects allocated and not freed between two young-generation collections (Python's: 700)."""


def set_first_threshold(threshold: int) -> None:
    """Set the young generation's threshold to ``threshold`` (0: leave Python's), keeping the older two."""
    if threshold <= 0:
        return
    _first, second, third = gc.get_threshold()
    gc.set_threshold(threshold, second, third)
    log.debug("garbage collector thresholds: %s", gc.get_threshold())
