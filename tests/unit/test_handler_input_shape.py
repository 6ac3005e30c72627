"""A handler whose annotation says it takes one ``Message`` is refused as a batch handler, and one that says it
takes a list is refused where it would get one message: every call would fail (``'Message' object is not
iterable``, or ``'list' object has no attribute 'value'``), and each message be retried, then dead-lettered.
Unannotated handlers, and annotations that say neither, are trusted."""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import pytest

from keyorder.adapters.handlers import MANY, ONE, HandlerLoadError, check_input, declared_input, load_for_catchup
from keyorder.message import Message

if TYPE_CHECKING:
    from keyorder.message import Message as OnlyWhileChecking


def one(message: Message) -> None: ...
def many(messages: Sequence[Message]) -> None: ...
def many_list(messages: list[Message]) -> None: ...
def many_typing(messages: typing.Sequence[Message]) -> None: ...
def many_iterable(messages: Iterable[Message]) -> None: ...
async def one_async(message: Message) -> None: ...
async def many_async(messages: Sequence[Message]) -> None: ...
def bare(message) -> None: ...  # type: ignore[no-untyped-def]
def anything(message: Any) -> None: ...
def ints(numbers: list[int]) -> None: ...
def unresolved(message: OnlyWhileChecking) -> None: ...


class Handler:
    def __call__(self, message: Message) -> None: ...


def per_message(batch_function):  # an adapter a user writes: one message in, a batch of one out
    @functools.wraps(batch_function)
    def handle(message):
        return batch_function([message])

    return handle


wrapped = per_message(many)


def traced(function):  # a decorator that passes its arguments through: read as the function it wraps
    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        return function(*args, **kwargs)

    return wrapper


traced_batch = traced(many)
traced_one = traced(one)


@pytest.mark.parametrize(
    ("function", "declared"),
    [
        (one, ONE),
        (one_async, ONE),
        (Handler(), ONE),
        (many, MANY),
        (many_list, MANY),
        (many_typing, MANY),
        (many_iterable, MANY),
        (many_async, MANY),
        (bare, None),
        (anything, None),
        (ints, None),
        (unresolved, None),  # a name only imported for the type checker: nothing is assumed
        (len, None),  # a C callable
        (wrapped, None),  # functools.wraps copies the batch function's annotations onto the adapter
        (traced_batch, MANY),  # a pass-through decorator takes what the function it wraps takes
        (traced_one, ONE),
    ],
)
def test_what_the_first_parameter_says_it_takes(function, declared) -> None:
    assert declared_input(function) == declared


def test_a_one_message_handler_is_refused_as_a_batch_handler_and_the_other_way_round() -> None:
    check_input("m:one", one, batch=False)
    check_input("m:many", many, batch=True)
    check_input("m:bare", bare, batch=True)
    check_input("m:bare", bare, batch=False)
    with pytest.raises(HandlerLoadError, match=r"handler 'm:one' takes one message .* --batch-max-messages above 1"):
        check_input("m:one", one, batch=True)
    with pytest.raises(HandlerLoadError, match=r"handler 'm:many' takes a list of messages .* called with one"):
        check_input("m:many", many, batch=False)


def test_catch_up_refuses_a_batch_handler_by_its_annotation() -> None:
    with pytest.raises(HandlerLoadError, match="keyorder catchup calls one per message"):
        load_for_catchup("keyorder_example.bulk_sqlite:handle_batch", None, None)
    loaded, _hooks = load_for_catchup("keyorder_example.bulk_sqlite:handle", None, None)  # its per-message form
    assert loaded.path == "keyorder_example.bulk_sqlite:handle"
