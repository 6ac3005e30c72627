"""A hostile stand-in for a tenant's Kafka broker: what a tenant can point ``spec.kafka.bootstrapServers`` at.

Three behaviours, on 127.0.0.1 and a free port:

- ``abort``: answers every request (the client's first one is ApiVersions) with 21 bytes: a 4-byte length
  (17), the request's correlation id, ErrorCode 0 and an ApiVersions array count of compact-varint 0, which
  a flexible-version reader decodes as -1. librdkafka's ``rd_kafka_handle_ApiVersion``
  (confluentinc/librdkafka ``src/rdkafka_request.c``, commit 4c3b017) reads that count with
  ``rd_kafka_buf_read_arraycnt`` (``src/rdkafka_buf.h``: ``(int32_t)uvarint - 1``; only counts below -1 fail
  the parse) and calls ``rd_malloc(sizeof(**apis) * ApiArrayCnt)``: a size of about 2^64, malloc returns
  NULL and ``rd_malloc`` (``src/rd.h``) asserts ``p``: SIGABRT, the whole process;
- ``silent``: accepts connections and reads requests, never answers (a hung broker);
- ``bloat``: answers with a frame header announcing ``BLOAT_BYTES`` (just under librdkafka's default
  ``receive.message.max.bytes``) and nothing after it: ``rd_kafka_recv`` (``src/rdkafka_broker.c``) allocates
  a receive buffer of the announced size before the body arrives, so every connection costs ~95 MB.

The response's frame (int32 length, int32 correlation id, then the body; ApiVersions' response header has no
tagged fields even in flexible versions) is Kafka's protocol as ``src/rdkafka_broker.c``'s
``rd_kafka_recv`` reads it.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

BLOAT_BYTES = 99_000_000

ABORTING_BODY = bytes(17)
"""After the correlation id: ErrorCode 0 (2 bytes), array count uvarint 0 (= -1), then zero padding."""


def _read_exactly(connection: socket.socket, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _handle(connection: socket.socket, behaviour: str, stopping: threading.Event) -> None:
    with connection:
        connection.settimeout(0.5)
        while not stopping.is_set():
            try:
                head = _read_exactly(connection, 4)
                if head is None:
                    return
                (size,) = struct.unpack(">i", head)
                request = _read_exactly(connection, size)
                if request is None or len(request) < 8:
                    return
            except TimeoutError:
                continue
            except OSError:
                return
            if behaviour == "silent":
                continue
            (correlation_id,) = struct.unpack(">i", request[4:8])
            payload = struct.pack(">i", correlation_id) + ABORTING_BODY
            frame = struct.pack(">i", len(payload)) + payload
            if behaviour == "bloat":
                frame = struct.pack(">ii", BLOAT_BYTES, correlation_id)
            try:
                connection.sendall(frame)
            except OSError:
                return


@contextmanager
def hostile_broker(behaviour: str = "abort") -> Iterator[str]:
    """Serve ``behaviour`` (``abort``, ``silent`` or ``bloat``) until the block ends; yields ``host:port``."""
    if behaviour not in ("abort", "silent", "bloat"):
        raise ValueError(f"behaviour must be 'abort', 'silent' or 'bloat', not {behaviour!r}")
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    listener.settimeout(0.2)
    stopping = threading.Event()

    def accept() -> None:
        while not stopping.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=_handle, args=(connection, behaviour, stopping), daemon=True).start()

    acceptor = threading.Thread(target=accept, name="hostile-broker", daemon=True)
    acceptor.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stopping.set()
        acceptor.join(2.0)
        listener.close()


if __name__ == "__main__":  # pragma: no cover - the old code's crash, observed from a parent (see the tests)
    import sys

    from keyorder_operator.observe import KafkaLagSource

    with hostile_broker(sys.argv[1] if len(sys.argv) > 1 else "abort") as address:
        source = KafkaLagSource({"bootstrap.servers": address}, timeout=3.0)
        try:
            print(source.sample(["orders"], "orders", 0.0))
        except Exception as error:
            print(f"{type(error).__name__}: {error}")
        finally:
            source.close()
