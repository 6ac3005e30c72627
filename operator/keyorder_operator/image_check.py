"""Can ``spec.catchup.image`` run a catch-up? Decided before the consumer pods stop: pure, no I/O.

A catch-up hand-over stops the pods first. An image that cannot run ``keyorder catchup`` (no Java or
PySpark, a handler that does not import) used to be found out only after that: its driver exited 2 and
the pods resumed, stopped for nothing; and an image that cannot even be pulled never exits, so the pods
stayed at 0 until ``maxSeconds``. So before the first hand-over with an image, the operator runs
``keyorder catchup --preflight`` in a short Job of that image, with the catch-up Job's account, pull
secrets, environment and Kafka Secret (``builders.build_image_check_job``), and stops the pods only once
it succeeded. The result is kept per pod spec of that Job (``status.catchupImageChecked``: the image, a
digest of the Job's pod template, when), so later hand-overs with the same image go straight on, and a
new image (or handler, environment, account) is checked again.

The check has ``IMAGE_CHECK_SECONDS`` to pass; one that fails, or has not passed by then (an image that
cannot be pulled, a pod that cannot be scheduled), disables catch-up for the spec generation, as a
failed hand-over does, and the pods are never stopped. ``image_check_verdict`` decides from the Job's
outcome, what its pod is doing (``pod_state``) and the time; the hand-over (``handover``) does the I/O.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from keyorder_operator.catchup import JobState
from keyorder_operator.policy import duration

IMAGE_CHECK_SECONDS = 300
"""How long the operator waits for an image's pre-flight Job to succeed (its pod pulled, scheduled and
passed) before it gives up on catch-up with that image. Pulling a Spark image (about 1 GB) on a cold node
takes a minute or two; a pull that fails keeps retrying (``ImagePullBackOff``) and never exits by itself."""
IMAGE_CHECK_JOB_GRACE_SECONDS = 60
"""The Job's own deadline is this much later than the operator's: the operator reads the pod's waiting
reason while the pod still exists, then the Job controller ends the Job (and deletes its pod)."""
IMAGE_CHECK_TTL_SECONDS = 24 * 3600
"""A finished pre-flight Job (and its log) is kept a day, then garbage-collected."""
MESSAGE_CHARACTERS = 600
"""At most this much of a pod's termination message goes into an Event (status conditions take more,
Events should stay readable)."""


class CheckStep(StrEnum):
    WAIT = "wait"
    PASSED = "passed"
    FAILED = "failed"


@dataclass(frozen=True)
class ImageCheck:
    """A pre-flight Job under way (``status.catchupImageCheck``)."""

    image: str
    digest: str
    """``template_digest`` of the Job's pod template: what exactly was checked."""
    job_name: str
    started_at: float
    waiting: str | None = None
    """What its pod was doing at the last poll (kept so a timeout can say it after the pod is gone)."""

    def to_status(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "digest": self.digest,
            "jobName": self.job_name,
            "startedAt": self.started_at,
            "waiting": self.waiting,
        }

    @classmethod
    def from_status(cls, status: dict[str, Any]) -> ImageCheck | None:
        data = status.get("catchupImageCheck") or {}
        if not data.get("jobName"):
            return None
        return cls(
            image=str(data.get("image")),
            digest=str(data.get("digest")),
            job_name=str(data["jobName"]),
            started_at=float(data.get("startedAt") or 0),
            waiting=data.get("waiting"),
        )

    def seen(self, waiting: str | None) -> ImageCheck:
        return replace(self, waiting=waiting or self.waiting)


@dataclass(frozen=True)
class CheckVerdict:
    step: CheckStep
    message: str


def template_digest(template: dict[str, Any]) -> str:
    """A short digest of a pre-flight Job's pod template (image, account, pull secrets, environment, volumes)."""
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:16]


