"""The vLLM engine's pure parts (no vLLM needed): version stamps from vLLM's spans, its settings."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipelinerl.platform.config import ConfigError, load_config
from pipelinerl.workers.engines.vllm_engine import token_versions


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
