"""What the operator's handlers need from the outside world, in one object the tests can assemble.

The Kubernetes client, the Kafka lag sources (one per resource, replaced when its credentials
change; their Kafka reads run in one child process per namespace: ``lag_reader.LagReaders``), the pod
admin calls, the clock, the metrics and the handler pool's size. The operator binary builds it from
its flags; the tests build it around the API emulator and the real broker.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

from keyorder.config import ConfigError
from keyorder_operator.builders import admin_secret_name, selector_labels
from keyorder_operator.kafka_config import CredentialsError, operator_kafka_config, pods_drain_problem
from keyorder_operator.kube import Kube
from keyorder_operator.lag_reader import LagReaders
from keyorder_operator.objects import AppliedObjects
from keyorder_operator.observe import BoundedLagSource, LagSource, LagUnavailable
from keyorder_operator.operator_metrics import OperatorMetrics
from keyorder_operator.pod_admin import fetch_reports, push_workers
from keyorder_operator.restart import AUTOSCALER_SAVE_SECONDS, became_active
from keyorder_operator.spec import OrderedConsumerSpec
from keyorder_operator.status_view import WrittenStatus


@dataclass
class PollMemory:
    """What one resource's poll keeps for the next one in the operator's memory, not in status: status is
    written only when what it shows changed, so a steady poll writes nothing. A restarted operator starts
    from what status has: the part of the autoscaler's memory ``restart`` keeps in ``status.autoscaler``;
    so does one whose memory is older than ``restart.memory_lasts`` (``OperatorContext.poll_memory``)."""

    looked_at: float | None = None
    """When this process last looked at the resource, due or not (monotonic): the memory's age."""
    started_at: float | None = None
    """When the last poll started (wall clock): the schedule counts from it."""
    autoscaler: dict[str, Any] | None = None
    """The policy's memory after the last decision, in the ``status.state_to_status`` form (``Poll.remember``)."""
    autoscaler_saved_at: float | None = None
    """When this process last wrote ``status.autoscaler`` (wall clock): the write rate counts from it."""
    last_sample: dict[str, Any] | None = None
    """The last lag sample (``status.sample_to_status``): rates are measured against it."""
    written: WrittenStatus = field(default_factory=WrittenStatus)
    """This process's status writes that the watched body did not show at the last poll (times monotonic):
    the next poll compares with them laid over the body (``status_view``), not with a body that lags behind
    them."""


DELETED_REMEMBERED = 10_000
"""Deleted resources' UIDs kept: a poll in flight at a delete is bounded in time, so the newest suffice."""


