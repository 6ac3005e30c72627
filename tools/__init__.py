"""Generators of derived files (docs tables, the chart's values table, the image's locks).

Run them all with ``make generate``. Each has a drift test under ``tests/``. They live outside
the wheel and outside ``tests/``: they write files, tests only compare.
"""