def image_checked(status: dict[str, Any], image: str, digest: str) -> bool:
    """This image passed its pre-flight with this very pod template (``status.catchupImageChecked``)."""
    checked = status.get("catchupImageChecked") or {}
    return checked.get("image") == image and checked.get("digest") == digest


def checked_status(check: ImageCheck, checked_at: str) -> dict[str, Any]:
    return {"image": check.image, "digest": check.digest, "jobName": check.job_name, "checkedAt": checked_at}


def _failed_lines(message: str) -> str:
    """The pre-flight's ``FAIL`` lines from a termination message (the log's tail), else its last line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    failed = [line.removeprefix("FAIL").strip() for line in lines if line.startswith("FAIL")]
    shown = "; ".join(failed) if failed else (lines[-1] if lines else "")
    return shown[:MESSAGE_CHARACTERS]


def pod_state(pods: list[dict[str, Any]]) -> str | None:
    """What the pre-flight Job's newest pod is doing, or how it ended, in words (``None``: no pod yet).

    Its container waiting (``ImagePullBackOff``, ``ErrImagePull``, ``CreateContainerConfigError``, ...)
    or terminated (the exit code and the failed checks, from the termination message the pod's
    ``FallbackToLogsOnError`` policy fills with the log's tail), else the pod not scheduled, else its phase."""
    if not pods:
        return None
    pod = max(pods, key=lambda item: str((item.get("metadata") or {}).get("creationTimestamp") or ""))
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        if state.get("terminated"):
            ended = state["terminated"]
            code = ended.get("exitCode")
            what = _failed_lines(str(ended.get("message") or ""))
            reason = f" ({ended['reason']})" if ended.get("reason") and ended.get("reason") != "Error" else ""
            return f"its pod exited with code {code}{reason}" + (f": {what}" if what else "")
        if state.get("waiting"):
            waiting = state["waiting"]
            message = str(waiting.get("message") or "")[:MESSAGE_CHARACTERS]
            return f"its pod is waiting: {waiting.get('reason') or 'Waiting'}" + (f" ({message})" if message else "")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            message = str(condition.get("message") or "")[:MESSAGE_CHARACTERS]
            return f"its pod is not scheduled: {condition.get('reason') or 'Pending'}" + (
                f" ({message})" if message else ""
            )
    return f"its pod is {status.get('phase') or 'Pending'}"


def image_check_verdict(check: ImageCheck, outcome: JobState, state: str | None, now: float) -> CheckVerdict:
    """Where a pre-flight stands: passed (the Job succeeded), failed (the Job failed or vanished, or it
    has not passed within ``IMAGE_CHECK_SECONDS``), or still waiting; the message says which and why."""
    elapsed = max(now - check.started_at, 0.0)
    job = f"Job {check.job_name}"
    what = state or check.waiting
    if outcome is JobState.SUCCEEDED:
        return CheckVerdict(
            CheckStep.PASSED,
            f"image {check.image} passed its pre-flight ({job}: Java, PySpark and the handler) in {duration(elapsed)}",
        )
    if outcome is JobState.FAILED:
        why = what or f"kubectl logs job/{check.job_name}"
        return CheckVerdict(CheckStep.FAILED, f"image {check.image} failed its pre-flight ({job}): {why}")
    if outcome is JobState.MISSING:
        return CheckVerdict(
            CheckStep.FAILED, f"image {check.image}: its pre-flight {job} disappeared before it finished"
        )
    if elapsed >= IMAGE_CHECK_SECONDS:
        why = what or "no pod was created for it (kubectl describe job/" + check.job_name + ")"
        return CheckVerdict(
            CheckStep.FAILED,
            f"image {check.image} did not pass its pre-flight ({job}) within {duration(IMAGE_CHECK_SECONDS)}: {why}",
        )
    return CheckVerdict(
        CheckStep.WAIT,
        f"checking image {check.image} before stopping the pods ({job}, {elapsed:.0f} s of at most "
        f"{duration(IMAGE_CHECK_SECONDS)}): {what or 'its pod is not created yet'}; the pods keep running",
    )
