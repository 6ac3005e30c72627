"""Pods and Deployment statuses shaped as a real cluster returns them, for the FAKE kubelet and the benchmarks.

The emulator stores what it is sent, so objects a test writes by hand are a fraction of a real one's size,
and memory figures measured on them say little. A pod a cluster returns for a Deployment's ReplicaSet has:

* the ReplicaSet controller's part (kubernetes/kubernetes ``pkg/controller/controller_utils.go``,
  ``GetPodFromTemplate``): the template's labels and annotations, ``generateName`` from the ReplicaSet's
  name, the ``pod-template-hash`` label, an ``ownerReferences`` entry to the ReplicaSet (controller,
  blockOwnerDeletion), and the template's spec;
* the API server's defaults (``pkg/apis/core/v1/defaults.go``: ``terminationMessagePath``,
  ``terminationMessagePolicy``, ``imagePullPolicy``, port ``protocol``, probe timings, ``dnsPolicy``,
  ``restartPolicy``, ``schedulerName``, ``enableServiceLinks``...) and the admission plugins' (the
  ``DefaultTolerationSeconds`` tolerations, ``priority``, ``preemptionPolicy``); the scheduler's ``nodeName``;
* the kubelet's status (``pkg/kubelet/status``): five conditions, the IPs, ``startTime``, ``qosClass`` and a
  container status with ids, ``state.running`` and its volume mounts;
* ``managedFields``: an ``Update`` entry for the controller (everything above but the status) and one for
  the kubelet (``subresource: status``), as FieldsV1 trees computed by the emulator's ownership code.

``as_created`` and ``with_status`` shape the stand-in kubelet's pods (``kubelet``) this way, and
``deployment_conditions`` is the Deployment controller's part of a status. ``long_env`` is a handler's
environment as real Deployments carry them (tens of variables). Sizes: such a pod with a 40-variable
environment is about 16 kB of JSON, where the hand-written ones were about 300 bytes.
"""

from __future__ import annotations

import copy
import hashlib
import uuid
from typing import Any

from tests.operator import server_side_apply

CONTROLLER = "kube-controller-manager"
KUBELET = "kubelet"
HOST_IP = "10.20.3.17"


def long_env(count: int = 40) -> list[dict[str, str]]:
    """A handler's environment as production Deployments carry it: ``count`` variables of realistic length."""
    return [
        {
            "name": f"ORDERS_SETTING_{index:02d}",
            "value": f"https://config.internal.example/orders/v2/setting-{index:02d}",
        }
        for index in range(count)
    ]


def _defaulted_container(container: dict[str, Any]) -> dict[str, Any]:
    defaulted = copy.deepcopy(container)
    defaulted.setdefault("imagePullPolicy", "IfNotPresent")
    defaulted.setdefault("terminationMessagePath", "/dev/termination-log")
    defaulted.setdefault("terminationMessagePolicy", "File")
    defaulted.setdefault("resources", {})
    for port in defaulted.get("ports") or ():
        port.setdefault("protocol", "TCP")
    for probe in ("readinessProbe", "livenessProbe"):
        if probe in defaulted:
            defaulted[probe].setdefault("httpGet", {}).setdefault("scheme", "HTTP")
            for field, value in (("timeoutSeconds", 1), ("successThreshold", 1), ("failureThreshold", 3)):
                defaulted[probe].setdefault(field, value)
            defaulted[probe].setdefault("periodSeconds", 10)
    return defaulted


def update_entry(obj: dict[str, Any], part: dict[str, Any], manager: str, now: str, **extra: str) -> dict[str, Any]:
    """The ``managedFields`` entry of an ``Update`` by ``manager`` that wrote ``part`` of ``obj``."""
    paths = server_side_apply.field_paths(part, server_side_apply.Schema.of(obj))
    (entry,) = server_side_apply.managed_fields({manager: paths}, str(obj.get("apiVersion") or "v1"), now)
    return {**entry, "operation": "Update", **extra}


