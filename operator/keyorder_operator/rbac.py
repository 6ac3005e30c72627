"""Every Kubernetes permission the operator needs, as data: its own calls plus kopf's.

``kube.API_CALLS`` lists what keyorder's code calls; ``KOPF_NEEDS`` lists what the kopf framework
calls (read from kopf's sources: its watchers, patching, event posting, peering and cluster
observation); ``PEERING_CHECK_NEEDS`` what keyorder's check of kopf's peering object reads (``peering``).
``required_rules`` merges them for an install mode, so the Helm chart's RBAC can be checked against it in
both directions: every call is allowed, and nothing else is.

A permission is ``(scope, api group, resource, verb)``. Scope ``namespaced`` means "in each
watched namespace" (a Role there, or the ClusterRole when watching the whole cluster);
``cluster`` means a cluster-scoped resource (always a ClusterRole).
"""

from __future__ import annotations

from dataclasses import dataclass

from keyorder_operator.cache import WATCHED_KINDS
from keyorder_operator.kube import API_CALLS
from keyorder_operator.spec import GROUP, PLURAL


@dataclass(frozen=True)
class Need:
    """A set of verbs on one resource, and why kopf needs them."""

    group: str
    resource: str
    verbs: frozenset[str]
    scope: str
    """``namespaced`` or ``cluster``."""
    why: str
    when: str = "always"
    """``always``; ``peering`` (only with --peering); ``discovery`` (only if the install grants kopf's
    cluster observation, which kopf can do without: it then logs a warning and stops noticing
    new namespaces and CRD changes until restarted); ``namespaced-mode`` / ``clusterwide-mode``."""


KOPF_NEEDS = [
    Need(
        GROUP,
        PLURAL,
        frozenset({"list", "watch", "patch"}),
        "namespaced",
        "kopf watches OrderedConsumers and patches their finalizers and progress annotations",
    ),
    Need(
        GROUP,
        f"{PLURAL}/status",
        frozenset({"patch"}),
        "namespaced",
        "kopf writes the handlers' status (conditions, decisions) through the status subresource",
    ),
    Need("", "events", frozenset({"create"}), "namespaced", "kopf posts the Scaled, InvalidSpec and LagUnknown Events"),
    *(
        Need(
            group,
            plural,
            frozenset({"list", "watch"}),
            "namespaced",
            "kopf watches the objects the operator owns (by its label) into the cache the polls read",
        )
        for group, _, plural in WATCHED_KINDS.values()
    ),
    Need(
        "",
        "pods",
        frozenset({"list", "watch"}),
        "namespaced",
        "kopf watches the consumer pods (by their label) into the cache the polls read",
    ),
    Need(
        "kopf.dev",
        "kopfpeerings",
        frozenset({"list", "watch", "patch"}),
        "namespaced",
        "kopf's peering: operator replicas see each other and only one handles resources",
        when="peering+namespaced-mode",
    ),
    Need(
        "kopf.dev",
        "clusterkopfpeerings",
        frozenset({"list", "watch", "patch"}),
        "cluster",
        "kopf's peering, cluster-wide mode",
        when="peering+clusterwide-mode",
    ),
    Need(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        frozenset({"list", "watch"}),
        "cluster",
        "kopf notices the OrderedConsumer CRD being installed, upgraded or removed",
        when="discovery",
    ),
    Need(
        "",
        "namespaces",
        frozenset({"list", "watch"}),
        "cluster",
        "kopf resolves the watched namespaces (only when not watching the whole cluster)",
        when="discovery+namespaced-mode",
    ),
]

PEERING_CHECK_NEEDS = [
    Need(
        "kopf.dev",
        "kopfpeerings",
        frozenset({"get"}),
        "namespaced",
        "keyorder reads the peering object at start-up and on each health probe (without it kopf pauses "
        "every replica, or no standby takes over)",
        when="peering+namespaced-mode",
    ),
    Need(
        "kopf.dev",
        "clusterkopfpeerings",
        frozenset({"get"}),
        "cluster",
        "keyorder reads the peering object at start-up and on each health probe, cluster-wide mode",
        when="peering+clusterwide-mode",
    ),
]

Permission = tuple[str, str, str, str]


def _applies(when: str, *, clusterwide: bool, peering: bool, discovery: bool) -> bool:
    conditions = {
        "always": True,
        "peering": peering,
        "discovery": discovery,
        "namespaced-mode": not clusterwide,
        "clusterwide-mode": clusterwide,
    }
    return all(conditions[part] for part in when.split("+"))


def required_rules(*, clusterwide: bool, peering: bool, discovery: bool) -> set[Permission]:
    """Every ``(scope, group, resource, verb)`` the operator needs in this install mode."""
    needed = {("namespaced", group, resource, verb) for (group, resource), verbs in API_CALLS.items() for verb in verbs}
    for need in (*KOPF_NEEDS, *PEERING_CHECK_NEEDS):
        if _applies(need.when, clusterwide=clusterwide, peering=peering, discovery=discovery):
            needed |= {(need.scope, need.group, need.resource, verb) for verb in need.verbs}
    return needed
