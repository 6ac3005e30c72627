"""Loading the user's handler (and its optional hooks) from ``package.module:function`` paths.

The handler is the whole user-facing contract: ``handler(message: keyorder.Message)``, either a
plain function (run on worker threads, or in worker processes) or an ``async def`` (run as asyncio
tasks). Its optional set-up and tear-down hooks take no argument. A bad path is reported at
start-up, naming exactly what could not be found, instead of failing on the first message.
"""

from __future__ import annotations

import collections.abc
import importlib
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from keyorder.collector import set_first_threshold
from keyorder.engine.worker_pools import Lifecycle, is_async_callable
from keyorder.message import Message


class HandlerLoadError(ValueError):
    """The handler path does not name an importable callable."""


class HandlerContractError(HandlerLoadError):
    """The handler (or a hook) loads, but cannot be called as this command would call it: a signature, an
    annotation of the other shape, an ``async def`` hook beside a plain handler. Unlike an import that fails,
    this does not depend on the environment the code is loaded in (``keyorder catchup``'s driver refuses it
    before Spark starts; an import error there is only a warning, the executors may import what it cannot).
    ``setting`` is the flag to change."""

    def __init__(self, message: str, setting: str = "--handler") -> None:
        super().__init__(message)
        self.setting = setting


@dataclass(frozen=True)
class LoadedHandler:
    function: Callable[..., Any]
    is_async: bool
    path: str


def _flag(what: str) -> str:
    """The flag of what ``_resolve`` loads: ``handler`` is ``--handler``; a hook is named by its flag already."""
    return what if what.startswith("--") else f"--{what}"


