"""RBAC for the API emulator: the operator's requests are authorised against the rules the Helm chart grants.

The rules come from rendering charts/keyorder-operator with the real Helm engine (``helm_python``, offline),
once per test process (``chart_authorizer``), with the chart's default values: the install the tests run
(kopf cluster-wide, no peering), or with ``peering.enabled=true`` (``chart_authorizer(peering=True)``). They are
evaluated as Kubernetes' RBAC authorizer does (https://kubernetes.io/docs/reference/access-authn-authz/rbac/):
a request is allowed when a rule of a role bound to the user (a ClusterRoleBinding anywhere, a RoleBinding in
the request's namespace) matches its API group, its resource (``deployments``, or ``resource/subresource``
such as ``orderedconsumers/status`` and ``deployments/scale``), its verb and, where the rule lists
``resourceNames``, its object name. ClusterRoles with an ``aggregationRule`` collect the rules of the
ClusterRoles their selectors match. The verb is the request's, as the API server names it
(https://kubernetes.io/docs/reference/access-authn-authz/authorization/#determine-the-request-verb):
GET of one object ``get``, of a collection ``list``, with ``?watch=true`` ``watch``; POST ``create``;
PUT ``update``; PATCH ``patch``; DELETE ``delete`` (``deletecollection`` on a collection). A server-side
apply that creates its object is authorised as ``create`` too, as the API server's patch handler does.
Every cluster grants the discovery paths (``/api``, ``/apis``, ``/version``...) to authenticated users
(the ``system:discovery`` and ``system:public-info-viewer`` roles): so does this.

Identities: ``OPERATOR_TOKEN`` is the operator's ServiceAccount, as the chart's bindings name it.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "keyorder-operator"
RELEASE, NAMESPACE = "keyorder", "keyorder-system"
OPERATOR_TOKEN = "keyorder-operator-test-token"
"""The bearer token the operator under test presents: the emulator maps it to the chart's ServiceAccount."""

RBAC_KINDS = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ServiceAccount"}

DEFAULT_CLUSTER_POLICY: list[dict[str, Any]] = [
    {
        "kind": "ClusterRole",
        "metadata": {"name": "system:discovery"},
        "rules": [
            {
                "nonResourceURLs": [
                    "/api",
                    "/api/*",
                    "/apis",
                    "/apis/*",
                    "/healthz",
                    "/livez",
                    "/openapi",
                    "/openapi/*",
                    "/readyz",
                    "/version",
                    "/version/",
                ],
                "verbs": ["get"],
            }
        ],
    },
    {
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "system:discovery"},
        "roleRef": {"kind": "ClusterRole", "name": "system:discovery"},
        "subjects": [{"kind": "Group", "name": "system:authenticated"}],
    },
]
"""What every cluster's bootstrap policy grants to any authenticated user (the discovery paths)."""


@dataclass(frozen=True)
class Identity:
    user: str
    groups: tuple[str, ...] = ("system:authenticated",)

    @classmethod
    def service_account(cls, namespace: str, name: str) -> Identity:
        return cls(
            f"system:serviceaccount:{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
        )


@dataclass(frozen=True)
class Attributes:
    """What the authorizer decides on (Kubernetes' ``authorizer.Attributes``)."""

    verb: str
    path: str
    resource_request: bool
    api_group: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""

    @property
    def qualified_resource(self) -> str:
        return f"{self.resource}.{self.api_group}" if self.api_group else self.resource

    def describe(self) -> str:
        """``PATCH-style`` one-liner for reports: verb, resource, namespace, name."""
        resource = self.resource + (f"/{self.subresource}" if self.subresource else "")
        where = f" in {self.namespace}" if self.namespace else " (cluster scope)"
        return f"{self.verb} {self.api_group or 'core'}/{resource}{where}" + (f" name={self.name}" if self.name else "")


