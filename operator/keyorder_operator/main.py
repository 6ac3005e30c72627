"""``keyorder operator``: runs the kopf operator with keyorder's handlers.

Only wiring: the flags (checked before anything starts), logging (text, or JSON like the pods'),
Kubernetes client configuration (in-cluster, else kubeconfig), the handler registry, the
operator's metrics endpoint, and kopf's own settings (cluster-wide or a list of namespaces,
peering for HA, liveness endpoint). Like ``keyorder run``, bad input stops it at start-up with
exit status 2 and one line naming what is wrong, never a traceback; so does a ``--peering`` object
that does not exist (``peering``: kopf would otherwise keep every replica paused, saying so only at DEBUG).
"""

from __future__ import annotations

import argparse
import copy
import logging
import math
import os
import re
import sys
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from keyorder.logs import JsonFormatter

EXIT_CONFIG = 2
"""Exit status for bad flags or missing credentials, as ``keyorder run`` uses."""

MAX_TICK_SECONDS = 3600.0
"""The autoscaler's check interval is bounded: a tick of hours would leave lag unwatched."""

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


class OperatorConfigError(Exception):
    """A flag or the Kubernetes credentials are unusable; the message names which and why."""


API_POOL_SPARE = 4
"""Connections beyond one per handler thread (the pushes and reports do not use the API pool)."""


def add_operator_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch only this namespace (repeatable); default: the whole cluster",
    )
    parser.add_argument(
        "--peering",
        default=None,
        help="kopf peering object name for high availability; it must exist (a ClusterKopfPeering, or a "
        "KopfPeering in each --namespace): checked at start-up and on each health probe (default: standalone)",
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
    parser.add_argument(
        "--handler-threads",
        type=int,
        default=32,
        help="threads for the handlers of all resources (a poll waits on Kafka at most 2 s and on the pods "
        "about 2 s; a cluster that does not answer is asked in the background) [default: 32]",
    )
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="text lines, or one JSON object per line like the pods' (with the resource's namespace and name)",
    )
    parser.add_argument(
        "--log-level", choices=("DEBUG", "INFO", "WARNING", "ERROR"), default="INFO", help="[default: INFO]"
    )


def check_operator_args(args: argparse.Namespace) -> None:
    """Raise OperatorConfigError naming the first unusable flag (argparse checks only the types)."""
    if not (math.isfinite(args.tick) and 0 < args.tick <= MAX_TICK_SECONDS):
        raise OperatorConfigError(
            f"--tick must be a number of seconds above 0 and at most {MAX_TICK_SECONDS:g}, got {args.tick:g}"
        )
    for namespace in args.namespace:
        if len(namespace) > 63 or not _DNS_LABEL.fullmatch(namespace):
            raise OperatorConfigError(
                f"--namespace {namespace!r} is not a namespace name "
                "(lower-case letters, digits and '-', starting and ending with a letter or digit, at most 63)"
            )
    if len(set(args.namespace)) != len(args.namespace):
        raise OperatorConfigError(f"--namespace is given twice for the same namespace: {args.namespace}")
    if not 1 <= args.handler_threads <= 1024:
        raise OperatorConfigError(f"--handler-threads must be between 1 and 1024, got {args.handler_threads}")
    if not 1 <= args.metrics_port <= 65535:
        raise OperatorConfigError(f"--metrics-port must be a TCP port (1-65535), got {args.metrics_port}")
    liveness = urlsplit(args.liveness)
    try:
        liveness_port = liveness.port
    except ValueError:
        liveness_port = -1
    if liveness.scheme != "http" or not liveness.hostname or liveness_port == -1:
        raise OperatorConfigError(
            f"--liveness must be an http:// URL such as http://0.0.0.0:8082/healthz, got {args.liveness!r}"
        )
    if liveness_port == args.metrics_port:
        raise OperatorConfigError(f"--liveness and --metrics-port both use port {args.metrics_port}")
    if args.peering is not None and not _DNS_LABEL.fullmatch(args.peering):
        raise OperatorConfigError(f"--peering {args.peering!r} is not a valid object name")


def check_operator_environment(environ: Mapping[str, str]) -> None:
    """Raise OperatorConfigError for an unusable setting of the operator's environment, at start: the
    NetworkPolicy settings (``KEYORDER_NETWORK_POLICY``) are read again at every apply, and a bad value
    found only there would fail every resource on every poll instead of stopping the operator once."""
    from keyorder_operator.builders import network_policy_settings

    try:
        network_policy_settings(environ)
    except ValueError as error:
        raise OperatorConfigError(str(error)) from None