def _resolve(path: str, what: str) -> Callable[..., Any]:
    """Import ``package.module:attribute`` (the attribute may be dotted: ``module:Class.method``)."""
    module_name, separator, attribute = path.partition(":")
    if not separator or not module_name or not attribute:
        raise HandlerLoadError(f"{what} {path!r} must look like 'package.module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise HandlerLoadError(f"{what} {path!r}: module {error.name!r} not found") from error
    except Exception as error:
        raise HandlerLoadError(
            f"{what} {path!r}: importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from error
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as error:
            raise HandlerLoadError(f"{what} {path!r}: {module_name!r} has no attribute {attribute!r}") from error
    if not callable(target):
        raise HandlerContractError(f"{what} {path!r} is a {type(target).__name__}, not a callable", _flag(what))
    return target


def load_handler(path: str) -> LoadedHandler:
    """Import the handler ``package.module:function``."""
    target = _resolve(path, "handler")
    check_signature(path, target)
    return LoadedHandler(function=target, is_async=is_async_callable(target), path=path)


def load_hook(path: str, what: str) -> Callable[[], Any]:
    """Import a set-up or tear-down hook: a callable without arguments, plain or ``async def``."""
    target = _resolve(path, what)
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # no signature to check: trust it
        return target
    try:
        signature.bind()
    except TypeError as error:
        raise HandlerContractError(
            f"{what} {path!r} has the signature {signature}: it must be callable without arguments ({error})", what
        ) from None
    return target


def load_lifecycle(setup: str | None, teardown: str | None, handler_is_async: bool) -> Lifecycle:
    """The hooks of a handler; ``async def`` hooks need an ``async def`` handler (they share its loop)."""
    hooks = {
        what: load_hook(path, what) if path else None
        for what, path in (("--handler-setup", setup), ("--handler-teardown", teardown))
    }
    for what, hook in hooks.items():
        if hook is not None and is_async_callable(hook) and not handler_is_async:
            raise HandlerContractError(
                f"{what} {setup if what == '--handler-setup' else teardown!r} is async def, but the handler is a "
                "plain function: the hook's resources would belong to no running event loop; make the hook a plain "
                "function, or the handler async def",
                what,
            )
    return Lifecycle(setup=hooks["--handler-setup"], teardown=hooks["--handler-teardown"])


def load_for_catchup(handler: str, setup: str | None, teardown: str | None) -> tuple[LoadedHandler, Lifecycle]:
    """What each Spark task of a catch-up loads (and the driver and the pre-flight, to refuse a bad one before
    Spark starts): the handler, which must take one message (catch-up calls it per message), and its hooks."""
    loaded = load_handler(handler)
    check_input(handler, loaded.function, batch=False)
    return loaded, load_lifecycle(setup, teardown, loaded.is_async)


def load_for_worker_process(
    handler: str,
    setup: str | None,
    teardown: str | None,
    log_level: str | None = None,
    log_format: str = "text",
    gc_threshold: int = 0,
    batch: bool = False,
) -> tuple[Callable[[Any], Any], Lifecycle]:
    """What each worker process of the process executor imports once (bind with ``functools.partial``);
    with ``log_level``, the process logs as the pod does (a handler's log lines keep the pod's format), and
    its garbage collector is set as the pod's (``collector``; 0 keeps Python's)."""
    set_first_threshold(gc_threshold)
    if log_level is not None:
        from keyorder.logs import configure_logging

        configure_logging(log_level, log_format)
    loaded = load_handler(handler)
    check_input(handler, loaded.function, batch)
    return loaded.function, load_lifecycle(setup, teardown, loaded.is_async)


def check_signature(path: str, function: Callable[..., Any]) -> None:
    """Refuse a handler that cannot be called as ``handler(message)``: it would dead-letter every message."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins and C callables have no signature: trust them
        return
    try:
        signature.bind(object())
    except TypeError as error:
        raise HandlerContractError(
            f"handler {path!r} has the signature {signature}: it must accept exactly one positional "
            f"argument, the message ({error})"
        ) from None


ONE, MANY = "one message", "a list of messages"
_LIST_TYPES = (
    list,
    tuple,
    collections.abc.Sequence,
    collections.abc.MutableSequence,
    collections.abc.Collection,
    collections.abc.Iterable,
)


def declared_input(function: Callable[..., Any]) -> str | None:
    """What the handler's first parameter says it takes, by its annotation: ``ONE`` (``Message``), ``MANY``
    (``Sequence[Message]``, ``list[Message]``, ...), or ``None``: no annotation, or one that says neither (or
    that does not resolve), in which case nothing is assumed. A wrapper (``functools.wraps``) carries the
    wrapped function's annotations: one that passes its arguments through (``*args, **kwargs``, a tracing
    decorator) is read as the function it wraps; one that names its own parameter may take the other shape
    (a per-message adapter over a batch function), so nothing is assumed of it."""
    if getattr(function, "__wrapped__", None) is not None:
        try:
            own = inspect.signature(function, follow_wrapped=False).parameters.values()
        except (TypeError, ValueError):
            return None
        if any(parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD) for parameter in own):
            return None
        function = inspect.unwrap(function)
    try:
        first = next(iter(inspect.signature(function).parameters.values()), None)
        # a callable object's annotations are its class's __call__'s
        hints = typing.get_type_hints(function if inspect.isroutine(function) else type(function).__call__)
    except Exception:  # a forward reference that does not resolve, a C callable: trust the handler
        return None
    hint = hints.get(first.name) if first is not None else None
    if isinstance(hint, type) and issubclass(hint, Message):
        return ONE
    arguments = typing.get_args(hint)
    if typing.get_origin(hint) in _LIST_TYPES and arguments and arguments[0] is Message:
        return MANY
    return None


def check_input(path: str, function: Callable[..., Any], batch: bool) -> None:
    """Refuse a handler whose annotation says it takes the other shape than it would be given (``batch``:
    a list, else one ``Message``): every call would fail, and each message be retried and dead-lettered."""
    declared, given = declared_input(function), MANY if batch else ONE
    if declared is None or declared == given:
        return
    if batch:
        raise HandlerContractError(
            f"handler {path!r} takes {ONE} (its annotation), but --batch-max-messages above 1 calls it with {MANY}: "
            "point --handler at a batch function (handle_batch(messages: Sequence[Message])), or set "
            "--batch-max-messages 1"
        )
    raise HandlerContractError(
        f"handler {path!r} takes {MANY} (its annotation), but it would be called with {ONE}: set "
        "--batch-max-messages above 1 to run it as a batch handler (keyorder run), or point --handler at a "
        "per-message function (keyorder catchup calls one per message)"
    )
