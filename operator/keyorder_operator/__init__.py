"""keyorder's Kubernetes operator (kopf): reconciles OrderedConsumer resources.

So far this package holds the pure scaling policy (``policy``), unit-tested without a cluster.
The kopf handlers, CR models, resource builders and the ``keyorder operator`` command are the
operator issue's remaining work.
"""
