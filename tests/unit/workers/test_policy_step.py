"""The trainer's per-micro-batch math against direct per-sequence computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from pipelinerl.platform.wire import TrainSequence
from pipelinerl.workers.deepspeed_setup import enable_activation_checkpointing
from pipelinerl.workers.engines.protocol import VersionSwitches
from pipelinerl.workers.policy_step import completion_logprobs, micro_batch_loss


def sequence(prompt, completion, advantage=1.0, versions=None):
    n = len(completion)
    return TrainSequence(
        rollout_id=f"r{prompt}{completion}",
        group_id="g",
        prompt_token_ids=np.array(prompt, dtype=np.int32),
        completion_token_ids=np.array(completion, dtype=np.int32),
        behaviour_logprobs=np.full(n, -1.0, dtype=np.float32),
        token_versions=np.array(versions or [0] * n, dtype=np.int32),
        reward=1.0,
        advantage=advantage,
        finished=True,
    )


@pytest.fixture(scope="module")
def model(random_model_dir):
    return AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).eval()


def direct_logprobs(model, seq, temperature):
    ids = torch.tensor([list(seq.prompt_token_ids) + list(seq.completion_token_ids)])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0] / temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    prompt_len = len(seq.prompt_token_ids)
    return [float(logprobs[prompt_len + j - 1, tok]) for j, tok in enumerate(seq.completion_token_ids)]


def test_padded_logprobs_match_per_sequence_forward(model):
    batch = [
        sequence([1, 10, 11], [12, 13, 2]),
        sequence([1, 20], [21, 22, 23, 24, 2]),
        sequence([1, 5, 6, 7], [2]),
    ]
    with torch.no_grad():
        logprobs, mask = completion_logprobs(model, batch, temperature=0.7)
    for row, seq in enumerate(batch):
        got = logprobs[row][mask[row]].tolist()
        assert got == pytest.approx(direct_logprobs(model, seq, 0.7), abs=1e-5)
    assert int(mask.sum()) == 3 + 5 + 1


def test_token_record_positions_versions_and_ratio(model):
    batch = [
        sequence([1, 10], [12, 13, 2], versions=[3, 3, 4]),
        sequence([1, 20, 21], [22, 2], versions=[4, 4]),
    ]
    result = micro_batch_loss(
        model,
        batch,
        num_sequences=2,
        loss_name="truncated_is",
        is_cap=5.0,
        ppo_clip_epsilon=0.2,
        temperature=1.0,
    )
    record = result.tokens
    assert record.token_positions.tolist() == [0, 1, 2, 0, 1]
    assert record.token_versions.tolist() == [3, 3, 4, 4, 4]
    assert record.ratio == pytest.approx(
        np.exp(record.trainer_logprobs - record.behaviour_logprobs), rel=1e-5
    )
    assert result.loss.requires_grad


def test_version_switches_expand_in_order():
    switches = VersionSwitches(submitted_version=2, switches=[(3, 3), (5, 4), (5, 5)])
    assert switches.versions(7) == [2, 2, 2, 3, 3, 5, 5]
    assert VersionSwitches(0, [(0, 1)]).versions(3) == [1, 1, 1]
    assert VersionSwitches(0, [(9, 1)]).versions(3) == [0, 0, 0]


def _loss_on(model, batch, device):
    return micro_batch_loss(
        model,
        batch,
        num_sequences=len(batch),
        loss_name="truncated_is",
        is_cap=5.0,
        ppo_clip_epsilon=0.2,
        temperature=0.7,
        device=device,
    )


def test_an_explicit_cpu_device_changes_nothing(model):
    batch = [sequence([1, 10], [12, 13, 2], advantage=0.5), sequence([1, 20, 21], [22, 2], advantage=-1.0)]
    default = micro_batch_loss(
        model,
        batch,
        num_sequences=2,
        loss_name="truncated_is",
        is_cap=5.0,
        ppo_clip_epsilon=0.2,
        temperature=0.7,
    )
    explicit = _loss_on(model, batch, "cpu")
    assert float(explicit.loss) == pytest.approx(float(default.loss))
    assert np.array_equal(explicit.tokens.ratio, default.tokens.ratio)


@pytest.mark.gpu
def test_the_loss_on_a_gpu_equals_the_loss_on_cpu_and_only_the_record_comes_back(model, random_model_dir):
    batch = [sequence([1, 10], [12, 13, 2], advantage=0.5), sequence([1, 20, 21], [22, 2], advantage=-1.0)]
    on_gpu = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).cuda().eval()
    gpu_result = _loss_on(on_gpu, batch, "cuda")
    cpu_result = _loss_on(model, batch, "cpu")
    assert gpu_result.loss.device.type == "cuda"
    assert float(gpu_result.loss) == pytest.approx(float(cpu_result.loss), rel=1e-4)
    assert gpu_result.tokens.trainer_logprobs == pytest.approx(cpu_result.tokens.trainer_logprobs, abs=1e-4)


def test_activation_checkpointing_gives_the_same_loss_and_gradients(random_model_dir):
    """trainer.activation_checkpointing turns on the model's gradient checkpointing (activations
    recomputed in the backward pass): the step's loss and every gradient are unchanged."""
    batch = [sequence([1, 10], [12, 13, 2], advantage=0.5), sequence([1, 20, 21], [22, 2], advantage=-1.0)]
    results = []
    for checkpointing in (False, True):
        model = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32).train()
        if checkpointing:
            enable_activation_checkpointing(model)  # as the trainer does
        on = getattr(model, "is_activation_checkpointing", None)
        assert (model.is_gradient_checkpointing if on is None else on) == checkpointing
        loss = _loss_on(model, batch, "cpu").loss
        loss.backward()
        results.append((float(loss), {name: p.grad.clone() for name, p in model.named_parameters()}))
    (plain_loss, plain_grads), (checkpointed_loss, checkpointed_grads) = results
    assert checkpointed_loss == pytest.approx(plain_loss, abs=1e-6)
    for name, grad in plain_grads.items():
        assert torch.allclose(checkpointed_grads[name], grad, atol=1e-6), name
