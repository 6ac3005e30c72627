"""The harness itself: the real kopf operator against kmock's emulator, and the emulator's API contract."""

from __future__ import annotations

import json
import socket
import threading
import urllib.request
from typing import Any

import kopf
import kubernetes
import pytest

from tests.operator.harness import CR, ApiError, RunningEmulator, api_client, run_kopf, wait_for

pytestmark = pytest.mark.timeout(60)


MINIMAL_SPEC = {
    "kafka": {"bootstrapServers": "127.0.0.1:9", "topics": ["orders"], "groupId": "orders"},
    "handler": {"image": "registry.example/orders:1.0", "handler": "orders.handler:handle"},
}
"""The least the CRD's schema accepts (the emulator validates OrderedConsumers as the API server does)."""


def orderedconsumer(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "keyorder.dev/v1alpha1",
        "kind": "OrderedConsumer",
        "metadata": {"name": name},
        "spec": {**MINIMAL_SPEC, **spec},
    }


def register_toy(registry: kopf.OperatorRegistry) -> None:
    """On creation of an OrderedConsumer: an owned ConfigMap (sync ``kubernetes`` client, as an admin: the toy is
    no keyorder operator, and the chart grants the operator no ConfigMaps), a status, an Event."""

    @kopf.on.create("keyorder.dev", "v1alpha1", "orderedconsumers", registry=registry)
    def make_configmap(
        body: kopf.Body, name: str, namespace: str, patch: kopf.Patch, memo: kopf.Memo, **_: Any
    ) -> None:
        configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"cr": name}}
        kopf.adopt(configmap, owner=body)
        with api_client(memo.server_url, token=None) as client:
            kubernetes.client.CoreV1Api(client).create_namespaced_config_map(namespace, configmap)
        patch.status["seen"] = True
        kopf.info(body, reason="ConfigMapCreated", message=f"created ConfigMap {name}")


