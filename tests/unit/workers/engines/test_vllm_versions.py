"""The vLLM engine's pure parts (no vLLM needed): version stamps from vLLM's spans, its settings."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipelinerl.platform.config import ConfigError, load_config
from pipelinerl.workers.engines.vllm_engine import _given_id, token_versions, version_runs


@dataclass
class Span:  # the shape of vllm.outputs.WeightVersionSpan
    version: str
    start: int
    end: int


def test_spans_become_one_version_per_token():
    spans = [Span("3", 0, 2), Span("4", 2, 5), Span("6", 5, 6)]
    assert token_versions(spans, 6) == [3, 3, 4, 4, 4, 6]


def test_a_request_started_after_an_update_has_one_span():
    assert token_versions([Span("7", 0, 4)], 4) == [7, 7, 7, 7]
    assert token_versions(None, 0) == []


@pytest.mark.parametrize(
    ("spans", "num_tokens", "message"),
    [
        (None, 3, "no weight version"),
        ([Span("1", 0, 2), Span("2", 3, 4)], 4, "gap at token 3"),
        ([Span("1", 0, 2)], 3, "cover 2 of 3 tokens"),
    ],
)
def test_spans_that_do_not_cover_the_tokens_exactly_are_errors(spans, num_tokens, message):
    with pytest.raises(RuntimeError, match=message):
        token_versions(spans, num_tokens)


def test_vllm_engine_and_its_cache_policy_are_accepted():
    config = load_config(overrides=["actor.engine=vllm", "actor.kv_cache_on_update=recompute"])
    assert config.actor.engine == "vllm" and config.actor.kv_cache_on_update == "recompute"


def test_recompute_needs_the_vllm_engine():
    with pytest.raises(ConfigError, match="kv_cache_on_update='recompute' needs actor.engine='vllm'"):
        load_config(overrides=["actor.kv_cache_on_update=recompute"])
    with pytest.raises(ConfigError, match="actor.kv_cache_on_update"):
        load_config(overrides=["actor.engine=vllm", "actor.kv_cache_on_update=drop"])


def test_vllm_internal_request_ids_map_back_to_the_actor_s():
    """vLLM 0.32 appends ``-<8 characters>`` to a request id; 0.27 keeps it. Either maps back, and an id
    that itself holds a dash is not confused with a shorter one."""
    given = {"a0-p12-x": None, "a0-p12": None, "r1": None}
    assert _given_id("r1-1a2b3c4d", given) == "r1"
    assert _given_id("r1", given) == "r1"
    assert _given_id("a0-p12-x", given) == "a0-p12-x"
    assert _given_id("a0-p12-x-1a2b3c4d", given) == "a0-p12-x"
    assert _given_id("a0-p12-1a2b3c4d", given) == "a0-p12"


def test_version_runs_name_each_span_for_messages():
    assert version_runs([0, 0, 1, 1, 1, 3]) == [(0, 2), (1, 3), (3, 1)]
    assert version_runs([]) == []