class OperatorJsonFormatter(JsonFormatter):
    """The pods' JSON lines, plus the resource a kopf per-object message is about (kopf's ``k8s_ref``)."""

    def fields(self, record: logging.LogRecord) -> dict[str, object]:
        entry = super().fields(record)
        reference = getattr(record, "k8s_ref", None)
        if reference:
            entry["object"] = {key: reference.get(key) for key in ("kind", "namespace", "name")}
        return entry


class OperatorTextFormatter(logging.Formatter):
    """Text lines; a kopf per-object message starts with ``[namespace/name]``, as ``kopf run`` prints it."""

    def format(self, record: logging.LogRecord) -> str:
        reference = getattr(record, "k8s_ref", None)
        if reference:
            record = copy.copy(record)  # other handlers must see the message unchanged
            record.msg = f"[{reference.get('namespace')}/{reference.get('name')}] {record.msg}"
        return super().format(record)


def configure_operator_logging(level: str, log_format: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(OperatorJsonFormatter())
    else:
        handler.setFormatter(OperatorTextFormatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)


def load_kubernetes_credentials() -> None:
    """In a pod, its ServiceAccount; elsewhere the kubeconfig ($KUBECONFIG, else ~/.kube/config).
    Neither usable: OperatorConfigError with one line saying what was tried."""
    import kubernetes

    try:
        kubernetes.config.load_incluster_config()
        return
    except kubernetes.config.ConfigException as error:
        in_cluster = str(error)
    kubeconfig = os.environ.get("KUBECONFIG") or "~/.kube/config"
    where = f"KUBECONFIG={kubeconfig}" if os.environ.get("KUBECONFIG") else "KUBECONFIG unset, so ~/.kube/config"
    try:
        kubernetes.config.load_kube_config()
    except Exception as error:  # ConfigException, or TypeError/OSError/YAMLError from a file that is no kubeconfig
        reason = (
            str(error)
            if isinstance(error, kubernetes.config.ConfigException)
            else (f"{kubeconfig} is not a readable kubeconfig ({type(error).__name__}: {error})")
        )
        raise OperatorConfigError(
            f"no Kubernetes credentials: not in a pod ({in_cluster.rstrip('.')}) and no usable kubeconfig "
            f"({where}): {reason}"
        ) from error


def api_configuration(handler_threads: int) -> Any:
    """The loaded credentials, with a connection pool for every handler thread (and kopf's own calls):
    the client's default of 4 (urllib3's 10) makes threads open and drop connections ("Connection pool
    is full, discarding connection") once more polls run at once than it holds."""
    import kubernetes

    configuration = kubernetes.client.Configuration.get_default_copy()
    configuration.connection_pool_maxsize = handler_threads + API_POOL_SPARE
    return configuration


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
    from keyorder_operator.peering import (
        PeeringCheck,
        PeeringUnusable,
        peering_objects,
        probe_api_client,
        read_peering_object,
        register_peering_probe,
        wait_for_peering_objects,
    )
    from keyorder_operator.reconcile import OperatorContext

    try:
        check_operator_args(args)
        check_operator_environment(os.environ)
        load_kubernetes_credentials()
    except OperatorConfigError as error:
        print(f"keyorder operator: {error}", file=sys.stderr)
        return EXIT_CONFIG
    configure_operator_logging(args.log_level, args.log_format)
    api_client = kubernetes.client.ApiClient(api_configuration(args.handler_threads))
    peering = peering_objects(args.peering, args.namespace) if args.peering else []
    try:
        wait_for_peering_objects(peering, lambda obj: read_peering_object(api_client, obj))
    except PeeringUnusable as error:
        print(f"keyorder operator: {error}", file=sys.stderr)
        return EXIT_CONFIG
    context = OperatorContext(
        kube=Kube(api_client),
        tick_seconds=args.tick,
        handler_threads=args.handler_threads,
    )
    registry = operator_registry(context)
    if peering:
        reader = probe_api_client(api_client)
        check = PeeringCheck(
            peering,
            lambda obj, timeout: read_peering_object(reader, obj, timeout),
            context.metrics.peering_object_present,
        )
        register_peering_probe(registry, check)
    try:
        start_http_server(args.metrics_port, registry=context.metrics.registry)
    except OSError as error:
        print(f"keyorder operator: cannot serve metrics on port {args.metrics_port}: {error}", file=sys.stderr)
        return EXIT_CONFIG
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
