"""How a handler's error is told as text, in dead-letter headers, logs and the process executor's answers.

It exists because ``str(error)`` can raise: a library's exception whose ``__str__`` reads an attribute its
constructor never set, or returns something that is not a string. Where keyorder turned a handler's error into
text that way, such an error stopped the message's outcome from being recorded: in a worker process it killed
the process after the call had answered, and the messages of the call that had succeeded were charged the death;
in the dead-letter sink it made every write fail, so the key waited on a write that could never succeed. The
error is the handler's; what becomes of the message must not depend on whether it can be printed.

Pure: no I/O.
"""

from __future__ import annotations


def error_text(error: BaseException) -> str:
    """``str(error)``; when that raises, a text naming the error's type and what ``str`` raised instead."""
    try:
        return str(error)
    except Exception as failure:
        return f"<str() of this {type(error).__name__} raised {type(failure).__name__}>"
