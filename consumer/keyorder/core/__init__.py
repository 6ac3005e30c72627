"""The pod's pure core: offset tracking, flow control, lanes, retry and the commit-metadata codec.

Everything here is a plain synchronous data structure or function. Nothing in ``core`` does I/O,
reads a clock (time is a parameter), starts a thread, or imports anything else from ``keyorder``;
an import-linter contract in ``pyproject.toml`` enforces the last point. That is what lets these
modules be tested with tables and property tests, with no broker and no threads.
"""
