"""Developer tools: the local demo, the benchmarks, the embedded broker and load generators.

They run real pods against a real (embedded) broker on one machine. Nothing on a pod's path
imports this package (an import-linter contract checks it), so the runtime image never loads them.
"""
