"""Issue 37 finding 7: a pod template cannot lift the confinement the operator gives the pods.

Each case is a way a tenant's template could weaken what the operator generates (an unconfined AppArmor or
seccomp profile, a volume that reaches outside the namespace, an API token while the pods carry none); each is
refused with ``InvalidSpec`` naming the field, before anything is applied. The lists follow the Pod Security
Standards as kubernetes/kubernetes implements them (``staging/src/k8s.io/pod-security-admission/policy``:
``check_appArmorProfile.go``, ``check_seccompProfile_baseline.go``, ``check_restrictedVolumes.go``)."""

from __future__ import annotations

from typing import Any

import pytest

from keyorder_operator.builders import build_deployment
from keyorder_operator.spec import InvalidSpec, parse_spec
from tests.unit.test_pod_template import OWNER, spec_dict


def refused(template: dict[str, Any], **handler: Any) -> str:
    with pytest.raises(InvalidSpec) as error:
        parse_spec(spec_dict(template=template, **handler))
    return str(error.value)


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("container.apparmor.security.beta.kubernetes.io/consumer", "unconfined"),
        ("container.apparmor.security.beta.kubernetes.io/consumer", "docker-default"),
        ("seccomp.security.alpha.kubernetes.io/pod", "unconfined"),
        ("container.seccomp.security.alpha.kubernetes.io/consumer", "unconfined"),
    ],
)
def test_an_unconfined_profile_annotation_is_refused(annotation, value):
    message = refused({"metadata": {"annotations": {annotation: value}}})
    assert f"spec.template.metadata.annotations.{annotation}: " in message
    assert repr(value) in message


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        ("container.apparmor.security.beta.kubernetes.io/consumer", "runtime/default"),
        ("container.apparmor.security.beta.kubernetes.io/consumer", "localhost/k8s-consumer"),
        ("seccomp.security.alpha.kubernetes.io/pod", "runtime/default"),
        ("container.seccomp.security.alpha.kubernetes.io/consumer", "localhost/profile.json"),
    ],
)
def test_a_confining_profile_annotation_is_accepted(annotation, value):
    spec = parse_spec(spec_dict(template={"metadata": {"annotations": {annotation: value}}}))
    pod = build_deployment(spec, OWNER, 1)["spec"]["template"]
    assert pod["metadata"]["annotations"][annotation] == value


@pytest.mark.parametrize(
    "security_context",
    [
        {"appArmorProfile": {"type": "Unconfined"}},
        {"seccompProfile": {"type": "Unconfined"}},
    ],
)
def test_an_unconfined_security_context_profile_is_refused(security_context):
    message = refused({"spec": {"securityContext": security_context}})
    assert "spec.template.spec.securityContext: the operator owns the pods' hardening" in message


@pytest.mark.parametrize(
    "volume_type",
    [
        {"nfs": {"server": "10.0.0.9", "path": "/exports"}},
        {"hostPath": {"path": "/"}},
        {"iscsi": {"targetPortal": "10.0.0.9:3260", "iqn": "iqn.2001-04.com.example:storage", "lun": 0}},
        {"rbd": {"monitors": ["10.0.0.9:6789"], "image": "disk"}},
        {"cephfs": {"monitors": ["10.0.0.9:6789"]}},
        {"glusterfs": {"endpoints": "gluster", "path": "vol"}},
        {"awsElasticBlockStore": {"volumeID": "vol-0123"}},
        {"gitRepo": {"repository": "https://example.com/x.git"}},
        {"image": {"reference": "registry.example.com/tools:1"}},
        {"flexVolume": {"driver": "example.com/driver"}},
    ],
)
def test_a_volume_outside_the_restricted_standard_is_refused(volume_type):
    (field,) = volume_type
    message = refused({"spec": {"volumes": [{"name": "data", **volume_type}]}})
    assert f"spec.template.spec.volumes[0].{field}: {field} volumes reach outside the namespace" in message


@pytest.mark.parametrize(
    "volume_type",
    [
        {"configMap": {"name": "settings"}},
        {"secret": {"secretName": "certs"}},
        {"emptyDir": {}},
        {"persistentVolumeClaim": {"claimName": "data"}},
        {"csi": {"driver": "secrets-store.csi.k8s.io"}},
        {"downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        {"ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}},
        {"projected": {"sources": [{"configMap": {"name": "settings"}}, {"secret": {"name": "certs"}}]}},
    ],
)
def test_the_restricted_standards_volume_types_are_accepted(volume_type):
    spec = parse_spec(spec_dict(template={"spec": {"volumes": [{"name": "data", **volume_type}]}}))
    volumes = build_deployment(spec, OWNER, 1)["spec"]["template"]["spec"]["volumes"]
    assert {"name": "data", **volume_type} in volumes


def test_a_projected_service_account_token_is_refused_while_the_pods_carry_none():
    token = {"serviceAccountToken": {"path": "token", "audience": "https://kubernetes.default.svc"}}
    template = {
        "spec": {
            "serviceAccountName": "deployer",  # any ServiceAccount of the namespace
            "volumes": [{"name": "api", "projected": {"sources": [{"configMap": {"name": "ca"}}, token]}}],
        }
    }
    message = refused(template)
    assert "spec.template.spec.volumes[0].projected.sources[1].serviceAccountToken: the pods carry no" in message
    # the pods the operator generates say so too: no token mounted
    spec = parse_spec(spec_dict(template={"spec": {"serviceAccountName": "deployer"}}))
    assert build_deployment(spec, OWNER, 1)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
