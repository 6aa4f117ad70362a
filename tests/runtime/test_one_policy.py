"""The one-policy check of partition scope (perceptron_stream.runtime.partitions.OnePolicy), on the members a
group describes: who keeps a newcomer from processing, and the setting its refusal names."""

from __future__ import annotations

from perceptron_stream.config import ConfigError, ServeSettings, load
from perceptron_stream.runtime.factory import policy_client_id
from perceptron_stream.runtime.health import Health
from perceptron_stream.runtime.partitions import OnePolicy
from perceptron_stream.runtime.retry import Retry


def _guard(*flags: str) -> OnePolicy:
    s = load(ServeSettings, ["--metrics-port", "0", "--model-scope", "partition", *flags])
    return OnePolicy(s, Retry(Health(60.0), lambda: False), Health(60.0), policy_client_id(s))


def _client(*flags: str) -> str:
    return policy_client_id(load(ServeSettings, ["--metrics-port", "0", "--model-scope", "partition", *flags]))


def test_members_of_the_same_policy_and_programs_that_say_none_are_not_judged():
    guard = _guard()
    members = {"me": _client(), "peer": _client(), "tool": "rdkafka", "old": "perceptron-stream"}
    assert guard.others(members) == []


def test_a_member_of_another_variant_is_refused_naming_variant():
    guard = _guard()
    others = guard.others({"me": _client(), "peer": _client("--variant", "averaged")})
    assert others == [_client("--variant", "averaged")]
    refusal = guard.refusal(others)
    assert isinstance(refusal, ConfigError)
    assert str(refusal).startswith("invalid setting variant (--variant")
    assert "variant is 'averaged' there, 'plain' here" in str(refusal)


def test_a_key_or_none_is_refused_naming_checkpoint_key_and_the_client_id_tells_nothing_of_the_key():
    guard = _guard("--checkpoint-key", "k" * 32)
    refusal = guard.refusal(guard.others({"me": _client("--checkpoint-key", "k" * 32), "peer": _client()}))
    assert str(refusal).startswith("invalid setting checkpoint_key (--checkpoint-key")
    assert _client("--checkpoint-key", "k" * 32) == _client("--checkpoint-key", "j" * 32)  # whether, not which
    assert _client("--checkpoint-key", "k" * 32).endswith(";key=signed")
