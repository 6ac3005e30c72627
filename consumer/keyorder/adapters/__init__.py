"""The pod's adapters: the I/O behind the engine's seams and around it.

``kafka_source`` implements ``contracts.Source`` with confluent-kafka, ``dead_letters`` implements
``contracts.DeadLetterSink``, ``http_server`` and ``metrics`` expose the pod, and ``handlers``
loads the user's handler. The engine (``runtime``, ``workers``) never imports from here; only the
composition root (``pod``) wires an adapter to the engine.
"""
