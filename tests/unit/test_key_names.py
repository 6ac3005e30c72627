"""Keys in status and Events: named by a digest under the resource's admin token unless showKeys."""

from __future__ import annotations

import re

from keyorder.cli import main
from keyorder_operator.key_names import key_digest, with_key_digests
from keyorder_operator.pod_signals import BusiestLane
from keyorder_operator.spec import OrderedConsumerSpec
from tests.unit.test_policy_signals import pods


def test_a_digest_is_stable_short_and_depends_on_the_token() -> None:
    name = key_digest("acct-42", "token-a")
    assert re.fullmatch(r"key:[0-9a-f]{12}", name)
    assert key_digest("acct-42", "token-a") == name
    assert key_digest("acct-42", "token-b") != name, "without the token a list of likely ids must not reverse it"
    assert key_digest("acct-43", "token-a") != name


def test_the_busiest_key_is_replaced_and_nothing_else_changes() -> None:
    signals = pods(2, 16, busiest=BusiestLane(key="acct-42", where="orders[3]", backlog=900))
    hidden = with_key_digests(signals, "token-a")
    assert hidden is not None and hidden.busiest is not None
    assert hidden.busiest.key == key_digest("acct-42", "token-a")
    assert (hidden.busiest.where, hidden.busiest.backlog, hidden.queued) == ("orders[3]", 900, signals.queued)
    no_token = with_key_digests(signals, None)
    assert no_token is not None and no_token.busiest is not None and no_token.busiest.key == "key:hidden"


def test_a_partition_lane_keeps_its_name_and_no_report_stays_none() -> None:
    lane = BusiestLane(key="orders[3]", where="orders[3]", backlog=900)
    signals = pods(2, 16, busiest=lane, ordering="partition")
    assert with_key_digests(signals, "token-a") == signals
    assert with_key_digests(None, "token-a") is None


def test_keys_are_hidden_by_default_and_shown_on_request() -> None:
    base = {
        "kafka": {"bootstrapServers": "k:9092", "topics": ["t"], "groupId": "g"},
        "handler": {"image": "i", "handler": "m:f"},
    }
    assert OrderedConsumerSpec.model_validate(base).observability.show_keys is False
    shown = OrderedConsumerSpec.model_validate({**base, "observability": {"showKeys": True}})
    assert shown.observability.show_keys is True


def test_keyorder_key_digest_prints_the_name_and_refuses_a_missing_or_empty_token(tmp_path, capsys) -> None:
    token = tmp_path / "token"
    token.write_text("token-a\n")
    assert main(["key-digest", "--token-file", str(token), "acct-42", "acct-43"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"acct-42\t{key_digest('acct-42', 'token-a')}", f"acct-43\t{key_digest('acct-43', 'token-a')}"]
    empty = tmp_path / "empty"
    empty.write_text("")
    assert main(["key-digest", "--token-file", str(empty), "acct-42"]) == 2
    assert "is empty" in capsys.readouterr().err
    assert main(["key-digest", "--token-file", str(tmp_path / "missing"), "acct-42"]) == 2
    assert "cannot read --token-file" in capsys.readouterr().err
