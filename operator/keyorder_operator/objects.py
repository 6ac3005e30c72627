"""The objects an OrderedConsumer owns, applied in one place: at create and update, and on every poll.

Server-side apply of each (idempotent, fields owned by the operator's field manager), so the spec
handlers and the poll's self-repair run the same code: a deleted or edited object comes back within
one poll. A deleted admin Secret comes back with a new token, which the pods re-read from their
mounted file (it is never rotated otherwise: ``Kube.ensure_secret``).
"""

from __future__ import annotations

import secrets
from typing import Any

from keyorder_operator.builders import (
    ADMIN_TOKEN_KEY,
    build_admin_secret,
    build_deployment,
    build_pdb,
    build_service,
    build_service_account,
)
from keyorder_operator.kube import Kube
from keyorder_operator.spec import OrderedConsumerSpec


def apply_owned_objects(kube: Kube, spec: OrderedConsumerSpec, meta: Any, status: Any) -> None:
    """Apply the admin Secret, ServiceAccount, Deployment, metrics Service and PodDisruptionBudget.

    The Deployment keeps its current replicas (the poll owns them); a new or deleted one starts at the
    size last decided (``status.replicas``), else at the minimum.
    """
    owner = {"metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}}
    kube.ensure_secret(build_admin_secret(owner, secrets.token_urlsafe(32)), ADMIN_TOKEN_KEY)
    kube.apply(build_service_account(owner))
    replicas = kube.deployment_replicas(meta["namespace"], meta["name"])
    if replicas is None:
        decided = (status or {}).get("replicas")
        replicas = (
            decided
            if isinstance(decided, int)
            else (max(spec.replicas.min, 1) if spec.scaling.enabled or spec.replicas.min else 1)
        )
    kube.apply(build_deployment(spec, owner, replicas))
    kube.apply(build_service(spec, owner))
    kube.apply(build_pdb(owner))
