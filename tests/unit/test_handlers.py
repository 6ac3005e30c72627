"""load_handler: good paths (sync, async, dotted attributes) and errors that name what is wrong."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from keyorder.adapters.handlers import HandlerLoadError, is_async_callable, load_handler

SAMPLES = "tests.unit.sample_handlers"


@pytest.mark.parametrize(
    ("attribute", "is_async", "result"),
    [
        ("sync_handler", False, "sync:m"),
        ("async_handler", True, "async:m"),
        ("Handlers.static", False, "static:m"),
        ("Handlers.klass", False, "Handlers:m"),
        ("Handlers.async_static", True, "async-static:m"),
        ("async_instance", True, "async-callable:m"),
        ("sync_instance", False, "sync-callable:m"),
    ],
)
def test_load_good_paths(attribute: str, is_async: bool, result: str) -> None:
    path = f"{SAMPLES}:{attribute}"
    loaded = load_handler(path)
    assert loaded.path == path
    assert loaded.is_async is is_async
    outcome = loaded.function("m")
    if is_async:
        outcome = asyncio.run(outcome)
    assert outcome == result


def test_is_async_callable_on_lambdas_and_builtins() -> None:
    assert is_async_callable(lambda message: message) is False
    assert is_async_callable(print) is False


@pytest.fixture
def make_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Writes a uniquely named module on a temporary sys.path entry; returns its name."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def create(source: str) -> str:
        name = f"ko_handler_{uuid.uuid4().hex[:12]}"
        (tmp_path / f"{name}.py").write_text(source)
        names.append(name)
        return name

    yield create
    for name in names:
        sys.modules.pop(name, None)


def test_load_from_a_fresh_module_file(make_module: Callable[[str], str]) -> None:
    name = make_module("def handle(message):\n    return message * 2\n")
    assert load_handler(f"{name}:handle").function(21) == 42


@pytest.mark.parametrize("path", ["no_colon", "module.only", ":handler", "module:", "", ":"])
def test_bad_format(path: str) -> None:
    with pytest.raises(HandlerLoadError, match=r"must look like 'package\.module:function'") as caught:
        load_handler(path)
    assert repr(path) in str(caught.value)


def test_missing_module_is_named() -> None:
    with pytest.raises(HandlerLoadError) as caught:
        load_handler("ko_no_such_module_zz:handle")
    assert "module 'ko_no_such_module_zz' not found" in str(caught.value)
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_missing_submodule_is_named() -> None:
    with pytest.raises(HandlerLoadError, match=r"module 'tests\.unit\.ko_missing_submodule' not found"):
        load_handler("tests.unit.ko_missing_submodule:handle")


def test_missing_dependency_of_the_handler_module_is_named(make_module: Callable[[str], str]) -> None:
    name = make_module("import ko_not_installed_dependency\n\ndef handle(message):\n    pass\n")
    with pytest.raises(HandlerLoadError, match="module 'ko_not_installed_dependency' not found"):
        load_handler(f"{name}:handle")


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("raise RuntimeError('boom at import')\n", "RuntimeError: boom at import"),
        ("def handle(message)\n    pass\n", "SyntaxError"),
        ("import json\njson.loads('{')\n", "JSONDecodeError"),
    ],
)
def test_module_failing_at_import_is_reported(make_module: Callable[[str], str], source: str, error: str) -> None:
    name = make_module(source)
    with pytest.raises(HandlerLoadError) as caught:
        load_handler(f"{name}:handle")
    message = str(caught.value)
    assert f"importing {name!r} failed" in message
    assert error in message


@pytest.mark.parametrize("attribute", ["nope", "Handlers.nope", "nope.deeper"])
def test_missing_attribute_is_named(attribute: str) -> None:
    with pytest.raises(HandlerLoadError) as caught:
        load_handler(f"{SAMPLES}:{attribute}")
    assert f"{SAMPLES!r} has no attribute {attribute!r}" in str(caught.value)
    assert isinstance(caught.value.__cause__, AttributeError)


def test_non_callable_is_reported_with_its_type() -> None:
    with pytest.raises(HandlerLoadError, match="is a int, not a callable"):
        load_handler(f"{SAMPLES}:NOT_CALLABLE")


def test_handler_load_error_is_a_value_error() -> None:
    assert issubclass(HandlerLoadError, ValueError)


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("def handle(a, b):\n    pass\n", "(a, b)"),
        ("def handle():\n    pass\n", "()"),
        ("def handle(*, message):\n    pass\n", "(*, message)"),
        ("class C:\n    def method(self, message):\n        pass\nhandle = C.method\n", "(self, message)"),
        ("async def handle(message, extra):\n    pass\n", "(message, extra)"),
    ],
)
def test_handler_with_the_wrong_signature_is_refused(
    make_module: Callable[[str], str], source: str, shown: str
) -> None:
    name = make_module(source)
    with pytest.raises(HandlerLoadError) as caught:
        load_handler(f"{name}:handle")
    message = str(caught.value)
    assert f"{name}:handle" in message and shown in message and "one positional argument" in message


@pytest.mark.parametrize(
    "source",
    [
        "def handle(message, retries=3):\n    pass\n",
        "def handle(*args, **kwargs):\n    pass\n",
        "def handle(message, /, *, flag=False):\n    pass\n",
        "import functools\nhandle = functools.partial(lambda config, message: None, {})\n",
    ],
)
def test_handler_callable_with_one_argument_is_accepted(make_module: Callable[[str], str], source: str) -> None:
    name = make_module(source)
    assert load_handler(f"{name}:handle").path == f"{name}:handle"
