"""Policy losses: hand-computed values, analytic gradients, masking and micro-batch additivity."""

import math

import pytest
import torch

from pipelinerl.rl.loss import ppo_clip_loss, truncated_is_loss


def _truncated_is_example() -> dict[str, torch.Tensor]:
    # ratios pi/mu = [1, 10, 0.5, 1]; the last token is masked out.
    return {
        "logprobs": torch.tensor([0.5, 0.5, 0.1, 0.3], dtype=torch.float64).log().requires_grad_(),
        "behaviour_logprobs": torch.tensor([0.5, 0.05, 0.2, 0.3], dtype=torch.float64).log(),
        "advantages": torch.tensor([2.0, 1.0, -1.0, 7.0], dtype=torch.float64),
        "token_mask": torch.tensor([True, True, True, False]),
    }


def test_truncated_is_hand_example_value_weights_and_clipped_fraction() -> None:
    inputs = _truncated_is_example()
    output = truncated_is_loss(**inputs, num_sequences=2, is_cap=5.0)

    # weights [1, min(10, 5), 0.5] on the masked-in tokens
    expected = -(2 * 1 * math.log(0.5) + 1 * 5 * math.log(0.5) + (-1) * 0.5 * math.log(0.1)) / 2
    assert output.loss.item() == pytest.approx(expected, rel=1e-12)
    assert output.ratio.tolist() == pytest.approx([1.0, 10.0, 0.5, 0.0], rel=1e-12)
    assert output.importance_weights.tolist() == pytest.approx([1.0, 5.0, 0.5, 0.0], rel=1e-12)
    assert output.clipped_fraction == pytest.approx(1 / 3)
    assert not output.ratio.requires_grad
    assert not output.importance_weights.requires_grad


def test_truncated_is_gradient_is_minus_advantage_times_weight_over_num_sequences() -> None:
    inputs = _truncated_is_example()
    truncated_is_loss(**inputs, num_sequences=2, is_cap=5.0).loss.backward()
    assert inputs["logprobs"].grad is not None
    assert inputs["logprobs"].grad.tolist() == pytest.approx([-1.0, -2.5, 0.25, 0.0], rel=1e-12)


def test_truncated_is_gradient_matches_analytic_on_random_batch() -> None:
    torch.manual_seed(0)
    logprobs = (-torch.rand(3, 7, dtype=torch.float64) * 3).requires_grad_()
    behaviour_logprobs = logprobs.detach() + 0.8 * torch.randn(3, 7, dtype=torch.float64)
    advantages = torch.randn(3, 1, dtype=torch.float64).expand(3, 7).contiguous()
    token_mask = torch.rand(3, 7) > 0.3
    output = truncated_is_loss(
        logprobs, behaviour_logprobs, advantages, token_mask, num_sequences=5, is_cap=2.0
    )
    output.loss.backward()

    ratio = torch.exp(logprobs.detach() - behaviour_logprobs)
    assert (ratio > 2.0)[token_mask].any(), "the example must exercise the cap"
    weights = ratio.clamp(max=2.0)
    expected_grad = torch.where(token_mask, -advantages * weights / 5, torch.zeros_like(weights))
    assert logprobs.grad is not None
    torch.testing.assert_close(logprobs.grad, expected_grad)


def test_on_policy_weights_are_one_and_loss_is_plain_reinforce() -> None:
    logprobs = torch.tensor([[-0.2, -1.5], [-0.7, -3.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, 1.0], [-0.5, -0.5]], dtype=torch.float64)
    token_mask = torch.ones(2, 2, dtype=torch.bool)
    output = truncated_is_loss(logprobs, logprobs.clone(), advantages, token_mask, num_sequences=2)
    assert output.importance_weights.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert output.clipped_fraction == 0.0
    assert output.loss.item() == pytest.approx(-(-0.2 - 1.5 + 0.5 * 0.7 + 0.5 * 3.0) / 2)


@pytest.mark.parametrize("loss_fn", [truncated_is_loss, ppo_clip_loss])
def test_micro_batch_losses_and_gradients_sum_to_the_step(loss_fn) -> None:
    torch.manual_seed(1)
    logprobs = (-torch.rand(4, 6, dtype=torch.float64) * 2).requires_grad_()
    behaviour_logprobs = logprobs.detach() + 0.3 * torch.randn(4, 6, dtype=torch.float64)
    advantages = torch.randn(4, 1, dtype=torch.float64).expand(4, 6).contiguous()
    token_mask = torch.rand(4, 6) > 0.2

    step_loss = loss_fn(logprobs, behaviour_logprobs, advantages, token_mask, num_sequences=4).loss
    (step_grad,) = torch.autograd.grad(step_loss, logprobs)
    micro_losses = [
        loss_fn(
            logprobs[rows], behaviour_logprobs[rows], advantages[rows], token_mask[rows], num_sequences=4
        ).loss
        for rows in (slice(0, 1), slice(1, 4))
    ]
    (micro_grad,) = torch.autograd.grad(sum(micro_losses), logprobs)
    assert sum(loss.item() for loss in micro_losses) == pytest.approx(step_loss.item(), rel=1e-12)
    torch.testing.assert_close(micro_grad, step_grad)