@dataclass(frozen=True)
class Rule:
    api_groups: frozenset[str]
    resources: frozenset[str]
    verbs: frozenset[str]
    resource_names: frozenset[str]
    non_resource_urls: frozenset[str]

    @classmethod
    def of(cls, rule: Mapping[str, Any]) -> Rule:
        return cls(
            frozenset(rule.get("apiGroups") or ()),
            frozenset(rule.get("resources") or ()),
            frozenset(rule.get("verbs") or ()),
            frozenset(rule.get("resourceNames") or ()),
            frozenset(rule.get("nonResourceURLs") or ()),
        )

    def allows(self, attributes: Attributes) -> bool:
        if not ({"*", attributes.verb} & self.verbs):
            return False
        if not attributes.resource_request:
            return any(
                url == "*" or url == attributes.path or (url.endswith("*") and attributes.path.startswith(url[:-1]))
                for url in self.non_resource_urls
            )
        if not ({"*", attributes.api_group} & self.api_groups):
            return False
        combined = attributes.resource + (f"/{attributes.subresource}" if attributes.subresource else "")
        if not (
            {"*", combined} & self.resources
            or (attributes.subresource and f"*/{attributes.subresource}" in self.resources)
        ):
            return False
        return not self.resource_names or attributes.name in self.resource_names


class Authorizer:
    """Kubernetes RBAC over a set of Role/ClusterRole/RoleBinding/ClusterRoleBinding manifests."""

    def __init__(self, documents: Iterable[Mapping[str, Any]]) -> None:
        docs = [doc for doc in documents if doc and doc.get("kind") in RBAC_KINDS]
        self.cluster_roles: dict[str, list[Rule]] = {}
        self.roles: dict[tuple[str, str], list[Rule]] = {}
        aggregated: dict[str, list[dict[str, str]]] = {}
        labels: dict[str, dict[str, str]] = {}
        for doc in docs:
            meta = doc.get("metadata") or {}
            rules = [Rule.of(rule) for rule in doc.get("rules") or []]
            if doc["kind"] == "ClusterRole":
                self.cluster_roles[meta["name"]] = rules
                labels[meta["name"]] = meta.get("labels") or {}
                selectors = (doc.get("aggregationRule") or {}).get("clusterRoleSelectors") or []
                if selectors:
                    aggregated[meta["name"]] = [selector.get("matchLabels") or {} for selector in selectors]
            elif doc["kind"] == "Role":
                self.roles[(meta.get("namespace") or "", meta["name"])] = rules
        # The aggregation controller (kubernetes/kubernetes pkg/controller/clusterroleaggregation/
        # clusterroleaggregation_controller.go) sets an aggregated role's rules to the union of the rules of
        # the roles its selectors match, and keeps doing so as those change: so aggregation is transitive
        # (the built-in admin collects edit, which collects view). Repeated to a fixed point here.
        own = {name: list(rules) for name, rules in self.cluster_roles.items()}
        changed = True
        while changed:
            changed = False
            for name, selectors in aggregated.items():
                union = list(own[name])
                for other, other_labels in labels.items():
                    if other != name and any(
                        all(other_labels.get(k) == v for k, v in selector.items()) for selector in selectors
                    ):
                        union += [rule for rule in self.cluster_roles[other] if rule not in union]
                if set(union) != set(self.cluster_roles[name]):
                    self.cluster_roles[name], changed = union, True
        self.cluster_bindings = [doc for doc in docs if doc["kind"] == "ClusterRoleBinding"]
        self.bindings = [doc for doc in docs if doc["kind"] == "RoleBinding"]
        self.service_accounts = [doc for doc in docs if doc["kind"] == "ServiceAccount"]

    @staticmethod
    def _binds(binding: Mapping[str, Any], identity: Identity) -> bool:
        for subject in binding.get("subjects") or []:
            kind, name = subject.get("kind"), subject.get("name")
            if kind == "User" and name == identity.user:
                return True
            if kind == "Group" and name in identity.groups:
                return True
            if kind == "ServiceAccount" and identity.user == (
                f"system:serviceaccount:{subject.get('namespace') or (binding.get('metadata') or {}).get('namespace')}"
                f":{name}"
            ):
                return True
        return False

    def _rules(self, identity: Identity, namespace: str) -> Iterable[Rule]:
        for binding in self.cluster_bindings:
            if self._binds(binding, identity):
                yield from self.cluster_roles.get(binding["roleRef"]["name"], [])
        if not namespace:
            return
        for binding in self.bindings:
            if (binding.get("metadata") or {}).get("namespace") == namespace and self._binds(binding, identity):
                ref = binding["roleRef"]
                if ref["kind"] == "ClusterRole":
                    yield from self.cluster_roles.get(ref["name"], [])
                else:
                    yield from self.roles.get((namespace, ref["name"]), [])

    def allows(self, identity: Identity, attributes: Attributes) -> bool:
        return any(rule.allows(attributes) for rule in self._rules(identity, attributes.namespace))

    def rules_for(self, identity: Identity, namespace: str = "") -> list[Rule]:
        return list(self._rules(identity, namespace))


