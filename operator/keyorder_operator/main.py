"""``keyorder operator``: runs the kopf operator with keyorder's handlers.

Only wiring: Kubernetes client configuration (in-cluster, else kubeconfig), the handler
registry, the operator's metrics endpoint, and kopf's own settings (cluster-wide or a list of
namespaces, peering for HA, liveness endpoint).
"""

from __future__ import annotations

import argparse
import logging


def add_operator_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: the whole cluster",
    )
    parser.add_argument(
        "--peering", default=None, help="kopf peering object name for high availability (default: standalone)"
    )
    parser.add_argument("--metrics-port", type=int, default=8081, help="operator metrics port [default: 8081]")
    parser.add_argument(
        "--liveness",
        default="http://0.0.0.0:8082/healthz",
        help="kopf liveness endpoint [default: http://0.0.0.0:8082/healthz]",
    )
    parser.add_argument(
        "--tick",
        type=float,
        default=5.0,
        help="seconds between autoscaler checks (each resource polls at its own interval)",
    )
    parser.add_argument(
        "--priority",
        type=int,
        default=None,
        help="kopf peering priority: the highest-priority operator works, the others stand by "
        "[default with --peering: random, so replicas never tie (a tie pauses them all)]",
    )


def operator_registry(context):
    """The handler registry of the real operator: keyorder's handlers plus kopf's standard login
    (in-cluster ServiceAccount or kubeconfig, through the ``kubernetes`` client). A bare
    ``kopf.OperatorRegistry`` has no login handler, and kopf would find no credentials."""
    import kopf

    from keyorder_operator.reconcile import register

    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs):
        return kopf.login_via_client(**kwargs)

    register(registry, context)
    return registry


def peering_priority(given: int | None, peering: str | None) -> int:
    """Replicas of equal priority pause each other in kopf: unless told, each picks a random one."""
    import random

    if given is not None:
        return given
    return random.randint(1, 2**31 - 1) if peering else 0


def operator_command(args: argparse.Namespace) -> int:
    import kopf  # imported here: `keyorder run` pods never load the operator's dependencies
    import kubernetes
    from prometheus_client import start_http_server

    from keyorder_operator.kube import Kube
    from keyorder_operator.reconcile import OperatorContext

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)-7s %(name)s: %(message)s")
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        kubernetes.config.load_kube_config()
    context = OperatorContext(kube=Kube(kubernetes.client.ApiClient()), tick_seconds=args.tick)
    registry = operator_registry(context)
    start_http_server(args.metrics_port, registry=context.metrics.registry)
    kopf.run(
        registry=registry,
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=args.liveness,
        priority=peering_priority(args.priority, args.peering),
    )
    return 0