@dataclass
class OperatorContext:
    """What the handlers need from the outside world; tests replace parts of it."""

    kube: Kube
    lag_source_for: Callable[[dict[str, str]], LagSource] | None = None
    """Builds a resource's lag source from its Kafka configuration (default: ``lag_readers``, whose Kafka
    clients run in a child process per namespace: a tenant's broker cannot crash or hang the operator or
    another namespace's reads)."""
    lag_readers: LagReaders = field(default_factory=LagReaders)
    """The namespaces' lag reader processes (``lag_reader``), used unless ``lag_source_for`` is given."""
    clock: Callable[[], float] = time.time
    monotonic: Callable[[], float] = time.monotonic
    """For durations (a poll's): never goes back when the wall clock is set."""
    push: Callable[..., tuple[int, list[str]]] = push_workers
    fetch_reports: Callable[..., tuple[list[dict[str, Any]], list[str]]] = fetch_reports
    tick_seconds: float = 5.0
    handler_threads: int = 32
    """kopf's pool for the (synchronous) handlers: each poll waits on Kafka at most ``lag_wait_seconds``
    and on the pods about 2 s, so a few dozen threads keep many resources on time."""
    lag_wait_seconds: float = 2.0
    lag_backoff_seconds: tuple[float, float] = (15.0, 120.0)
    """A failing cluster is asked again after the first period, doubling up to the second."""
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    applied: AppliedObjects = field(default_factory=AppliedObjects)
    autoscaler_save_seconds: float = AUTOSCALER_SAVE_SECONDS
    """At most one write of a resource's ``status.autoscaler`` in this many seconds, besides the one that
    rides along with a resize (``restart.AUTOSCALER_SAVE_SECONDS``)."""
    started_at: float | None = None
    """When the operator started (wall clock; default: when the context is built): the moment it became
    active (``active_since``) unless its first look at a resource came much later."""
    _last_tick: float | None = None
    """When a poll last looked at any resource (monotonic; at first, when the context was built)."""
    _active_since: float = 0.0
    """``active_since``: resources that existed before are first polled spread over their first interval
    (``restart.first_poll_at``)."""
    _activity_lock: threading.Lock = field(default_factory=threading.Lock)
    _lag_sources: dict[tuple[str, str], tuple[tuple[tuple[str, str], ...], LagSource]] = field(default_factory=dict)
    _lag_sources_lock: threading.Lock = field(default_factory=threading.Lock)
    """Guards ``_lag_sources``: kopf runs the handlers of different resources on different pool threads."""
    _deleted: OrderedDict[str, None] = field(default_factory=OrderedDict)
    """UIDs of deleted resources (the newest ``DELETED_REMEMBERED``): none of them is polled again."""
    _deleted_lock: threading.Lock = field(default_factory=threading.Lock)
    _memories: dict[tuple[str, str], PollMemory] = field(default_factory=dict)
    _memories_lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.started_at is None:
            self.started_at = self.clock()
        self._last_tick = self.monotonic()
        self._active_since = self.started_at

    def poll_memory(
        self, namespace: str, name: str, looked_at: float | None = None, lasts: float = math.inf
    ) -> PollMemory:
        """The resource's poll memory: empty for a resource this process has not polled yet. A poll passes
        ``looked_at`` (monotonic) and how long a memory ``lasts`` (``restart.memory_lasts``): a memory not
        looked at for longer is from before a pause (kopf's peering paused this replica, and another one
        may have polled and written status since), so the poll gets an empty one and resumes from status,
        as after a restart."""
        key = (namespace, name)
        with self._memories_lock:
            memory = self._memories.get(key)
            if memory is None or (
                looked_at is not None and memory.looked_at is not None and looked_at - memory.looked_at > lasts
            ):
                memory = self._memories[key] = PollMemory()
            if looked_at is not None:
                memory.looked_at = looked_at
            return memory

    @property
    def active_since(self) -> float:
        """When this process became active (wall clock): its start, or the first look at a resource after
        ``restart.ACTIVE_GAP_TICKS`` ticks without one (``looked``). A kopf peering standby's timers run only
        once it takes over, maybe hours after it started; a paused replica's, once it resumes."""
        with self._activity_lock:
            return self._active_since

    def looked(self, now: float, monotonic: float) -> float:
        """A poll looked at a resource at ``now`` (wall clock; ``monotonic``): ``active_since``, updated."""
        with self._activity_lock:
            if became_active(self._last_tick, monotonic, self.tick_seconds):
                self._active_since = now
            # polls on other threads may tell their looks a little out of order
            self._last_tick = monotonic if self._last_tick is None else max(self._last_tick, monotonic)
            return self._active_since

    @contextlib.contextmanager
    def polling(self, uid: str, namespace: str, name: str) -> Iterator[bool]:
        """Around a poll of a resource: yields False once it was deleted (no poll then); a poll that was
        already running when the delete came is cleaned up after, so it leaves no metric series, no
        applied-object memory and no Kafka client behind (kopf runs the delete handler while a timer's
        last run may still be in flight)."""
        with self._deleted_lock:
            alive = uid not in self._deleted
        yield alive
        with self._deleted_lock:
            deleted_meanwhile = alive and uid in self._deleted
        if deleted_meanwhile:
            self._let_go(namespace, name)

    def forget(self, uid: str, namespace: str, name: str) -> None:
        """A deleted resource: drop its metric series and applied objects, close its Kafka client, and
        let no poll of it run again."""
        with self._deleted_lock:
            self._deleted[uid] = None
            while len(self._deleted) > DELETED_REMEMBERED:
                self._deleted.popitem(last=False)
        self._let_go(namespace, name)

    def _let_go(self, namespace: str, name: str) -> None:
        with self._memories_lock:
            self._memories.pop((namespace, name), None)
        if self.kube is not None:
            self.kube.forget_secret(namespace, admin_secret_name(name))
            if self.kube.cache is not None:
                self.kube.cache.forget_pods(namespace, selector_labels(name))
        self.metrics.forget(namespace, name)
        self.forget_lag_source(namespace, name)
        self.applied.forget(namespace, name)

    def lag_source(self, namespace: str, name: str, properties: dict[str, str]) -> LagSource:
        """The resource's lag source for ``properties`` (a handle on its namespace's reader process): one
        per resource, replaced (and the old one closed) when its configuration changes, e.g. a rotated
        password. The new one is built before the old one is closed, so the namespace's reader process
        lives on for its other resources. Raises ``LagUnavailable``."""
        wanted = tuple(sorted(properties.items()))
        with self._lag_sources_lock:
            current = self._lag_sources.get((namespace, name))
            if current is not None and current[0] == wanted:
                return current[1]
            first, longest = self.lag_backoff_seconds
            source: LagSource = BoundedLagSource(
                self._build_lag_source(namespace, properties),
                first_seconds=first,
                longest_seconds=longest,
                wait_seconds=self.lag_wait_seconds,
            )
            self._lag_sources[(namespace, name)] = (wanted, source)
        if current is not None:
            current[1].close()
        return source

    def _build_lag_source(self, namespace: str, properties: dict[str, str]) -> LagSource:
        if self.lag_source_for is not None:
            return self.lag_source_for(properties)
        return self.lag_readers.source(namespace, properties)

    def close_lag_sources(self) -> None:
        """The operator is stopping: close every resource's lag source and stop every reader process."""
        with self._lag_sources_lock:
            sources, self._lag_sources = list(self._lag_sources.values()), {}
        for _properties, source in sources:
            source.close()
        self.lag_readers.close()

    def forget_lag_source(self, namespace: str, name: str) -> None:
        """Close a deleted resource's lag source (its Kafka connections; the namespace's last one stops the
        namespace's reader process)."""
        with self._lag_sources_lock:
            current = self._lag_sources.pop((namespace, name), None)
        if current is not None:
            current[1].close()


