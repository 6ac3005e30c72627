"""How ``keyorder catchup`` ends, for whoever runs it: the exit status and the termination message.

The operator runs the command in a Kubernetes Job and must tell apart, without reading logs:

- a run that failed (``EXIT_FAILED``): the waves before the failed one stay committed;
- a run refused for its settings or its runtime (``EXIT_CONFIG``): running it again fails the same way
  until a person changes a setting or the image, so the Job fails at once and catch-up stays off until
  the spec changes;
- a run refused for a state of the group or the topics that passes on its own (``EXIT_PASSING``,
  ``plan.PassingPlanError``: members still in the group, a broker that could not say for now, a partition
  the fence does not name): nothing was handled or committed, and the same run planned again later (with a
  fresh fence) can succeed, so the operator tries again after a back-off.

The status says which; the termination message says why, as one JSON object (``Refusal``) written to
``TERMINATION_LOG``, the file the kubelet copies into the container's ``state.terminated.message``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

log = logging.getLogger(__name__)

EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_PASSING = 3
# and 128 + n when signal n stopped the run (keyorder.catchup.signals.signal_exit_status): 143 for SIGTERM

TERMINATION_LOG = Path("/dev/termination-log")
"""Kubernetes' default ``terminationMessagePath``: the kubelet mounts it into every container and copies
what the container wrote there into its status when it ends. Outside Kubernetes it does not exist and
nothing is written."""
TERMINATION_MESSAGE_BYTES = 4096
"""The kubelet keeps at most this much of a termination message (``MaxContainerTerminationMessageLength``
in kubernetes pkg/kubelet/container)."""


class RefusalKind(StrEnum):
    SETTINGS = "settings"
    """A setting or the runtime (the image) is wrong: a person must change it."""
    PASSING = "passing"
    """The group or the topics are not as a run needs them, for now."""


KAFKA = "kafka"
"""``Refusal.setting`` when the Kafka settings must change: the connection's properties, or the ACLs of
the principal they log in as."""
RUNTIME = "runtime"
"""``Refusal.setting`` when the runtime itself cannot run the job (no PySpark, no Java): the image."""


@dataclass(frozen=True)
class Refusal:
    """Why ``keyorder catchup`` refused to run, before it handled or committed anything."""

    kind: RefusalKind
    reason: str
    setting: str | None = None
    """The flag to change (``--spark-conf``, ``--master``), ``RUNTIME`` for the image, ``None`` when the
    reason names it or nothing is to change (a passing refusal)."""

    @property
    def exit_status(self) -> int:
        return EXIT_PASSING if self.kind is RefusalKind.PASSING else EXIT_CONFIG

    def message(self) -> str:
        """One JSON object within ``TERMINATION_MESSAGE_BYTES`` (the reason cut short if it must be)."""
        data = {"refused": self.kind.value, "setting": self.setting, "reason": self.reason}
        text, reason = json.dumps(data), self.reason
        while len(text.encode()) > TERMINATION_MESSAGE_BYTES and reason:
            over = len(text.encode()) - TERMINATION_MESSAGE_BYTES  # each character takes a byte or more
            reason = reason[: max(len(reason) - over - len(" ..."), 0)]
            text = json.dumps({**data, "reason": f"{reason} ..."})
        return text

    @classmethod
    def parse(cls, text: str | None) -> Refusal | None:
        """The refusal in a termination message; ``None`` when it holds none (another ending, or a log's tail)."""
        try:
            data = json.loads(text or "")
            return cls(RefusalKind(data["refused"]), str(data["reason"]), data.get("setting"))
        except (ValueError, TypeError, KeyError):
            return None


def write_termination_message(refusal: Refusal, path: Path | None = None) -> None:
    """Leave ``refusal`` where the kubelet reads it (``TERMINATION_LOG``), when the process runs in a
    Kubernetes container."""
    path = path or TERMINATION_LOG
    if not path.exists():
        return
    try:
        path.write_text(refusal.message())
    except OSError as error:  # the exit status still says what kind of refusal it was
        log.warning("could not write the termination message to %s: %s", path, error)
