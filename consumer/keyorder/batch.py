"""The batch handler contract: one call for the heads of several ready lanes, and what its answer means.

With ``--batch-max-messages N`` above 1 the pod calls ``handle_batch(messages)`` (plain or ``async def``,
on any executor) with up to N messages instead of ``handler(message)`` once per message. A fast sink (a
bulk INSERT, a cache pipeline, a batch of produce calls) then pays its per-call cost once per batch.

What a batch holds: the heads of *distinct* ready lanes, so at most one message per key (per lane). A
key never appears twice in a batch, because its second message may not be handed out before its first
succeeded: if the first fails, its retry (or its dead-letter write, or a block) decides what runs next,
and the second must wait for that. So per-key order and one message in flight per key hold exactly as
with a per-message handler.

The handler's answer (``batch_outcomes``):

* returns ``None``: every message of the batch succeeded;
* raises: every message failed, with that error;
* returns a sequence as long as the batch, each item ``None`` (that message succeeded) or an exception
  instance (that message failed with it), in the batch's order.

The list the handler gets is its own copy: consuming it in place (``pop``, ``clear``) changes neither the
batch nor its size.

Anything else (another length, an item that is neither ``None`` nor an exception, another type) is a
bug of the handler: every message of the batch fails with ``BatchResultError``, which names the handler
and what it returned. Each failed message then goes through the retry, block and dead-letter policies on
its own key, exactly as a per-message failure does; the batch's other keys go on.

Pure: no I/O, no clock. The pools (``workers``, ``process_child``) call the handler and hand its answer
(or the error it raised) to ``batch_outcomes``.
"""

from __future__ import annotations

import inspect
import itertools
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

BATCH_REASONS = ("full", "waited", "nothing_more_ready")
"""Why a batch was sent: it held ``--batch-max-messages``; the fill wait (``--batch-max-wait-ms``) ran out;
no other lane was ready (with no wait, or the wait cut short by a revoke or shutdown)."""

Outcomes = list[BaseException | None]
"""Per message of a batch, in its order: ``None`` (succeeded) or the error it failed with."""


class BatchResultError(TypeError):
    """A batch handler returned something the contract does not allow: every message of the batch fails."""


def describe_handler(handler: Any) -> str:
    """The handler's name as a log line shows it (``module:qualname`` where known)."""
    module = getattr(handler, "__module__", None)
    name = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    return f"{module}:{name}" if module else str(name)


def batch_outcomes(handler: Any, size: int, returned: Any) -> Outcomes:
    """The outcome of each of the ``size`` messages from what ``handler`` returned (see the module doc)."""
    if returned is None:
        return [None] * size
    if isinstance(returned, (str, bytes)) or not isinstance(returned, Sequence):
        error: BaseException = BatchResultError(
            f"the batch handler {describe_handler(handler)} returned a {type(returned).__name__} "
            f"({_shown(returned)}); it must return None (all succeeded) or a sequence of {size} items, "
            "each None (succeeded) or an exception instance (failed)"
        )
        return [error] * size
    if len(returned) != size:
        error = BatchResultError(
            f"the batch handler {describe_handler(handler)} returned {len(returned)} outcomes for a batch of "
            f"{size} messages; it must return one per message, in the batch's order (or None: all succeeded)"
        )
        return [error] * size
    for index, item in enumerate(returned):
        if item is not None and not isinstance(item, BaseException):
            error = BatchResultError(
                f"the batch handler {describe_handler(handler)} returned {_shown(item)} (a {type(item).__name__}) "
                f"as the outcome of message {index} of {size}; each outcome must be None (succeeded) or an "
                "exception instance (failed)"
            )
            return [error] * size
    return list(returned)


def _shown(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


BATCH_MAX_MESSAGES_LIMIT = 1000
"""The most messages a batch may hold (``--batch-max-messages``): the process executor's progress block
has one slot per message of a batch."""
BATCH_MAX_WAIT_MS_LIMIT = 10_000
"""The longest fill wait (``--batch-max-wait-ms``)."""


class BatchLimits:
    """How a pool fills batches: at most ``max_messages`` per call (1: a per-message handler) and at most
    ``max_wait`` seconds of waiting for more ready lanes (0: send what is ready now)."""

    __slots__ = ("max_messages", "max_wait")

    def __init__(self, max_messages: int = 1, max_wait: float = 0.0) -> None:
        if not 1 <= max_messages <= BATCH_MAX_MESSAGES_LIMIT:
            raise ValueError(f"max_messages must be within 1..{BATCH_MAX_MESSAGES_LIMIT}, not {max_messages}")
        if max_wait < 0:
            raise ValueError(f"max_wait must be >= 0, not {max_wait}")
        self.max_messages = max_messages
        self.max_wait = max_wait

    @property
    def enabled(self) -> bool:
        """True: the handler is a batch handler, called with a list of messages."""
        return self.max_messages > 1


PER_MESSAGE = BatchLimits()


def is_unawaited(returned: Any) -> bool:
    """True when a plain handler or hook returned an awaitable (it was meant to be ``async def``); a coroutine is
    closed first, so that Python does not warn that it was never awaited. The caller raises its own error."""
    if returned is None or not inspect.isawaitable(returned):
        return False
    if inspect.iscoroutine(returned):
        returned.close()
    return True


def call_sync_batch(handler: Callable[[list[Any]], Any], messages: list[Any]) -> Outcomes:
    """Call a plain batch handler; its outcomes. Raises what the handler raised (every message failed).

    The handler gets a list of its own: one that consumes or reorders it in place (``pop``, ``clear``)
    changes neither the batch the outcomes are matched to nor its size, taken before the call."""
    size = len(messages)
    returned = handler(list(messages))
    if is_unawaited(returned):
        raise TypeError(
            f"the batch handler {describe_handler(handler)} returned an awaitable without awaiting it: declare it "
            "'async def' so keyorder runs it on asyncio workers"
        )
    return batch_outcomes(handler, size, returned)


async def call_async_batch(handler: Callable[[list[Any]], Any], messages: list[Any]) -> Outcomes:
    """Await an ``async def`` batch handler; its outcomes. Raises what the handler raised. As
    ``call_sync_batch``, the handler gets a list of its own, and the size is taken before the call."""
    size = len(messages)
    return batch_outcomes(handler, size, await handler(list(messages)))


def all_none(items: Iterable[object]) -> bool:
    """Whether every item is ``None``, by identity (an error may compare equal to ``None``), in C: "every message
    of the batch succeeded" for a batch's outcomes."""
    return all(map(operator.is_, items, _NONE))


_NONE = itertools.repeat(None)
