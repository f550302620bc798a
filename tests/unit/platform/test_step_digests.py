"""Step digests (``platform/step_digests.py``): equal weights give equal digests, the first tensor that
differs is named, and a damaged file is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from pipelinerl.platform.step_digests import (
    StepDigests,
    StepDigestsError,
    first_difference,
    parameter_digests,
    read_step_digests,
    step_digests_path,
    write_step_digests,
)


def weights() -> list[tuple[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(5, 3, generator=generator)),
        ("layer.weight", torch.randn(3, 3, generator=generator)),
        ("layer.bias", torch.randn(3, generator=generator).to(torch.bfloat16)),
    ]


def test_the_same_weights_give_the_same_digests_and_one_bit_changes_them() -> None:
    named = weights()
    recorded = StepDigests(3, parameter_digests(named))
    assert list(recorded.tensors) == ["embed.weight", "layer.weight", "layer.bias"]
    assert first_difference(recorded, StepDigests(3, parameter_digests(weights()))) is None
    changed = weights()
    bits = changed[1][1].view(torch.int32)
    bits[2, 1] ^= 1  # the lowest bit of one float32
    replayed = StepDigests(3, parameter_digests(changed))
    assert replayed.weights != recorded.weights
    assert "'layer.weight' differs" in (first_difference(recorded, replayed) or "")
    # A transposed view hashes its row-major elements: the same values laid out otherwise differ.
    transposed = [(name, tensor.t() if tensor.dim() == 2 else tensor) for name, tensor in weights()]
    assert "'embed.weight' differs" in (
        first_difference(recorded, StepDigests(3, parameter_digests(transposed))) or ""
    )


def test_a_missing_or_extra_tensor_is_named() -> None:
    recorded = StepDigests(1, parameter_digests(weights()))
    fewer = StepDigests(1, parameter_digests(weights()[:2]))
    assert "'layer.bias' is missing" in (first_difference(recorded, fewer) or "")
    assert "layer.bias" in (first_difference(fewer, recorded) or "")


def test_a_step_file_reads_back_and_a_damaged_one_is_refused(tmp_path: Path) -> None:
    path = step_digests_path(tmp_path, 7)
    assert path.name == "step_000007.json"
    recorded = StepDigests(7, parameter_digests(weights()))
    write_step_digests(path, recorded)
    assert read_step_digests(path) == recorded
    record = json.loads(path.read_text())
    record["tensors"]["layer.bias"] = "0" * 64  # a tensor's digest edited, the whole one not
    path.write_text(json.dumps(record))
    with pytest.raises(StepDigestsError, match="damaged"):
        read_step_digests(path)
    path.write_text("{")
    with pytest.raises(StepDigestsError, match="not a step's weight digests"):
        read_step_digests(path)
    with pytest.raises(StepDigestsError, match="does not exist"):
        read_step_digests(tmp_path / "nothing.json")