def as_created(pod: dict[str, Any], replica_set: str, now: str) -> dict[str, Any]:
    """``pod`` (a ReplicaSet's pod as the stand-in makes it: the template's labels and spec, ``nodeName``) as
    the API server stores it once the ReplicaSet controller created it (see the module docstring): a new dict."""
    created = copy.deepcopy(pod)
    created.setdefault("apiVersion", "v1")
    created.setdefault("kind", "Pod")
    meta, spec = created.setdefault("metadata", {}), created.setdefault("spec", {})
    meta.setdefault("generateName", f"{replica_set}-")
    meta["ownerReferences"] = [
        {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "name": replica_set,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, replica_set)),
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    spec["containers"] = [_defaulted_container(container) for container in spec.get("containers") or ()]
    for key, value in (
        ("dnsPolicy", "ClusterFirst"),
        ("restartPolicy", "Always"),
        ("schedulerName", "default-scheduler"),
        ("enableServiceLinks", True),
        ("preemptionPolicy", "PreemptLowerPriority"),
        ("priority", 0),
        ("securityContext", {}),
        ("terminationGracePeriodSeconds", 30),
    ):
        spec.setdefault(key, value)
    spec["serviceAccount"] = spec.get("serviceAccountName", "default")  # the deprecated alias, still returned
    spec["tolerations"] = [
        *spec.get("tolerations", []),
        *(
            {
                "key": f"node.kubernetes.io/{taint}",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
            for taint in ("not-ready", "unreachable")
        ),
    ]
    meta["managedFields"] = [update_entry(created, {"metadata": meta, "spec": spec}, CONTROLLER, now)]
    return created


def with_status(pod: dict[str, Any], ip: str, *, ready: bool, now: str) -> dict[str, Any]:
    """``pod`` with the kubelet's status (``pod_status``) and its ``managedFields`` entry: a new dict."""
    reported = copy.deepcopy(pod)
    reported["status"] = pod_status(reported, ip, ready=ready, now=now)
    entries = [e for e in reported["metadata"].get("managedFields") or () if e.get("manager") != KUBELET]
    entries.append(update_entry(reported, {"status": reported["status"]}, KUBELET, now, subresource="status"))
    reported["metadata"]["managedFields"] = entries
    return reported


def pod_status(pod: dict[str, Any], ip: str, *, ready: bool, now: str) -> dict[str, Any]:
    """What the kubelet reports of a running pod of ``pod``'s spec at ``ip``."""
    flag = "True" if ready else "False"
    conditions = [
        {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": now}
        for kind, status in (
            ("PodReadyToStartContainers", "True"),
            ("Initialized", "True"),
            ("Ready", flag),
            ("ContainersReady", flag),
            ("PodScheduled", "True"),
        )
    ]
    containers = []
    for container in pod["spec"]["containers"]:
        digest = hashlib.sha256(container["image"].encode()).hexdigest()
        container_id = hashlib.sha256((pod["metadata"]["name"] + digest).encode()).hexdigest()
        containers.append(
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": f"{container['image'].split(':')[0]}@sha256:{digest}",
                "containerID": f"containerd://{container_id}",
                "ready": ready,
                "started": True,
                "restartCount": 0,
                "lastState": {},
                "state": {"running": {"startedAt": now}},
                "volumeMounts": [
                    {
                        "name": mount["name"],
                        "mountPath": mount["mountPath"],
                        **({"readOnly": True} if mount.get("readOnly") else {}),
                    }
                    for mount in container.get("volumeMounts") or ()
                ],
            }
        )
    return {
        "phase": "Running",
        "conditions": conditions,
        "hostIP": HOST_IP,
        "hostIPs": [{"ip": HOST_IP}],
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "startTime": now,
        "qosClass": "Burstable",
        "containerStatuses": containers,
    }


def deployment_conditions(available: bool, replica_set: str, now: str) -> list[dict[str, Any]]:
    """The Available and Progressing conditions the Deployment controller writes
    (``pkg/controller/deployment/sync.go``, ``calculateStatus``; ``progress.go``)."""
    return [
        {
            "type": "Available",
            "status": "True" if available else "False",
            "lastUpdateTime": now,
            "lastTransitionTime": now,
            "reason": "MinimumReplicasAvailable" if available else "MinimumReplicasUnavailable",
            "message": "Deployment has minimum availability."
            if available
            else "Deployment does not have minimum availability.",
        },
        {
            "type": "Progressing",
            "status": "True",
            "lastUpdateTime": now,
            "lastTransitionTime": now,
            "reason": "NewReplicaSetAvailable",
            "message": f'ReplicaSet "{replica_set}" has successfully progressed.',
        },
    ]


__all__ = ["as_created", "deployment_conditions", "long_env", "pod_status", "update_entry", "with_status"]
