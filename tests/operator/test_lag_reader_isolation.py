"""Issue 37 finding 1 on the real kopf operator: a tenant's hostile broker costs that tenant's resource alone.

The API emulator holds three OrderedConsumers. ``hostile`` points at a broker that aborts librdkafka
(``tests.unit.hostile_broker``: 21 bytes answering ApiVersions) and is read by the operator's real lag
reader (``lag_reader.LagReaders``: the namespace's child process); the two others read an empty topic
(``EmptyTopic``, a stand-in: the reader's Kafka side is tested against Tansu in
tests/integration/test_lag_source_kafka.py). Before, the abort took the operator's process down (here: the
test process); now ``hostile`` says ``LagUnknown`` with the reason ``LagReaderFailed`` (the signal and the
back-off in the message) while the others go on being polled and stay Ready.
"""

from __future__ import annotations

import pytest

from keyorder_operator.lag_reader import READER_FAILED, IsolatedLagSource, LagReaders, RestartBackoff
from keyorder_operator.observe import LagSource
from tests.operator.harness import CR, wait_for, wait_for_polls
from tests.operator.test_operator_deployable import condition, events, operator
from tests.operator.test_operator_status_writes import EmptyTopic, at_rest, stored_status
from tests.unit.hostile_broker import hostile_broker

pytestmark = pytest.mark.timeout(150)


class Readers:
    """The operator's lag sources: the real child-process reader for the hostile broker, ``EmptyTopic`` for the
    others; every reader built is kept, to count its restarts."""

    def __init__(self, hostile_address: str) -> None:
        self.hostile_address = hostile_address
        self.hostile: list[IsolatedLagSource] = []
        # a short first back-off, so the test sees a restart (the product's is 5 s, doubling to 300 s)
        self.readers = LagReaders(backoff=RestartBackoff(first_seconds=1.0, longest_seconds=2.0))

    def __call__(self, properties: dict[str, str]) -> LagSource:
        if properties.get("bootstrap.servers") == self.hostile_address:
            # the hook gets no namespace: the hostile resource's reader is the one of a namespace of its own
            source = self.readers.source("hostile-tenant", properties)
            self.hostile.append(source)
            return source
        return EmptyTopic(properties)


def test_a_hostile_broker_costs_its_resource_alone_and_the_others_are_polled_on(kube):
    with hostile_broker("abort") as address:
        readers = Readers(address)
        with operator(kube.url, lag_source_for=readers) as context:
            context.lag_backoff_seconds = (0.5, 1.0)  # the poll's own back-off, short for the test
            kube.create(CR, at_rest("hostile", address))
            for name in ("steady-a", "steady-b"):
                kube.create(CR, at_rest(name))
            wait_for(
                lambda: condition(kube, "hostile", "LagUnknown").get("reason") == READER_FAILED,
                60,
                "hostile's LagUnknown: LagReaderFailed",
            )
            message = condition(kube, "hostile", "LagUnknown")["message"]
            assert "the lag reader process was killed by SIGABRT (exit code -6)" in message, message
            assert "started again after" in message and "(back-off)" in message, message
            # the reader is started again after its back-off, and killed again: still that resource alone
            wait_for(lambda: sum(source.started for source in readers.hostile) >= 2, 60, "a restarted reader")
            for name in ("steady-a", "steady-b"):
                wait_for_polls(kube, name, 3)
                statuses = {c["type"]: (c["status"], c["reason"]) for c in stored_status(kube, name)["conditions"]}
                assert statuses["Ready"] == ("True", "Reconciled"), statuses
                assert statuses["LagUnknown"] == ("False", "LagMeasured"), statuses
            wait_for_polls(kube, "hostile", 2)  # and the hostile resource itself is still polled
            assert any("SIGABRT" in text for text in events(kube, "LagUnknown"))
