"""The catch-up hand-over, step by step: stop the pods, run the Spark Job up to the fence, give the
group back to the pods.

The decision to hand over is pure (``catchup.catchup_verdict``) and so is the Job's state machine
(``catchup.CatchupRun``); this module does the I/O of each step for one poll (scale, create the Job,
Events, status), through the poll's patch and conditions, so a hand-over survives an operator restart
exactly where the status says it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kubernetes.client.rest import ApiException

from keyorder_operator.builders import (
    FENCE_ANNOTATION,
    build_catchup_job,
    catchup_executor_selector,
    catchup_job_name,
    catchup_selector,
    selector_labels,
)
from keyorder_operator.catchup import (
    CatchupRun,
    JobState,
    Phase,
    catchup_pods_left,
    config_failure,
    fence_argument,
    fence_from_end_offsets,
    job_state,
    stopping_pods_deadline,
)
from keyorder_operator.kube import JobConflict
from keyorder_operator.status import timestamp

if TYPE_CHECKING:
    from keyorder_operator.poll import Poll


class CatchupHandover:
    """The hand-over steps of one poll (``Poll`` carries the resource, its patch and its conditions)."""

    def __init__(self, poll: Poll) -> None:
        self.poll = poll
        self.kube = poll.context.kube
        self.namespace, self.name = poll.namespace, poll.name

    def start(self, trigger: str, end_offsets: tuple[tuple[str, int, int], ...], replicas: int) -> None:
        """Record the fence, scale the pods to 0; the Job starts once they are gone."""
        poll = self.poll
        run = CatchupRun(
            Phase.STOPPING_PODS,
            catchup_job_name(self.name, poll.now),
            fence_from_end_offsets(end_offsets),
            poll.now,
            resume_replicas=max(replicas, poll.spec.replicas.min, 1),
        )
        self.kube.scale(self.namespace, self.name, 0)
        poll.context.metrics.catchups.labels(self.namespace, self.name, "started").inc()
        poll.context.metrics.catching_up.labels(self.namespace, self.name).set(1)
        poll.info("CatchupStarted", f"{trigger}; stopping the pods for Job {run.job_name} (fence in status.catchup)")
        poll.patch.status["catchup"] = run.to_status()
        poll.patch.status["replicas"] = 0
        poll.condition("CatchingUp", True, "StoppingPods", trigger)
        poll.patch.status["lastDecision"] = {"reason": f"catch-up: {trigger}", "time": timestamp(poll.now)}

    def follow(self, run: CatchupRun, replicas: int) -> None:
        """Advance a hand-over: pods gone -> create the Job; Job finished and its pods gone -> resume the pods."""
        poll, kube = self.poll, self.kube
        if replicas != 0:
            kube.scale(self.namespace, self.name, 0)  # nothing may consume the group while the Job owns it
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
                )
            elif left:
                poll.condition("CatchingUp", True, "StoppingPods", f"waiting for {left} consumer pods to stop")
            else:
                self.start_job(run)
            return
        job = kube.job(self.namespace, run.job_name)
        outcome = job_state(job)
        if outcome is JobState.ACTIVE:
            return
        # a deleted or failed Job's driver, and any Job's Spark executors, may still be handling messages
        waiting = catchup_pods_left(
            run.job_name,
            outcome,
            drivers=kube.pod_count(self.namespace, catchup_selector(run.job_name)),
            executors=kube.pod_count(self.namespace, catchup_executor_selector(run.job_name)),
        )
        if waiting:
            if not self.finishing_already():
                poll.info("CatchupFinishing", waiting)
            poll.condition("CatchingUp", True, "Finishing", waiting)
            return
        if outcome is JobState.SUCCEEDED:
            detail = f"Job {run.job_name} committed the fence after {poll.now - run.started_at:.0f} s"
        elif (refused := config_failure(job)) is not None:
            detail = f"Job {run.job_name} failed after {poll.now - run.started_at:.0f} s: {refused}"
        else:
            what = "failed" if outcome is JobState.FAILED else "disappeared"
            detail = (
                f"Job {run.job_name} {what} after {poll.now - run.started_at:.0f} s (a failed catch-up keeps "
                "the waves it committed; the rest is the pods' again)"
            )
        self.finish(run, outcome, detail)

    def finishing_already(self) -> bool:
        """The last poll waited for the Job's pods too (its Event was posted then)."""
        return any(
            entry.get("type") == "CatchingUp" and entry.get("reason") == "Finishing" for entry in self.poll.conditions
        )

    def start_job(self, run: CatchupRun) -> None:
        poll = self.poll
        owner = {"metadata": {"name": self.name, "namespace": self.namespace, "uid": poll.meta["uid"]}}
        try:
            self.kube.create_job(
                build_catchup_job(poll.spec, owner, run.job_name, fence_argument(run.fence)), FENCE_ANNOTATION
            )
        except (ApiException, JobConflict) as error:
            reason = error.reason if isinstance(error, ApiException) else str(error)
            self.finish(run, JobState.FAILED, f"Job {run.job_name} could not be created: {reason}")
            return
        poll.info("CatchupRunning", f"pods stopped; Job {run.job_name} started")
        poll.patch.status["catchup"] = run.running().to_status()
        poll.condition("CatchingUp", True, "Running", f"Job {run.job_name} handles the backlog up to the fence")

    def finish(self, run: CatchupRun, outcome: JobState, detail: str) -> None:
        """Give the group back to the pods, and say how the hand-over ended."""
        poll = self.poll
        self.kube.scale(self.namespace, self.name, run.resume_replicas)
        if outcome is JobState.SUCCEEDED:
            message = f"{detail}; {run.resume_replicas} pods resume from it"
            poll.info("CatchupSucceeded", message)
            poll.condition("CatchupFailed", False, "Succeeded", message)
        else:
            message = (
                f"{detail}; {run.resume_replicas} pods resume from the group's committed offsets. "
                "Automatic catch-up is off until the spec changes."
            )
            poll.warn("CatchupFailed", message)
            poll.condition("CatchupFailed", True, "JobFailed", message)
            poll.patch.status["catchupFailedGeneration"] = poll.meta.get("generation")
        poll.context.metrics.catchups.labels(self.namespace, self.name, outcome.value).inc()
        poll.context.metrics.catching_up.labels(self.namespace, self.name).set(0)
        poll.condition("CatchingUp", False, outcome.value.capitalize(), message)
        status = poll.patch.status
        status["catchup"] = None
        status["lastCatchupEndedAt"] = poll.now  # the cooldown counts from here
        status["catchupVotes"] = 0
        status["lastSample"] = None  # rates must not span the hand-over
        poll.memory.last_sample = None
        status["replicas"] = run.resume_replicas
        status["lastDecision"] = {"reason": message, "time": timestamp(poll.now)}
