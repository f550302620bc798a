"""``model.lm_head_fp32``: a bf16 model's head computes float32 logits; float32 models are untouched.

On this CPU machine every engine loads float32 weights, so these tests build the bf16 model by hand:
they check the code path, not a measured gain in ``rl/behaviour_mismatch`` (that needs a GPU run).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModelForCausalLM

from pipelinerl.workers.engines.lm_head import float32_lm_head


@pytest.fixture
def bf16_model(random_model_dir):
    return AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.bfloat16).eval()


def test_a_bf16_model_gets_float32_logits_from_its_own_bf16_weights(bf16_model):
    input_ids = torch.tensor([[1, 5, 9, 12, 3]])
    with torch.no_grad():
        hidden = bf16_model.model(input_ids=input_ids).last_hidden_state
        assert bf16_model(input_ids=input_ids).logits.dtype == torch.bfloat16
        assert float32_lm_head(bf16_model) is True
        logits = bf16_model(input_ids=input_ids).logits
    assert logits.dtype == torch.float32
    head = bf16_model.get_output_embeddings()
    assert head.weight.dtype == torch.bfloat16, "the weights keep their precision"
    assert head.weight is bf16_model.get_input_embeddings().weight, "a tied head stays tied"
    assert torch.equal(logits, F.linear(hidden.float(), head.weight.float()))


def test_gradients_reach_the_bf16_weights(bf16_model):
    float32_lm_head(bf16_model)
    bf16_model.train()
    logits = bf16_model(input_ids=torch.tensor([[1, 5, 9]])).logits
    torch.log_softmax(logits, dim=-1)[0, -1, 4].backward()
    grad = bf16_model.get_output_embeddings().weight.grad
    assert grad is not None and grad.dtype == torch.bfloat16 and grad.abs().sum() > 0


def test_a_float32_model_is_left_alone(random_model_dir):
    model = AutoModelForCausalLM.from_pretrained(random_model_dir, dtype=torch.float32)
    assert float32_lm_head(model) is False
    assert "forward" not in vars(model.get_output_embeddings())


def test_a_model_without_a_linear_head_is_refused():
    class NoHead(nn.Module):
        def get_output_embeddings(self):
            return None

    with pytest.raises(ValueError, match="output embeddings are an nn.Linear, got NoneType from NoHead"):
        float32_lm_head(NoHead())
