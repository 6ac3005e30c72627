"""A resource's Kafka client lives as long as its configuration: replaced and closed on a change or a delete."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from keyorder_operator.lag_reader import IsolatedLagSource
from keyorder_operator.observe import KafkaLagSource, LagSample, LagUnavailable
from keyorder_operator.reconcile import OperatorContext


class ClosableLagSource:
    """A stand-in LagSource that records whether it was closed (no broker: only the lifecycle is tested).
    Each one is added to ``built``, a list of the test's own (no state shared between tests)."""

    def __init__(self, properties: dict[str, str], built: list[ClosableLagSource]) -> None:
        self.properties, self.closed = properties, False
        built.append(self)

    def sample(self, topics: Sequence[str], group: str, now: float) -> LagSample:
        raise LagUnavailable("not sampled here")

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def built() -> list[ClosableLagSource]:
    """The sources this test's context built, in order."""
    return []


@pytest.fixture
def context(built: list[ClosableLagSource]) -> OperatorContext:
    return OperatorContext(kube=None, lag_source_for=lambda properties: ClosableLagSource(properties, built))  # type: ignore[arg-type]


def test_the_same_configuration_reuses_the_client(context, built):
    first = context.lag_source("ns", "a", {"bootstrap.servers": "k:9092"})
    assert context.lag_source("ns", "a", {"bootstrap.servers": "k:9092"}) is first
    assert built == [first.inner] and not first.inner.closed


def test_a_rotated_credential_closes_the_old_client(context, built):
    old = context.lag_source("ns", "a", {"bootstrap.servers": "k:9092", "sasl.password": "old"})
    new = context.lag_source("ns", "a", {"bootstrap.servers": "k:9092", "sasl.password": "new"})
    assert new is not old and old.inner.closed and not new.inner.closed
    assert built == [old.inner, new.inner]
    assert new.inner.properties["sasl.password"] == "new"


def test_resources_never_share_a_client_and_a_deleted_ones_is_closed(context, built):
    a = context.lag_source("ns", "a", {"bootstrap.servers": "k:9092"})
    b = context.lag_source("ns", "b", {"bootstrap.servers": "k:9092"})
    assert a is not b and built == [a.inner, b.inner]
    context.forget_lag_source("ns", "a")
    assert a.inner.closed and not b.inner.closed
    context.forget_lag_source("ns", "gone")  # nothing to close: no error


def test_a_closed_kafka_source_refuses_to_sample():
    source = KafkaLagSource({"bootstrap.servers": "127.0.0.1:9"})
    source.close()
    with pytest.raises(LagUnavailable, match="closed"):
        source.sample(["orders"], "orders", 0.0)


def test_a_lag_source_asked_for_after_the_readers_closed_starts_no_child():
    """A full run failed with 'subprocess ... is still running' after an operator test: a poll still under
    way when the operator stopped asked for a namespace's lag source after ``LagReaders.close`` and started a
    child that nothing stopped any more."""
    from keyorder_operator.lag_reader import LagReaders

    started: list[int] = []

    def start_reader(memory_bytes: int) -> object:
        started.append(memory_bytes)
        raise AssertionError("a reader process was started after close")

    readers = LagReaders(start_reader=start_reader)  # type: ignore[arg-type]
    readers.close()
    source = readers.source("late", {"bootstrap.servers": "127.0.0.1:9"})
    with pytest.raises(LagUnavailable, match="clos"):
        source.sample(["orders"], "orders", 0.0)
    assert started == [] and len(readers) == 0
    source.close()


def test_a_bad_property_is_lag_unavailable_without_its_value():
    source = KafkaLagSource({"bootstrap.servers": "127.0.0.1:9", "security.protocol": "NOT-A-PROTOCOL-xyz"})
    with pytest.raises(LagUnavailable) as error:
        source.sample(["orders"], "orders", 0.0)
    message = str(error.value)
    assert "could not be built" in message and "security.protocol" in message, message
    assert "NOT-A-PROTOCOL-xyz" not in message, message


def test_the_context_reads_each_namespaces_lag_in_a_child_process_of_its_own():
    """Issue 37 finding 1: by default a resource's Kafka reads run in its namespace's child process
    (``lag_reader.LagReaders``), not on an AdminClient inside the operator; each resource has a source of its
    own, closed on its own, and the namespace's reader goes with its last resource."""
    context = OperatorContext(kube=None)  # type: ignore[arg-type]
    a = context.lag_source("ns", "a", {"bootstrap.servers": "127.0.0.1:9"})
    b = context.lag_source("ns", "b", {"bootstrap.servers": "127.0.0.1:9"})
    assert isinstance(a.inner, IsolatedLagSource) and isinstance(b.inner, IsolatedLagSource)
    assert a.inner is not b.inner and a.inner.reader is b.inner.reader
    assert a.inner.configuration == b.inner.configuration  # the same properties: one client in the child
    context.forget_lag_source("ns", "a")
    assert context.lag_readers.reader("ns") is a.inner.reader
    context.forget_lag_source("ns", "b")
    assert context.lag_readers.reader("ns") is None
    with pytest.raises(LagUnavailable, match="closed"):
        a.inner.sample(["orders"], "orders", 0.0)