def kafka_properties(context: OperatorContext, spec: OrderedConsumerSpec, namespace: str) -> dict[str, str]:
    """The operator's Kafka configuration for a resource (``kafka_config``); any failure is ``LagUnavailable``
    naming the Secret or property (never a value). So is a spec whose pods would refuse to start because their
    drains could outlast the Secret's ``max.poll.interval.ms`` (``pods_drain_problem``): the Secret is read
    here, so this is where the operator can tell, and the pods' refusal shows only in their logs."""
    reference = spec.kafka.properties_secret_ref
    if reference is None:
        properties = operator_kafka_config(spec.kafka.bootstrap_servers)
    else:
        try:
            secret = context.kube.read_secret(namespace, reference.name)
            properties = operator_kafka_config(
                spec.kafka.bootstrap_servers, secret, reference.key, f"{namespace}/{reference.name}"
            )
        except ApiException as error:
            what = "does not exist" if error.status == 404 else f"cannot be read: {error.status} {error.reason}"
            raise LagUnavailable(
                f"Secret {namespace}/{reference.name} (spec.kafka.propertiesSecretRef) {what}"
            ) from None
        except CredentialsError as error:  # a property the operator refuses, named
            raise LagUnavailable(str(error), condition="KafkaPropertyRefused") from None
        except ConfigError as error:
            raise LagUnavailable(str(error)) from None
    try:
        problem = pods_drain_problem(spec, properties)
    except ConfigError as error:  # max.poll.interval.ms is not a number
        raise LagUnavailable(str(error)) from None
    if problem is not None:
        raise LagUnavailable(problem)
    return properties
