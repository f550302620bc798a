"""An actor checks a weight-update notice against its model before allocating anything."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pipelinerl.platform.weights import saved_tensor_shapes, weight_update_problem


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    save_file(
        {"embed.weight": torch.zeros(10, 4), "head.bias": torch.zeros(10)},
        tmp_path / "model-00001.safetensors",
    )
    save_file({"layer.weight": torch.zeros(4, 4)}, tmp_path / "model-00002.safetensors")
    return tmp_path


def test_the_model_s_tensor_shapes_come_from_every_safetensors_header(
    model_dir: Path, tmp_path: Path
) -> None:
    assert saved_tensor_shapes(model_dir) == {
        "embed.weight": [10, 4],
        "head.bias": [10],
        "layer.weight": [4, 4],
    }
    assert saved_tensor_shapes(tmp_path / "nothing-here") == {}


def test_an_update_of_the_model_s_own_tensors_passes(model_dir: Path) -> None:
    saved = saved_tensor_shapes(model_dir)
    names = ["embed.weight", "layer.weight"]
    assert weight_update_problem(names, [[10, 4], [4, 4]], ["float32"] * 2, saved_shapes=saved) is None


@pytest.mark.parametrize(
    ("names", "shapes", "dtypes", "problem"),
    [
        (
            ["embed.weight"],
            [[10**9, 10**9]],
            ["float32"],
            "comes with shape [1000000000, 1000000000]; the model's is [10, 4]",
        ),
        (["stranger.weight"], [[4]], ["float32"], "'stranger.weight' is not one of the model's 3 tensors"),
        (["embed.weight"], [[10, 4]], ["int64"], "comes as 'int64', not one of"),
    ],
)
def test_an_update_the_model_cannot_take_is_named(
    model_dir: Path, names, shapes, dtypes, problem: str
) -> None:
    saved = saved_tensor_shapes(model_dir)
    found = weight_update_problem(names, shapes, dtypes, saved_shapes=saved)
    assert found is not None and problem in found


def test_without_known_tensors_only_the_dtype_is_checked() -> None:
    assert weight_update_problem(["x"], [[3]], ["bfloat16"], saved_shapes={}) is None
    assert weight_update_problem(["x"], [[3]], ["object"], saved_shapes={}) is not None
