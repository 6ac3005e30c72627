"""A handler's error whose text cannot be had (``str`` raises): the message's outcome is recorded all the same.

``str(error)`` runs the error's own ``__str__``, which can raise (a library's exception reading an attribute its
constructor never set). Where keyorder turned the error into text that way, the outcome was lost: a worker
process died after its batch call had answered, charging the call's messages that had succeeded, and a
dead-letter write failed every time, so its key waited for good (a review found both). ``core.errors.error_text``
is what they use now.
"""

from __future__ import annotations

import os
from typing import Any

from keyorder.adapters.dead_letters import HEADER_ERROR, dead_letter_headers
from keyorder.core.errors import error_text
from keyorder.engine.process_child import FAILED, PROGRESS_BYTES, SUCCEEDED, Progress, describe, run_batch_call
from keyorder.message import Message


class Unprintable(Exception):
    def __str__(self) -> str:
        raise AttributeError("code")  # an attribute its constructor never set


def test_error_text_is_str_or_says_why_it_could_not_be_had() -> None:
    assert error_text(ValueError("bad payload")) == "bad payload"
    assert error_text(Unprintable()) == "<str() of this Unprintable raised AttributeError>"
    assert describe(Unprintable()) == ("Unprintable", "<str() of this Unprintable raised AttributeError>")


def test_a_dead_letter_of_an_unprintable_error_is_written_with_its_type() -> None:
    headers = dict(dead_letter_headers(Message("t", 0, 7, b"k", b"v"), Unprintable(), attempts=3))
    assert headers[HEADER_ERROR] == b"Unprintable: <str() of this Unprintable raised AttributeError>"


class _BatchRunner:
    """Stands in for ``process_child._Runner``: a batch handler whose first message failed with an unprintable
    error and whose second succeeded."""

    def call_batch(self, messages: list[Any]) -> list[Any]:
        return [Unprintable(), None]


def test_a_worker_process_answers_a_batch_whose_outcome_cannot_be_printed() -> None:
    """The process's side (``run_batch_call``, on a real progress block): it answers, each slot finished; before,
    ``describe`` raised out of it, the process died with the succeeded message's slot still RUNNING, and the pod
    charged that message the death."""
    fd = os.memfd_create("progress")
    os.ftruncate(fd, PROGRESS_BYTES)
    progress = Progress(fd, fresh=True)
    os.close(fd)
    fields = [("t", 0, offset, b"k%d" % offset, b"", (), None, None) for offset in range(2)]
    results = run_batch_call(_BatchRunner(), progress, 1, fields)  # type: ignore[arg-type]
    (_seconds, name, text), succeeded = results
    assert (name, text) == ("Unprintable", "<str() of this Unprintable raised AttributeError>")
    assert isinstance(succeeded, float)
    assert [progress.slot(index)[0] for index in range(2)] == [FAILED, SUCCEEDED]
