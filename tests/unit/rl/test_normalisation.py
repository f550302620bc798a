"""Loss normalisation: each choice's denominator by hand, its effect on a loss, and the refusals."""

import numpy as np
import pytest
import torch

from pipelinerl.rl.loss import truncated_is_loss
from pipelinerl.rl.normalisation import NORMALISATIONS, loss_denominator


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("sequence", 4.0), ("token", 37.0), ("constant", 4.0 * 512)],
)
def test_each_choice_by_hand(kind, expected) -> None:
    value = loss_denominator(kind, num_sequences=4, num_tokens=37, max_new_tokens=512)
    assert value == expected
    assert isinstance(value, float)


def test_the_choices_are_exported_in_order() -> None:
    assert NORMALISATIONS == ("sequence", "token", "constant")


def test_numpy_integers_are_counts() -> None:
    assert loss_denominator("token", np.int64(2), np.int32(9), np.int64(3)) == 9.0


def test_token_normalisation_makes_an_on_policy_loss_the_token_mean() -> None:
    # 2 sequences, 3 + 1 masked-in tokens; on policy the weights are 1, so the loss is -mean_t A_t log pi_t.
    logprobs = torch.tensor([[-0.5, -1.0, -2.0], [-0.3, 9.0, 9.0]], dtype=torch.float64)
    advantages = torch.tensor([[1.0, 1.0, 1.0], [-2.0, -2.0, -2.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    denominator = loss_denominator("token", 2, int(mask.sum()), 3)
    loss = truncated_is_loss(logprobs, logprobs.clone(), advantages, mask, denominator).loss
    assert loss.item() == pytest.approx(-(-0.5 - 1.0 - 2.0 + 0.6) / 4, rel=1e-12)
    constant = loss_denominator("constant", 2, int(mask.sum()), 3)
    loss = truncated_is_loss(logprobs, logprobs.clone(), advantages, mask, constant).loss
    assert loss.item() == pytest.approx(-(-0.5 - 1.0 - 2.0 + 0.6) / 6, rel=1e-12)


def test_constant_does_not_depend_on_the_lengths_sampled() -> None:
    generator = np.random.default_rng(0)
    values = {loss_denominator("constant", 8, int(generator.integers(1, 8 * 256)), 256) for _ in range(50)}
    assert values == {2048.0}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"kind": "tokens"}, r"unknown loss normalisation 'tokens'; valid: sequence, token, constant"),
        ({"num_sequences": 0}, r"num_sequences must be >= 1 \(the step's sequence count\), got 0"),
        ({"num_tokens": -3}, r"num_tokens must be >= 1 \(the step's masked-in token count\), got -3"),
        ({"max_new_tokens": 0}, r"max_new_tokens must be >= 1 \(.*\), got 0"),
        ({"num_tokens": 2.5}, r"num_tokens must be an integer \(.*\), got 2.5"),
        ({"num_sequences": True}, r"num_sequences must be an integer \(.*\), got True"),
    ],
)
def test_rejects_bad_inputs(overrides: dict, message: str) -> None:
    arguments: dict = {"kind": "sequence", "num_sequences": 2, "num_tokens": 10, "max_new_tokens": 8}
    arguments.update(overrides)
    with pytest.raises(ValueError, match=message):
        loss_denominator(**arguments)
