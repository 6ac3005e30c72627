"""How status and Events name a message key: by a keyed digest, unless the resource asks for keys.

Keys are often customer or account ids, and an OrderedConsumer's status and Events are readable by
anyone with the aggregated ``view`` role. So the operator names the busiest key there by
``key:`` and the first 12 hex digits of an HMAC-SHA256 of the key under the resource's admin token
(a Secret the ``view`` role cannot read): stable across polls and pods, so a hot key is followed
over time, but not reversible by hashing a list of likely ids. ``spec.observability.showKeys: true``
shows the keys themselves. The pods' own scaling report (behind the same token) keeps the key, and
``keyorder key-digest`` turns a key into its name for whoever holds the token.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import sys
from dataclasses import replace
from pathlib import Path

from keyorder_operator.pod_signals import PodSignals

DIGEST_PREFIX = "key:"
DIGEST_HEX_DIGITS = 12


def key_digest(key: str, token: str) -> str:
    """The name status and Events give ``key`` (its text as the pods report it) under ``token``."""
    digest = hmac.new(token.encode(), key.encode("utf-8", errors="surrogateescape"), hashlib.sha256).hexdigest()
    return DIGEST_PREFIX + digest[:DIGEST_HEX_DIGITS]


def with_key_digests(signals: PodSignals | None, token: str | None) -> PodSignals | None:
    """``signals`` with the busiest key named by its digest (no token: by nothing at all)."""
    if signals is None or signals.busiest is None or signals.ordering == "partition":
        return signals  # a partition lane is named by its partition, which is no secret
    name = key_digest(signals.busiest.key, token) if token else DIGEST_PREFIX + "hidden"
    return replace(signals, busiest=replace(signals.busiest, key=name))


def add_key_digest_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", nargs="+", help="the key(s) as text")
    parser.add_argument(
        "--token-file",
        type=Path,
        required=True,
        help="a file holding the resource's admin token (the 'token' key of the NAME-admin-token Secret)",
    )


def key_digest_command(args: argparse.Namespace) -> int:
    """Print ``KEY<TAB>key:...`` per key: what status and Events call it."""
    try:
        token = args.token_file.read_text().strip()
    except OSError as error:
        print(f"keyorder key-digest: cannot read --token-file {args.token_file}: {error.strerror}", file=sys.stderr)
        return 2
    if not token:
        print(f"keyorder key-digest: --token-file {args.token_file} is empty", file=sys.stderr)
        return 2
    for key in args.key:
        print(f"{key}\t{key_digest(key, token)}")
    return 0
