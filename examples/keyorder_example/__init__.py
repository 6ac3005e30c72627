"""Example keyorder handlers: an account ledger that must apply each account's events in order."""