def forbidden_message(identity: Identity, attributes: Attributes) -> str:
    """The API server's words for a refusal (``responsewriters.forbiddenMessage`` + ``errors.NewForbidden``)."""
    if not attributes.resource_request:
        return f'forbidden: User "{identity.user}" cannot {attributes.verb} path "{attributes.path}"'
    resource = attributes.resource + (f"/{attributes.subresource}" if attributes.subresource else "")
    where = f'in the namespace "{attributes.namespace}"' if attributes.namespace else "at the cluster scope"
    reason = (
        f'User "{identity.user}" cannot {attributes.verb} resource "{resource}" in API group '
        f'"{attributes.api_group}" {where}'
    )
    subject = attributes.qualified_resource + (f' "{attributes.name}"' if attributes.name else "")
    return f"{subject} is forbidden: {reason}"


def request_verb(method: str, params: Mapping[str, str], has_name: bool) -> str:
    """The request's verb, as the API server names it for authorization."""
    method = method.upper()
    if method in ("GET", "HEAD"):
        if params.get("watch") in ("true", "1"):
            return "watch"
        return "get" if has_name else "list"
    if method == "DELETE" and not has_name:
        return "deletecollection"
    return {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(method, method.lower())


def request_attributes(
    method: str,
    path: str,
    params: Mapping[str, str],
    group: str | None,
    plural: str | None,
    namespace: str | None,
    name: str | None,
    subresource: str | None,
) -> Attributes:
    """The authorization attributes of a request (kmock's parse of the path, corrected where it differs)."""
    parts = [part for part in path.split("/") if part]
    if group is not None and plural is None and parts[:3] == ["api", "v1", "namespaces"] and len(parts) == 4:
        plural, name, namespace = "namespaces", parts[3], parts[3]  # GET /api/v1/namespaces/NAME
    if group is None or plural is None:
        return Attributes(request_verb(method, {}, True), path, False)
    if not name and method.upper() in ("GET", "HEAD"):
        selector = params.get("fieldSelector", "")
        if selector.startswith("metadata.name=") and "," not in selector:  # the API server does this too
            name = selector.removeprefix("metadata.name=")
    verb = request_verb(method, params, bool(name) and method.upper() != "POST")
    return Attributes(verb, path, True, group, plural, subresource or "", namespace or "", name or "")


@functools.cache
def chart_documents(peering: bool = False) -> tuple[dict[str, Any], ...]:
    """The chart's RBAC manifests and ServiceAccount, rendered once per test process with default values
    (with ``peering``: ``peering.enabled=true``, the high-availability install)."""
    import helm_python

    values = {"peering": {"enabled": True}} if peering else {}
    with helm_python.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    documents = []
    for path, text in sorted(rendered.items()):
        if path.endswith(".yaml"):
            documents += [doc for doc in yaml.safe_load_all(text) if doc and doc.get("kind") in RBAC_KINDS]
    return tuple(documents)


@functools.cache
def chart_authorizer(peering: bool = False) -> Authorizer:
    return Authorizer([*chart_documents(peering), *DEFAULT_CLUSTER_POLICY])


@functools.cache
def operator_identity() -> Identity:
    """The chart's operator ServiceAccount, as a user (the one its ClusterRoleBinding/RoleBindings name)."""
    [account] = [doc for doc in chart_documents() if doc["kind"] == "ServiceAccount"]
    meta = account["metadata"]
    return Identity.service_account(meta.get("namespace") or NAMESPACE, meta["name"])


__all__ = [
    "OPERATOR_TOKEN",
    "Attributes",
    "Authorizer",
    "Identity",
    "Rule",
    "chart_authorizer",
    "chart_documents",
    "forbidden_message",
    "operator_identity",
    "request_attributes",
    "request_verb",
]
