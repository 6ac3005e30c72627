"""The catch-up hand-over, step by step: check the image, stop the pods, run the Spark Job up to the
fence, give the group back to the pods.

The decision to hand over is pure (``catchup.catchup_verdict``), and so are the image's pre-flight
(``image_check.image_check_verdict``) and the Job's state machine (``catchup.CatchupRun``); this module
does the I/O of each step for one poll (the pre-flight Job, scale, create the Job, Events, status),
through the poll's patch and conditions, so a hand-over survives an operator restart exactly where the
status says it is.

Its writes of the replicas are compare-and-swaps, as every other (``Kube.scale`` with ``expected``: the
replicas this poll read): a size written meanwhile (``kubectl scale``, an HPA) is never overwritten by a
step that did not see it. Replicas another autoscaler scales (``PolledResource.other_autoscaler``:
``ScalingConflict``) are never written at all: a hand-over not yet running ends without a Job, and one
whose Job runs leaves the pods' size to that autoscaler when it ends.
"""

from __future__ import annotations

import logging
from typing import Any

from kubernetes.client.rest import ApiException

from keyorder.catchup.exits import Refusal, RefusalKind
from keyorder_operator.builders import (
    FENCE_ANNOTATION,
    IMAGE_CHECK_ANNOTATION,
    build_catchup_job,
    build_image_check_job,
    catchup_executor_selector,
    catchup_job_name,
    catchup_selector,
    image_check_job_name,
    selector_labels,
)
from keyorder_operator.catchup import (
    CatchupRetry,
    CatchupRun,
    JobState,
    Phase,
    catchup_pods_left,
    fence_argument,
    fence_from_end_offsets,
    job_refusal,
    job_state,
    refusal_detail,
    stopping_pods_deadline,
    unobserved_drain_seconds,
    unobserved_executors_left,
)
from keyorder_operator.image_check import (
    IMAGE_CHECK_SECONDS,
    CheckStep,
    ImageCheck,
    checked_status,
    image_check_verdict,
    image_checked,
    pod_state,
)
from keyorder_operator.kube import JobConflict
from keyorder_operator.policy import duration
from keyorder_operator.polled_resource import PolledResource
from keyorder_operator.status import condition_is, timestamp

log = logging.getLogger(__name__)


