"""Loading the user's handler from a ``package.module:function`` path, with clear errors.

The handler is the whole user-facing contract: ``handler(message: keyorder.Message)``, either a
plain function (run on worker threads) or an ``async def`` (run as asyncio tasks). A bad path is
reported at start-up, naming exactly what could not be found, instead of failing on the first
message.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


class HandlerLoadError(ValueError):
    """The handler path does not name an importable callable."""


@dataclass(frozen=True)
class LoadedHandler:
    function: Callable[..., Any]
    is_async: bool
    path: str


def is_async_callable(function: Callable[..., Any]) -> bool:
    """True for ``async def`` functions and objects whose ``__call__`` is ``async def``."""
    if inspect.iscoroutinefunction(function):
        return True
    call = getattr(function, "__call__", None)  # noqa: B004 - we want the attribute, not callable()
    return call is not None and inspect.iscoroutinefunction(call)


def load_handler(path: str) -> LoadedHandler:
    """Import ``package.module:function`` (the attribute may be dotted: ``module:Class.method``)."""
    module_name, separator, attribute = path.partition(":")
    if not separator or not module_name or not attribute:
        raise HandlerLoadError(f"handler {path!r} must look like 'package.module:function'")
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        raise HandlerLoadError(f"handler {path!r}: module {error.name!r} not found") from error
    except Exception as error:
        raise HandlerLoadError(
            f"handler {path!r}: importing {module_name!r} failed: {type(error).__name__}: {error}"
        ) from error
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as error:
            raise HandlerLoadError(f"handler {path!r}: {module_name!r} has no attribute {attribute!r}") from error
    if not callable(target):
        raise HandlerLoadError(f"handler {path!r} is a {type(target).__name__}, not a callable")
    check_signature(path, target)
    return LoadedHandler(function=target, is_async=is_async_callable(target), path=path)


def check_signature(path: str, function: Callable[..., Any]) -> None:
    """Refuse a handler that cannot be called as ``handler(message)``: it would dead-letter every message."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # some builtins and C callables have no signature: trust them
        return
    try:
        signature.bind(object())
    except TypeError as error:
        raise HandlerLoadError(
            f"handler {path!r} has the signature {signature}: it must accept exactly one positional "
            f"argument, the message ({error})"
        ) from None
