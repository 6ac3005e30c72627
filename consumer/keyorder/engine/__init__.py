"""The pod's engine: the poll loop and the workers that run the user's handler, between the broker seams
(``keyorder.contracts``) and the pure decisions (``keyorder.core``).

* ``poll_loop``: the one thread that reads, routes messages to their key's lane, applies flow control and
  marks completions (``ConsumerRuntime``);
* ``worker_pools``: W workers on threads or asyncio tasks running whichever lane is ready;
* ``process_pool`` and ``process_child``: the process executor, the pod's side and the worker process's side;
* ``committer``: commits each partition's lowest unfinished offset.

The engine imports ``core`` and ``contracts`` only, never an adapter (pyproject.toml's import contracts), so it
can be read and tested without librdkafka. ``keyorder.pod`` wires it to the Kafka adapters.
"""
