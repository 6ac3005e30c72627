"""The install as a platform engineer does it, on the API emulator (a FAKE API server, see emulator.py).

1. ``kubectl apply -f crds/`` and ``helm install`` (which creates the chart's ``crds/`` first): every CRD is
   created through the API, so the emulator's creation checks (``crd_creation``: what
   kubernetes/apiextensions-apiserver checks) run on each, and the created CRDs are served.
2. ``kubectl apply -f examples/``: every manifest there is stored by the CRD it names.
3. The chart's user roles: namespace users hold Kubernetes' built-in ``admin``, ``edit`` or ``view``
   ClusterRole through a RoleBinding, and the chart adds OrderedConsumer rights to those by aggregation.
   Each user tries ``get``, ``patch`` and ``kubectl scale`` (the scale subresource); the API's answer must
   be what the roles promise (docs/install.md).

The built-in roles are modelled as kubernetes/kubernetes ``plugin/pkg/auth/authorizer/rbac/bootstrappolicy/
policy.go`` defines them: ``admin`` aggregates ``aggregate-to-admin``, ``edit`` (itself labelled
aggregate-to-admin) aggregates ``aggregate-to-edit``, ``view`` (labelled aggregate-to-edit) aggregates
``aggregate-to-view``; only their aggregation rules matter here, not their own rules for built-in kinds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python
import pytest
import yaml

from tests.operator.authorization import (
    CHART,
    DEFAULT_CLUSTER_POLICY,
    RELEASE,
    Authorizer,
    Identity,
    chart_documents,
)
from tests.operator.harness import CR, ApiError, KubeHTTP, serve_emulator

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
CRDS = "apiextensions.k8s.io/v1/customresourcedefinitions"
TENANT = "payments"

BUILT_IN_ROLES: list[dict[str, Any]] = [
    {
        "kind": "ClusterRole",
        "metadata": {"name": "admin"},
        "aggregationRule": {
            "clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}}]
        },
    },
    {
        "kind": "ClusterRole",
        "metadata": {"name": "edit", "labels": {"rbac.authorization.k8s.io/aggregate-to-admin": "true"}},
        "aggregationRule": {
            "clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}}]
        },
    },
    {
        "kind": "ClusterRole",
        "metadata": {"name": "view", "labels": {"rbac.authorization.k8s.io/aggregate-to-edit": "true"}},
        "aggregationRule": {
            "clusterRoleSelectors": [{"matchLabels": {"rbac.authorization.k8s.io/aggregate-to-view": "true"}}]
        },
    },
]

USERS = {"admin": "alice", "edit": "bob", "view": "carol"}
"""Which built-in role each tenant user holds in the tenant's namespace."""

PROMISED = {
    "admin": {"get": True, "patch": True, "get scale": True, "scale": True},
    "edit": {"get": True, "patch": True, "get scale": True, "scale": True},
    "view": {"get": True, "patch": False, "get scale": True, "scale": False},
}
"""What docs/install.md promises each role: viewers read, editors and admins change and ``kubectl scale``
(Kubernetes' own view role reads ``deployments/scale`` too; its edit role updates and patches it)."""


def bindings() -> list[dict[str, Any]]:
    return [
        {
            "kind": "RoleBinding",
            "metadata": {"name": f"{user}-{role}", "namespace": TENANT},
            "roleRef": {"kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "User", "name": user}],
        }
        for role, user in USERS.items()
    ]


def with_tenants(emulator) -> None:
    emulator.authorizer = Authorizer([*chart_documents(), *DEFAULT_CLUSTER_POLICY, *BUILT_IN_ROLES, *bindings()])
    for role, user in USERS.items():
        emulator.tokens[f"token-{role}"] = Identity(user)


def chart_crds() -> list[dict[str, Any]]:
    """The CRDs ``helm install`` creates: the chart's crds/ as the real Helm engine loads them."""
    with helm_python.Chart.load(CHART) as chart:
        return [doc for crd in chart.crds for doc in yaml.safe_load_all(crd["data"]) if doc]


def example_manifests() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted((ROOT / "examples").glob("*.yaml"))
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def create_crds(api: KubeHTTP, crds: list[dict[str, Any]]) -> list[str]:
    created = []
    for crd in crds:
        stored = api.create(CRDS, crd, namespace=None)
        created.append(stored["metadata"]["name"])
    return created


def test_the_crds_of_crds_dir_are_created_and_every_example_is_stored():
    """``kubectl apply -f crds/ && kubectl apply -f examples/``."""
    with serve_emulator(rbac=False) as api:
        files = sorted((ROOT / "crds").glob("*.yaml"))
        assert files, "crds/ holds the CRDs"
        crds = [doc for path in files for doc in yaml.safe_load_all(path.read_text()) if doc]
        assert create_crds(api, crds) == ["orderedconsumers.keyorder.dev"]
        examples = example_manifests()
        assert len(examples) >= 2
        for name, manifest in examples:
            assert manifest["kind"] == "OrderedConsumer", f"{name}: a kind this walkthrough does not apply"
            stored = api.create(CR, manifest, namespace=TENANT)
            assert stored["spec"]["kafka"] == {**manifest["spec"]["kafka"], **stored["spec"]["kafka"]}, name
            assert stored["metadata"]["generation"] == 1


def test_the_charts_crds_are_created_as_helm_install_creates_them():
    with serve_emulator(rbac=False) as api:
        crds = chart_crds()
        created = create_crds(api, crds)
        assert sorted(created) == [
            "clusterkopfpeerings.kopf.dev",
            "kopfpeerings.kopf.dev",
            "orderedconsumers.keyorder.dev",
        ]
        stored = api.create("kopf.dev/v1/clusterkopfpeerings", {"metadata": {"name": RELEASE}}, namespace=None)
        assert stored["metadata"]["name"] == RELEASE, "a created CRD is served"


def attempt(api: KubeHTTP, action: str, name: str) -> bool:
    """Whether the API allowed ``action`` on OrderedConsumer ``name`` (False: 403; anything else fails the test)."""
    try:
        if action == "get":
            api.get(CR, name, namespace=TENANT)
        elif action == "patch":
            api.patch(CR, name, {"metadata": {"labels": {"team": "payments"}}}, namespace=TENANT)
        elif action == "get scale":
            scale = api.call("GET", f"/apis/keyorder.dev/v1alpha1/namespaces/{TENANT}/orderedconsumers/{name}/scale")
            assert scale["kind"] == "Scale"
        elif action == "scale":  # kubectl scale: a merge patch of the scale subresource
            api.patch(CR, name, {"spec": {"replicas": 2}}, namespace=TENANT, subresource="scale")
        else:
            raise AssertionError(action)
    except ApiError as error:
        if error.status == 403:
            return False
        raise
    return True


def test_each_user_role_allows_and_refuses_what_the_docs_promise():
    with serve_emulator(with_tenants) as api:
        _, minimal = next((n, m) for n, m in example_manifests() if n == "orderedconsumer-minimal.yaml")
        api.create(CR, minimal, namespace=TENANT)
        name = minimal["metadata"]["name"]
        outcomes = {}
        for role in USERS:
            user = KubeHTTP(api.url, token=f"token-{role}")
            outcomes[role] = {action: attempt(user, action, name) for action in PROMISED[role]}
        assert outcomes == PROMISED
        scaled = api.get(CR, name, namespace=TENANT)
        assert scaled["spec"]["replicas"]["min"] == 2, "kubectl scale sets spec.replicas.min (specReplicasPath)"
