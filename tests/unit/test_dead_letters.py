"""The pure parts of dead-lettering: the DLQ topic name and the provenance headers."""

from __future__ import annotations

import pytest

from keyorder.adapters.dead_letters import (
    HEADER_ATTEMPTS,
    HEADER_ERROR,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_TOPIC,
    MAX_ERROR_HEADER_BYTES,
    dead_letter_headers,
    dead_letter_topic,
)
from keyorder.message import Message


@pytest.mark.parametrize(
    ("template", "source", "expected"),
    [
        ("{topic}.dlq", "orders", "orders.dlq"),
        ("dlq.{topic}.v1", "orders", "dlq.orders.v1"),
        ("all-dead-letters", "orders", "all-dead-letters"),  # one shared DLQ
        ("{topic}-{topic}", "a", "a-a"),
        ("{topic}.dlq", "team.orders_v2", "team.orders_v2.dlq"),
    ],
)
def test_dead_letter_topic(template: str, source: str, expected: str) -> None:
    assert dead_letter_topic(template, source) == expected


def message(headers: tuple[tuple[str, bytes | None], ...] = ()) -> Message:
    return Message(topic="orders", partition=7, offset=123456, key=b"k", value=b"v", headers=headers)


def test_headers_keep_originals_first_then_add_provenance() -> None:
    original = (("trace-id", b"abc"), ("trace-id", b"def"), ("empty", None))
    headers = dead_letter_headers(message(original), ValueError("bad payload"), attempts=5)
    assert headers == [
        ("trace-id", b"abc"),  # original order, repeated names kept
        ("trace-id", b"def"),
        ("empty", b""),  # a null header value becomes empty bytes
        (HEADER_TOPIC, b"orders"),
        (HEADER_PARTITION, b"7"),
        (HEADER_OFFSET, b"123456"),
        (HEADER_ERROR, b"ValueError: bad payload"),
        (HEADER_ATTEMPTS, b"5"),
    ]


def test_header_names() -> None:
    assert (HEADER_TOPIC, HEADER_PARTITION, HEADER_OFFSET, HEADER_ERROR, HEADER_ATTEMPTS) == (
        "keyorder.original.topic",
        "keyorder.original.partition",
        "keyorder.original.offset",
        "keyorder.error",
        "keyorder.attempts",
    )


def test_headers_without_original_headers() -> None:
    headers = dead_letter_headers(message(), KeyError("missing"), attempts=1)
    assert [name for name, _ in headers] == [
        HEADER_TOPIC,
        HEADER_PARTITION,
        HEADER_OFFSET,
        HEADER_ERROR,
        HEADER_ATTEMPTS,
    ]
    assert dict(headers)[HEADER_ERROR] == b"KeyError: 'missing'"
    assert all(isinstance(value, bytes) for _, value in headers)


@pytest.mark.parametrize("length", [0, 1000, MAX_ERROR_HEADER_BYTES, 5000])
def test_error_header_is_truncated_to_1024_bytes(length: int) -> None:
    error = RuntimeError("x" * length)
    value = dict(dead_letter_headers(message(), error, attempts=3))[HEADER_ERROR]
    full = f"RuntimeError: {'x' * length}".encode()
    assert value == full[:MAX_ERROR_HEADER_BYTES]
    assert len(value) == min(len(full), 1024)


def test_error_header_survives_unencodable_text() -> None:
    value = dict(dead_letter_headers(message(), ValueError("bad \udc80 surrogate"), attempts=1))[HEADER_ERROR]
    assert value == b"ValueError: bad ? surrogate"


def test_truncated_error_header_is_valid_utf8() -> None:
    error = ValueError("a" + "é" * 2000)  # 13 ASCII bytes, then 2-byte characters: byte 1024 splits one
    value = dict(dead_letter_headers(message(), error, attempts=1))[HEADER_ERROR]
    assert len(value) <= MAX_ERROR_HEADER_BYTES
    assert value.decode("utf-8").startswith("ValueError: aéé")
