"""keyorder's Kubernetes operator (kopf): reconciles OrderedConsumer resources.

Not implemented yet: see the operator issue. This package exists so the distribution layout
(``consumer/keyorder`` and ``operator/keyorder_operator``) is fixed from the start.
"""