@pytest.mark.parametrize("loss_fn", [truncated_is_loss, ppo_clip_loss])
def test_garbage_in_masked_positions_does_not_leak(loss_fn) -> None:
    logprobs = torch.tensor([-0.5, 80.0, -1.0], dtype=torch.float64, requires_grad=True)
    behaviour_logprobs = torch.tensor([-0.5, -200.0, -1.0], dtype=torch.float64)
    advantages = torch.tensor([1.0, float("nan"), 2.0], dtype=torch.float64)
    token_mask = torch.tensor([True, False, True])
    output = loss_fn(logprobs, behaviour_logprobs, advantages, token_mask, num_sequences=1)
    output.loss.backward()
    assert logprobs.grad is not None
    assert torch.isfinite(logprobs.grad).all()
    assert logprobs.grad[1].item() == 0.0
    assert output.ratio[1].item() == 0.0
    assert output.importance_weights[1].item() == 0.0
    assert math.isfinite(output.loss.item())


def test_all_tokens_masked_out_gives_zero_loss_and_zero_fraction() -> None:
    logprobs = torch.zeros(2, 3, requires_grad=True)
    output = truncated_is_loss(
        logprobs, torch.zeros(2, 3), torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool), 2
    )
    output.loss.backward()
    assert output.loss.item() == 0.0
    assert output.clipped_fraction == 0.0
    assert logprobs.grad is not None
    assert logprobs.grad.abs().sum().item() == 0.0


def _ppo_example() -> dict[str, torch.Tensor]:
    logprobs = torch.tensor([-0.4, -1.2, -0.9, -2.0], dtype=torch.float64)
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.7], dtype=torch.float64)
    return {
        "logprobs": logprobs.clone().requires_grad_(),
        "behaviour_logprobs": logprobs - ratios.log(),
        "advantages": torch.tensor([1.0, 1.0, -1.0, -1.0], dtype=torch.float64),
        "token_mask": torch.ones(4, dtype=torch.bool),
    }


def test_ppo_clip_hand_example() -> None:
    inputs = _ppo_example()
    output = ppo_clip_loss(**inputs, num_sequences=2, clip_epsilon=0.2)

    # per token min(rA, clip(r)A):
    # min(1.5, 1.2)=1.2, min(0.5, 0.8)=0.5, min(-1.1, -1.1)=-1.1, min(-0.7, -0.8)=-0.8
    assert output.loss.item() == pytest.approx(-(1.2 + 0.5 - 1.1 - 0.8) / 2, rel=1e-12)
    assert output.clipped_fraction == pytest.approx(0.5)
    assert output.ratio.tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7], rel=1e-12)
    assert output.importance_weights.tolist() == pytest.approx([1.5, 0.5, 1.1, 0.7], rel=1e-12)

    output.loss.backward()
    # clipped tokens get no gradient; for the others d(rA)/dlogprob = rA
    assert inputs["logprobs"].grad is not None
    assert inputs["logprobs"].grad.tolist() == pytest.approx([0.0, -0.25, 0.55, 0.0], rel=1e-12)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"advantages": torch.zeros(3)}, "advantages has shape"),
        ({"behaviour_logprobs": torch.zeros(2, 2)}, "behaviour_logprobs has shape"),
        ({"token_mask": torch.ones(4)}, "bool"),
        ({"num_sequences": 0}, r"num_sequences must be >= 1 .*, got 0"),
        ({"is_cap": 0.0}, "is_cap must be > 0, got 0.0"),
    ],
)
def test_truncated_is_rejects_bad_inputs(overrides: dict, message: str) -> None:
    arguments: dict = {
        "logprobs": torch.zeros(4),
        "behaviour_logprobs": torch.zeros(4),
        "advantages": torch.zeros(4),
        "token_mask": torch.ones(4, dtype=torch.bool),
        "num_sequences": 1,
    }
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        truncated_is_loss(**arguments)


def test_ppo_rejects_non_positive_epsilon() -> None:
    with pytest.raises(ValueError, match="clip_epsilon must be > 0, got -0.1"):
        ppo_clip_loss(**_ppo_example(), num_sequences=1, clip_epsilon=-0.1)
