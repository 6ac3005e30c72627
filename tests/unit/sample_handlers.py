"""Handlers for ``test_handlers``: loaded by path, as ``keyorder run --handler`` would load them."""

from __future__ import annotations

from typing import Any

NOT_CALLABLE = 42


def sync_handler(message: Any) -> str:
    return f"sync:{message}"


async def async_handler(message: Any) -> str:
    return f"async:{message}"


class Handlers:
    @staticmethod
    def static(message: Any) -> str:
        return f"static:{message}"

    @classmethod
    def klass(cls, message: Any) -> str:
        return f"{cls.__name__}:{message}"

    @staticmethod
    async def async_static(message: Any) -> str:
        return f"async-static:{message}"


class AsyncCallable:
    async def __call__(self, message: Any) -> str:
        return f"async-callable:{message}"


class SyncCallable:
    def __call__(self, message: Any) -> str:
        return f"sync-callable:{message}"


async_instance = AsyncCallable()
sync_instance = SyncCallable()
