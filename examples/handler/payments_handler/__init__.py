"""Example handler package: per-account balances from payment events.

The shape of a real handler project (see ``examples/handler/``): keyorder calls
``payments_handler.handler:handle`` once per message. Messages of one account (the message key)
arrive in offset order, one at a time, on one key worker; different accounts run in parallel.
"""
