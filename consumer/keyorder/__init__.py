"""keyorder: key-ordered Kafka consumers that scale past the partition count.

The public surface is deliberately tiny: a handler is ``handler(message: Message)``
(plain function or ``async def``) and is started with ``keyorder run --handler pkg.mod:fn``;
with ``--batch-max-messages`` above 1 it is a batch handler, ``handle_batch(messages)``, whose
contract ``keyorder.batch`` states.
Everything else in this package is internal and may move between releases.
"""

from keyorder.message import Message

__all__ = ["Message", "__version__"]
__version__ = "0.1.0"