class CatchupHandover:
    """The hand-over steps of one poll (``PolledResource`` carries the resource, its patch and its conditions)."""

    def __init__(self, poll: PolledResource) -> None:
        self.poll = poll
        self.kube = poll.context.kube
        self.namespace, self.name = poll.namespace, poll.name

    def owner(self) -> dict[str, Any]:
        return {"metadata": {"name": self.name, "namespace": self.namespace, "uid": self.poll.meta["uid"]}}

    def image_ready(self, trigger: str | None) -> bool:
        """Whether ``spec.catchup.image`` passed its pre-flight with the pod spec a check Job would have now
        (``image_check``). Otherwise start that Job (only with a ``trigger``: a hand-over that would start
        now) or follow the one under way, and say so; the pods keep running throughout. Without a trigger a
        check under way is still followed, so its outcome is recorded and explained."""
        poll, status = self.poll, self.poll.patch.status
        image = poll.spec.catchup.image
        check = ImageCheck.from_status(poll.status)
        if image is None or not poll.spec.catchup.enabled:
            if check is not None:
                status["catchupImageCheck"] = None  # catch-up was turned off meanwhile: nothing to check for
            return False
        desired = build_image_check_job(poll.spec, self.owner(), image_check_job_name(self.name, poll.now))
        digest = desired["metadata"]["annotations"][IMAGE_CHECK_ANNOTATION]
        if image_checked(poll.status, image, digest):
            if check is not None:
                status["catchupImageCheck"] = None
            return True
        if check is not None and (check.image, check.digest) != (image, digest):
            check = None  # the spec changed under the check: its result would not tell about this one
            status["catchupImageCheck"] = None
        if check is None:
            if trigger is not None:
                self.start_image_check(trigger, image, digest, desired)
            return False
        job = self.kube.job(self.namespace, check.job_name)
        state = pod_state(self.kube.pods(self.namespace, catchup_selector(check.job_name)))
        verdict = image_check_verdict(check, job_state(job), state, poll.now)
        if verdict.step is CheckStep.WAIT:
            status["catchupImageCheck"] = check.seen(state).to_status()
            poll.condition("CatchingUp", True, "CheckingImage", verdict.message)
            return False
        status["catchupImageCheck"] = None
        if verdict.step is CheckStep.PASSED:
            status["catchupImageChecked"] = checked_status(check, timestamp(poll.now))
            poll.info("CatchupImageChecked", verdict.message)
            if trigger is None:  # no hand-over wins any more: nothing to start now
                poll.condition("CatchingUp", False, "ImageChecked", f"{verdict.message}; no catch-up is due now")
            return True
        message = (
            f"{verdict.message}. The pods were not stopped; automatic catch-up is off until the spec changes "
            "(fix spec.catchup.image: build it from the image's `catchup` target with your handler)"
        )
        poll.warn("CatchupFailed", message)
        poll.context.metrics.catchups.labels(self.namespace, self.name, "image_failed").inc()
        poll.condition("CatchupFailed", True, "ImageCheckFailed", message)
        poll.condition("CatchingUp", False, "ImageCheckFailed", message)
        status["catchupFailedGeneration"] = poll.meta.get("generation")
        status["catchupVotes"] = 0
        status["lastDecision"] = {"reason": message, "time": timestamp(poll.now)}
        return False

    def start_image_check(self, trigger: str, image: str, digest: str, desired: dict[str, Any]) -> None:
        poll = self.poll
        check = ImageCheck(image, digest, desired["metadata"]["name"], poll.now)
        try:
            self.kube.create_job(desired, IMAGE_CHECK_ANNOTATION)
        except (ApiException, JobConflict) as error:  # tried again on the next poll that wins
            reason = error.reason if isinstance(error, ApiException) else str(error)
            message = f"{trigger}; the pre-flight Job {check.job_name} of image {image} could not be created: {reason}"
            poll.warn("CatchupImageCheckFailed", message)
            poll.condition("CatchingUp", False, "ImageCheckNotCreated", message)
            return
        message = (
            f"{trigger}; checking image {image} first (Job {check.job_name}: Java, PySpark and the handler, at "
            f"most {duration(IMAGE_CHECK_SECONDS)}); the pods keep running until it passed"
        )
        poll.info("CatchupCheckingImage", message)
        poll.patch.status["catchupImageCheck"] = check.to_status()
        poll.condition("CatchingUp", True, "CheckingImage", message)

    def start(self, trigger: str, end_offsets: tuple[tuple[str, int, int], ...], replicas: int) -> None:
        """Record the fence, scale the pods to 0 (from ``replicas``, the size this poll read: if it moved
        meanwhile, nothing starts and the next poll decides from the new size); the Job starts once they are
        gone."""
        poll = self.poll
        if self.kube.scale(self.namespace, self.name, 0, expected=replicas) is None:
            log.info(
                "%s/%s: the replicas are no longer %d, the size this poll read; the catch-up hand-over does not "
                "start, the next poll decides from the new size",
                self.namespace,
                self.name,
                replicas,
            )
            return
        run = CatchupRun(
            Phase.STOPPING_PODS,
            catchup_job_name(self.name, poll.now),
            fence_from_end_offsets(end_offsets),
            poll.now,
            resume_replicas=max(replicas, poll.spec.replicas.min, 1),
        )
        poll.context.metrics.catchups.labels(self.namespace, self.name, "started").inc()
        poll.context.metrics.catching_up.labels(self.namespace, self.name).set(1)
        poll.info("CatchupStarted", f"{trigger}; stopping the pods for Job {run.job_name} (fence in status.catchup)")
        poll.patch.status["catchup"] = run.to_status()
        poll.patch.status["replicas"] = 0
        poll.condition("CatchingUp", True, "StoppingPods", trigger)
        poll.patch.status["lastDecision"] = {"reason": f"catch-up: {trigger}", "time": timestamp(poll.now)}

    def follow(self, run: CatchupRun, replicas: int) -> None:
        """Advance a hand-over: pods gone -> create the Job; Job finished and its pods gone -> resume the pods.
        ``replicas``: the Deployment's, as this poll read them."""
        poll, kube = self.poll, self.kube
        # the replicas the hand-over may write over (None: not its to write: another autoscaler's, or moved)
        current: int | None = replicas
        if poll.other_autoscaler(replicas):  # an HPA took the replicas: never taken back (ScalingConflict)
            current = None
            if run.phase is Phase.STOPPING_PODS:
                self.finish(
                    run,
                    JobState.FAILED,
                    "another autoscaler scales the Deployment (condition ScalingConflict names it): the pods cannot "
                    "be stopped for the Job; no Job was started",
                    current,
                )
                return
        elif replicas != 0:  # nothing may consume the group while the Job owns it (a kubectl scale, say)
            current = 0 if kube.scale(self.namespace, self.name, 0, expected=replicas) is not None else None
        if run.phase is Phase.STOPPING_PODS:
            left = max(
                kube.pod_count(self.namespace, selector_labels(self.name)),
                kube.deployment_pods_reported(self.namespace, self.name),
            )
            if left and poll.now > stopping_pods_deadline(run, poll.spec.handler.termination_grace_period_seconds):
                self.finish(
                    run,
                    JobState.FAILED,
                    f"{left} consumer pods did not stop within {poll.now - run.started_at:.0f} s; no Job was started",
                    current,
                )
            elif left:
                poll.condition("CatchingUp", True, "StoppingPods", f"waiting for {left} consumer pods to stop")
            else:
                self.start_job(run, current)
            return
        job = kube.job(self.namespace, run.job_name)
        outcome = job_state(job)
        if outcome is JobState.ACTIVE:
            return
        if run.job_ended_at is None:  # the drain window of executors the operator cannot see counts from here
            run = run.job_ended(poll.now)
            poll.patch.status["catchup"] = run.to_status()
        # refused before Spark started (keyorder catchup's exit 2 or 3): no executor ever had a task
        refusal = (
            job_refusal(job, kube.pods(self.namespace, catchup_selector(run.job_name)))
            if outcome is JobState.FAILED
            else None
        )
        # a deleted or failed Job's driver, and any Job's Spark executors, may still be handling messages
        waiting = catchup_pods_left(
            run.job_name,
            outcome,
            drivers=kube.pod_count(self.namespace, catchup_selector(run.job_name)),
            executors=kube.pod_count(self.namespace, catchup_executor_selector(run.job_name)),
        ) or (unobserved_executors_left(run, poll.now) if refusal is None else None)
        if waiting:
            if not self.finishing_already():
                poll.info("CatchupFinishing", waiting)
            poll.condition("CatchingUp", True, "Finishing", waiting)
            return
        took = f"{poll.now - run.started_at:.0f} s"
        if outcome is JobState.SUCCEEDED:
            detail = f"Job {run.job_name} committed the fence after {took}"
        elif refusal is not None:
            told = refusal_detail(refusal, poll.spec.catchup.image, run.job_name)
            detail = f"Job {run.job_name} was refused after {took}: {told}"
        else:
            what = "failed" if outcome is JobState.FAILED else "disappeared"
            detail = (
                f"Job {run.job_name} {what} after {took} (a failed catch-up keeps "
                "the waves it committed; the rest is the pods' again)"
            )
        self.finish(run, outcome, detail, current, refusal)

    def finishing_already(self) -> bool:
        """The last poll waited for the Job's pods too (its Event was posted then)."""
        return any(
            entry.get("type") == "CatchingUp" and entry.get("reason") == "Finishing" for entry in self.poll.conditions
        )

    def start_job(self, run: CatchupRun, replicas: int | None) -> None:
        poll = self.poll
        batch = poll.spec.handler.batch
        if batch.enabled:  # the spec changed since the hand-over began; it refuses a batch handler with catch-up on
            self.finish(
                run,
                JobState.FAILED,
                f"Job {run.job_name} not started: the spec now names a batch handler (spec.handler.batch.maxMessages "
                f"{batch.max_messages}), and a catch-up Job calls the handler once per message; the backlog is the "
                "pods' again",
                replicas,
            )
            return
        try:
            self.kube.create_job(
                build_catchup_job(poll.spec, self.owner(), run.job_name, fence_argument(run.fence)), FENCE_ANNOTATION
            )
        except (ApiException, JobConflict) as error:
            reason = error.reason if isinstance(error, ApiException) else str(error)
            self.finish(run, JobState.FAILED, f"Job {run.job_name} could not be created: {reason}", replicas)
            return
        poll.info("CatchupRunning", f"pods stopped; Job {run.job_name} started")
        catchup = poll.spec.catchup
        poll.patch.status["catchup"] = run.running(
            unobserved_drain_seconds(catchup.master, catchup.spark_conf)
        ).to_status()
        poll.condition("CatchingUp", True, "Running", f"Job {run.job_name} handles the backlog up to the fence")

    def finish(
        self, run: CatchupRun, outcome: JobState, detail: str, replicas: int | None, refusal: Refusal | None = None
    ) -> None:
        """Give the group back to the pods, and say how the hand-over ended. The pods' size goes back to
        ``run.resume_replicas`` only from ``replicas``, the size the hand-over knows the Deployment has (a
        compare-and-swap); with ``None`` (another autoscaler's replicas, or moved since this poll's read), or
        if they moved meanwhile, it is left as it is, and the next poll decides from it.

        A ``refusal`` that passes (``RefusalKind.PASSING``) leaves catch-up on: it is tried again after the
        back-off in ``status.catchupRetry``, unless it is the ``RETRY_LIMIT``-th in a row
        (``CatchupRetry.exhausted``); any other failure switches it off for this spec generation."""
        poll = self.poll
        resumed = (
            replicas is not None
            and self.kube.scale(self.namespace, self.name, run.resume_replicas, expected=replicas) is not None
        )
        if resumed:
            where = "it" if outcome is JobState.SUCCEEDED else "the group's committed offsets"
            pods = f"{run.resume_replicas} pods resume from {where}"
        elif condition_is(poll.conditions, "ScalingConflict"):
            pods = "the pods' replicas are left to the other autoscaler (condition ScalingConflict names it)"
        else:
            pods = "the pods' replicas moved during the hand-over and are left as they are"
        status = poll.patch.status
        retry = (
            CatchupRetry.after(CatchupRetry.from_status(poll.status), refusal.reason, poll.now)
            if refusal is not None and refusal.kind is RefusalKind.PASSING
            else None
        )
        passing = retry is not None and not retry.exhausted
        if outcome is JobState.SUCCEEDED:
            message = f"{detail}; {pods}"
            poll.info("CatchupSucceeded", message)
            poll.condition("CatchupFailed", False, "Succeeded", message)
            status["catchupRetry"] = None
        elif retry is not None and not retry.exhausted:
            message = f"{detail}; {pods}. This passes: {retry.describe(poll.now)}, with a new fence"
            poll.warn("CatchupDeferred", message)
            poll.condition("CatchupFailed", False, "Passing", message)
            status["catchupRetry"] = retry.to_status()
        else:
            if retry is not None:
                reason = "PassingRefusalsInARow"
                detail = (
                    f"{detail}; {retry.failures} refusals in a row for a state that should pass, so it does not "
                    "(a consumer outside this OrderedConsumer in the group, say)"
                )
            else:
                reason = "Refused" if refusal is not None else "JobFailed"
            message = f"{detail}; {pods}. Automatic catch-up is off until the spec changes."
            poll.warn("CatchupFailed", message)
            poll.condition("CatchupFailed", True, reason, message)
            status["catchupFailedGeneration"] = poll.meta.get("generation")
            status["catchupRetry"] = None
        label = "passing" if passing else outcome.value
        poll.context.metrics.catchups.labels(self.namespace, self.name, label).inc()
        poll.context.metrics.catching_up.labels(self.namespace, self.name).set(0)
        poll.condition("CatchingUp", False, "Passing" if passing else outcome.value.capitalize(), message)
        status["catchup"] = None
        status["lastCatchupEndedAt"] = poll.now  # the cooldown counts from here
        status["catchupVotes"] = 0
        status["lastSample"] = None  # rates must not span the hand-over
        poll.memory.last_sample = None
        if resumed:
            status["replicas"] = run.resume_replicas
        status["lastDecision"] = {"reason": message, "time": timestamp(poll.now)}