def test_the_real_operator_creates_an_owned_configmap_patches_status_and_posts_an_event(kube: RunningEmulator) -> None:
    with run_kopf(kube.url, register_toy) as operator:
        created = kube.create(CR, orderedconsumer("alpha", httpPort=9000))
        configmap = wait_for(lambda: kube.get("v1/configmaps", "alpha"), 20, "the ConfigMap")
        cr = wait_for(
            lambda: (found := kube.get(CR, "alpha")) and found.get("status", {}).get("seen") and found,
            20,
            "status.seen on the OrderedConsumer",
        )
        events = wait_for(
            lambda: [event for event in kube.list("v1/events", "default") if event["reason"] == "ConfigMapCreated"],
            20,
            "the Event",
        )
        assert operator.alive

    assert configmap["data"] == {"cr": "alpha"}
    assert configmap["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "keyorder.dev/v1alpha1",
            "kind": "OrderedConsumer",
            "name": "alpha",
            "uid": created["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert cr["status"] == {"seen": True}
    assert cr["spec"]["httpPort"] == 9000 and cr["spec"]["kafka"]["groupId"] == "orders"
    assert int(cr["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert cr["metadata"]["generation"] == 1  # kopf only touched annotations and status
    [event] = events
    assert event["metadata"]["name"].startswith("kopf-event-")  # kopf posts Events with generateName
    assert event["involvedObject"]["uid"] == created["metadata"]["uid"]


def test_kopfs_finalizer_is_added_before_the_handlers_and_released_after_the_delete_handler(
    kube: RunningEmulator,
) -> None:
    deleted: list[str] = []

    def register(registry: kopf.OperatorRegistry) -> None:
        @kopf.on.create("keyorder.dev", "v1alpha1", "orderedconsumers", registry=registry)
        def created(patch: kopf.Patch, **_: Any) -> None:
            patch.status["created"] = True

        @kopf.on.delete("keyorder.dev", "v1alpha1", "orderedconsumers", registry=registry)
        def removed(name: str, **_: Any) -> None:
            deleted.append(name)

    kube.create(CR, orderedconsumer("before"))  # listed by kopf at start-up, then watched from the list's version
    with run_kopf(kube.url, register):
        kube.create(CR, orderedconsumer("after"))  # seen on the watch stream
        for name in ("before", "after"):
            found = wait_for(
                lambda n=name: (cr := kube.get(CR, n)) and cr.get("status", {}).get("created") and cr,
                20,
                f"status.created on {name}",
            )
            assert found["metadata"]["finalizers"] == ["kopf.zalando.org/KopfFinalizerMarker"]
        kube.delete(CR, "before")
        wait_for(lambda: kube.get(CR, "before") is None, 20, "the finalizer to be released")
    assert deleted == ["before"]


def test_the_harness_starts_and_stops_twice_in_a_row_without_hanging(kube: RunningEmulator) -> None:
    for attempt in range(2):
        # The second run loads the handlers by their import path ("module:function").
        register = register_toy if attempt == 0 else f"{__name__}:register_toy"
        # stop_timeout is the hang guard: run_kopf raises when kopf has not stopped by then
        with run_kopf(kube.url, register, stop_timeout=15) as operator:
            kube.create(CR, orderedconsumer(f"run-{attempt}"))
            wait_for(lambda name=f"run-{attempt}": kube.get("v1/configmaps", name), 20, "the ConfigMap")
        assert operator.thread is not None and not operator.thread.is_alive()
        assert operator.error is None
    assert not [thread.name for thread in threading.enumerate() if thread.name.startswith("kopf-")]


def test_the_emulator_stops_even_while_kopf_still_watches_it() -> None:
    kube = RunningEmulator(stop_timeout=10).__enter__()  # hang guard: __exit__ raises if it has not stopped by then
    with run_kopf(kube.url, register_toy) as operator:
        kube.create(CR, orderedconsumer("early"))
        wait_for(lambda: kube.get("v1/configmaps", "early"), 20, "the ConfigMap")
        kube.__exit__(None, None, None)  # the wrong order: kopf's watch streams are still open
    assert not operator.alive  # and kopf, its API gone, still stopped when asked


@pytest.mark.slow
def test_an_operator_that_dies_is_reported_when_the_run_ends() -> None:
    def one_retry(settings: kopf.OperatorSettings) -> None:
        settings.networking.error_backoffs = [0.05]

    with socket.socket() as probe:  # a port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    with (
        pytest.raises(RuntimeError, match="kopf failed"),
        run_kopf(f"http://127.0.0.1:{closed_port}", register_toy, settings=one_retry) as operator,
    ):
        wait_for(lambda: not operator.alive, 30, "kopf to give up on the unreachable API")
    assert operator.error is not None


def test_handlers_of_a_plain_module_are_registered_on_the_runs_own_registry(
    kube: RunningEmulator, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "toy_handlers_module.py").write_text(
        "import kopf\n"
        "@kopf.on.create('keyorder.dev', 'v1alpha1', 'orderedconsumers')\n"
        "def mark(patch, **_):\n"
        "    patch.status['marked'] = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    default_registry = kopf.get_default_registry()
    with run_kopf(kube.url, "toy_handlers_module") as operator:
        kube.create(CR, orderedconsumer("plain"))
        wait_for(lambda: (kube.get(CR, "plain") or {}).get("status", {}).get("marked"), 20, "status.marked")
    assert kopf.get_default_registry() is default_registry
    assert not list(default_registry._changing.get_all_handlers())  # nothing leaked into kopf's default
    assert [handler.id for handler in operator.registry._changing.get_all_handlers()] == ["mark"]


def test_the_fake_kubelet_fails_the_test_when_it_could_not_do_its_part(kube: RunningEmulator, tmp_path: Any) -> None:
    """A kubelet whose loop met errors ran no pods: its exit says so unless the test expects the errors."""
    from tests.operator.kubelet import LocalKubelet

    no_template = {"metadata": {"name": "broken"}, "spec": {"replicas": 1, "selector": {"matchLabels": {"a": "b"}}}}
    kube.create("apps/v1/deployments", no_template)
    with (
        pytest.raises(AssertionError, match=r"the fake kubelet of broken met \d+ errors: .*KeyError: 'template'"),
        LocalKubelet(kube, "broken", tmp_path, period=0.05) as kubelet,
    ):
        wait_for(lambda: kubelet.errors, 10, "the kubelet's first error")
    with LocalKubelet(kube, "broken", tmp_path, period=0.05, expect_errors=True) as expecting:
        wait_for(lambda: expecting.errors, 10, "the kubelet's first error")
    assert expecting.errors[0] == "KeyError: 'template'" and not expecting.pods


# The emulator's contract, over plain HTTP and without kopf (fast).


def test_create_fills_the_metadata_and_supports_generate_name(kube: RunningEmulator) -> None:
    named = kube.create(CR, {**orderedconsumer("named"), "status": {"ignored": True}})
    assert "status" not in named  # a status subresource: the status is written only through it
    meta = named["metadata"]
    assert meta["namespace"] == "default" and meta["generation"] == 1
    assert meta["uid"] and meta["resourceVersion"] and meta["creationTimestamp"].endswith("Z")
    assert kube.call_in_loop(lambda: kube.emulator.objects[CR, "default", "named"]["metadata"]["uid"]) == meta["uid"]
    generated = kube.create("v1/configmaps", {"metadata": {"generateName": "cm-"}, "data": {}})
    assert generated["metadata"]["name"].startswith("cm-") and len(generated["metadata"]["name"]) == 8
    assert kube.get("v1/configmaps", generated["metadata"]["name"]) == generated
    assert int(generated["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])
    with pytest.raises(ApiError) as conflict:
        kube.create(CR, orderedconsumer("named"))
    assert conflict.value.status == 409
    with pytest.raises(ApiError) as nameless:
        kube.create("v1/configmaps", {"metadata": {}})
    assert nameless.value.status == 422
    assert {item["metadata"]["name"] for item in kube.list(CR)} == {"named"}


def test_patches_bump_the_resource_version_and_the_generation_only_on_spec_changes(kube: RunningEmulator) -> None:
    created = kube.create(CR, orderedconsumer("p", httpPort=9001))
    version = int(created["metadata"]["resourceVersion"])
    labelled = kube.patch(CR, "p", {"metadata": {"labels": {"a": "b"}}})
    assert int(labelled["metadata"]["resourceVersion"]) > version
    assert labelled["metadata"]["generation"] == 1
    respecced = kube.patch(CR, "p", {"spec": {"httpPort": 9002}})
    assert respecced["metadata"]["generation"] == 2 and respecced["spec"]["httpPort"] == 9002
    status = kube.patch(CR, "p", {"status": {"ready": 1}, "spec": {"httpPort": 9009}}, subresource="status")
    assert status["metadata"]["generation"] == 2 and status["status"] == {"ready": 1}
    assert status["spec"]["httpPort"] == 9002  # .../status ignores everything but the status, as the real API
    assert kube.patch(CR, "p", {"status": {"ready": 2}})["status"] == {"ready": 1}  # and the main resource, status
    json_patched = kube.patch(CR, "p", [{"op": "replace", "path": "/spec/httpPort", "value": 9005}])
    assert json_patched["metadata"]["generation"] == 3
    assert int(json_patched["metadata"]["resourceVersion"]) > int(status["metadata"]["resourceVersion"])
    assert kube.get(CR, "p") == json_patched


def test_stale_resource_versions_get_409_and_failed_json_patch_tests_get_422(kube: RunningEmulator) -> None:
    created = kube.create(CR, orderedconsumer("c"))
    stale = created["metadata"]["resourceVersion"]
    current = kube.patch(CR, "c", {"metadata": {"resourceVersion": stale, "labels": {"x": "1"}}})
    with pytest.raises(ApiError) as conflict:
        kube.patch(CR, "c", {"metadata": {"resourceVersion": stale, "labels": {"x": "2"}}})
    assert conflict.value.status == 409
    with pytest.raises(ApiError) as invalid:  # what kopf's finalizer JSON-patch does on a race
        kube.patch(
            CR,
            "c",
            [
                {"op": "test", "path": "/metadata/resourceVersion", "value": stale},
                {"op": "add", "path": "/metadata/finalizers", "value": ["x"]},
            ],
        )
    assert invalid.value.status == 422
    assert kube.get(CR, "c") == current  # neither failed write changed anything
    with pytest.raises(ApiError) as missing:
        kube.patch(CR, "absent", {"spec": {}})
    assert missing.value.status == 404


def test_delete_with_finalizers_marks_then_removes_when_they_are_cleared(kube: RunningEmulator) -> None:
    kube.create(CR, {**orderedconsumer("d"), "metadata": {"name": "d", "finalizers": ["keyorder.dev/x"]}})
    before = kube.get(CR, "d")
    assert before is not None
    kube.delete(CR, "d")
    marked = kube.get(CR, "d")
    assert marked is not None and marked["metadata"]["deletionTimestamp"]
    assert int(marked["metadata"]["resourceVersion"]) > int(before["metadata"]["resourceVersion"])
    kube.patch(CR, "d", {"metadata": {"finalizers": None}})
    assert kube.get(CR, "d") is None


def next_line(stream: Any) -> bytes:
    """The next non-blank line of a watch stream. At its end (the server closed it) an AssertionError at
    once: ``readline`` returns ``b""`` there forever, and waiting on it would spin until the test's timeout."""
    while line := stream.readline():
        if line.strip():
            return line
    raise AssertionError("the watch stream ended before the next event")


def test_watch_streams_the_snapshot_then_every_change(kube: RunningEmulator) -> None:
    kube.create(CR, orderedconsumer("w1"))
    url = kube.url + "/apis/keyorder.dev/v1alpha1/orderedconsumers?watch=true"
    with urllib.request.urlopen(url, timeout=10) as stream:

        def next_event() -> tuple[str, str, int]:
            event = json.loads(next_line(stream))
            meta = event["object"]["metadata"]
            return event["type"], meta["name"], int(meta["resourceVersion"])

        assert next_event()[:2] == ("ADDED", "w1")
        created = kube.create(CR, orderedconsumer("w2"))
        assert next_event() == ("ADDED", "w2", int(created["metadata"]["resourceVersion"]))
        patched = kube.patch(CR, "w1", {"spec": {"httpPort": 9007}})
        assert next_event() == ("MODIFIED", "w1", int(patched["metadata"]["resourceVersion"]))
        kube.delete(CR, "w2")
        assert next_event()[:2] == ("DELETED", "w2")
        assert kube.get(CR, "w2") is None

    # From a list's resourceVersion (as kopf does), only later changes arrive: no stale replay of the listed state.
    listed = kube.call("GET", "/apis/keyorder.dev/v1alpha1/orderedconsumers")
    version = listed["metadata"]["resourceVersion"]
    assert int(version) > int(patched["metadata"]["resourceVersion"])  # the delete got a version of its own
    with urllib.request.urlopen(f"{url}&resourceVersion={version}", timeout=10) as stream:
        kube.patch(CR, "w1", {"metadata": {"labels": {"after": "list"}}})
        event = json.loads(next_line(stream))
        assert (event["type"], event["object"]["metadata"]["labels"]) == ("MODIFIED", {"after": "list"})
