"""The transformers engine on a real model: continuous batching and in-flight weight updates.

The check of exactness: after an update in the middle of generation, every token's behaviour
log-prob is recomputed independently with plain forward passes — tokens before the switch under
the old weights, tokens after it under the new weights on top of a KV cache that the old weights
wrote (which is what the engine keeps). A version stamp off by one token moves the boundary and
fails the comparison, because the two weight sets give very different log-probs.
"""

from __future__ import annotations

import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipelinerl.workers.engines.transformers_engine import TransformersEngine
from tests.conftest import build_random_model_dir

EOS = 2


def load(path):
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def make_engine(model, max_in_flight=6, max_new_tokens=48):
    return TransformersEngine(
        model,
        eos_token_id=EOS,
        max_in_flight=max_in_flight,
        max_new_tokens=max_new_tokens,
        max_prompt_tokens=8,
        seed=0,
    )


def token_logprobs(model, ids: list[int], past=None):
    out = model(input_ids=torch.tensor([ids]), past_key_values=past, use_cache=True)
    return torch.log_softmax(out.logits[0].float(), dim=-1), out.past_key_values


def recompute(old, new, prompt: list[int], tokens: list[int], switch: int) -> list[float]:
    """Behaviour log-probs if tokens [0, switch) came from ``old`` and [switch, n) from ``new``
    over the cache ``old`` wrote. The input that produces token j is token j-1 (or the prompt)."""
    with torch.no_grad():
        sequence = prompt + tokens
        prefix_len = len(prompt) + max(switch - 1, 0)  # inputs fed before the pause
        logprobs_old, cache = token_logprobs(old, sequence[:prefix_len])
        after_switch = sequence[prefix_len : len(prompt) + len(tokens) - 1]
        # A sequence that finished before the update has no input after the switch.
        logprobs_new = token_logprobs(new, after_switch, past=cache)[0] if after_switch else None
    result = []
    for j, token in enumerate(tokens):
        position = len(prompt) + j - 1  # input position whose logits give token j
        if j < switch:
            result.append(float(logprobs_old[position, token]))
        else:
            assert logprobs_new is not None
            result.append(float(logprobs_new[position - prefix_len, token]))
    return result


def test_in_flight_update_keeps_sequences_and_stamps_exact_versions(random_model_dir, tmp_path):
    model = load(random_model_dir)
    old = load(random_model_dir)
    new = load(build_random_model_dir(tmp_path / "other", seed=1))
    engine = make_engine(model)
    prompts = {f"r{i}": [1, 20 + i, 30, 40 + i] for i in range(6)}

    class NotYet(Exception):
        pass

    try:
        for request_id, prompt in prompts.items():
            engine.submit(request_id, prompt)

        def load_new(target):
            # Only in a pause where sequences are being written with tokens already (arranged, not
            # timed): otherwise the pause ends unloaded and the next one is tried.
            if sum(count >= 2 for count in engine.tokens_in_flight().values()) < 2:
                raise NotYet
            for (_, param), (_, source) in zip(
                target.named_parameters(), new.named_parameters(), strict=True
            ):
                param.copy_(source)

        deadline = time.monotonic() + 60
        while True:
            try:
                pause_s = engine.update_weights(1, load_new)
                break
            except NotYet:
                assert time.monotonic() < deadline, "no pause found two sequences in flight with tokens"
                assert engine.policy_version == 0, "a pause that loaded nothing changes no version"
                time.sleep(0.002)
        done = []
        deadline = time.monotonic() + 60
        while len(done) < len(prompts) and time.monotonic() < deadline:
            done += engine.poll(0.5)
    finally:
        engine.close()

    assert sorted(seq.request_id for seq in done) == sorted(prompts), "every in-flight sequence completes"
    assert pause_s > 0
    switched = 0
    for seq in done:
        versions = seq.token_versions
        assert len(versions) == len(seq.completion_token_ids) == len(seq.behaviour_logprobs)
        assert versions == sorted(versions) and set(versions) <= {0, 1}
        switch = versions.index(1) if 1 in versions else len(versions)
        switched += 0 < switch < len(versions)
        expected = recompute(old, new, seq.prompt_token_ids, seq.completion_token_ids, switch)
        assert seq.behaviour_logprobs == pytest.approx(expected, abs=1e-4), seq.request_id
    assert switched >= 2, f"the sequences in flight at the update were written by both versions ({switched})"


def test_continuous_batching_refills_slots(random_model_dir):
    """More requests than slots: all finish, each with one log-prob per token and version 0."""
    engine = make_engine(load(random_model_dir), max_in_flight=3, max_new_tokens=16)
    try:
        for i in range(10):
            engine.submit(f"r{i}", [1, 20 + i])
        done = []
        deadline = time.monotonic() + 60
        while len(done) < 10 and time.monotonic() < deadline:
            done += engine.poll(0.5)
    finally:
        engine.close()
    assert len(done) == 10
    for seq in done:
        assert 1 <= len(seq.completion_token_ids) <= 16
        assert seq.token_versions == [0] * len(seq.completion_token_ids)
        assert all(lp <= 0 for lp in seq.behaviour_logprobs)
        assert seq.finished == (seq.completion_token_ids[-1] == EOS)
