"""The run form refuses cross-field mistakes before submission: the rules PipelineConfig's validators
enforce are also in the parameter schema, where Prefect's validation (what its form calls on submit,
``/ui/schemas/validate``) finds them and names the field to change."""

from __future__ import annotations

from typing import Any

import pytest
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools.validation import validate
from pydantic import ValidationError

from pipelinerl.flows.compare import compare
from pipelinerl.flows.rl_run import rl_run
from pipelinerl.flows.sweep import sweep
from pipelinerl.platform.config import PipelineConfig


def config_with(**sections: dict[str, Any]) -> dict[str, Any]:
    data = PipelineConfig().model_dump(mode="json")
    for section, values in sections.items():
        data[section].update(values)
    return data


MISTAKES = [
    ({"eval": {"greedy": True}}, "$.config.actor.engine"),
    ({"actor": {"tensor_parallel_size": 2}}, "$.config.actor.engine"),
    ({"actor": {"kv_cache_on_update": "recompute"}}, "$.config.actor.engine"),
    ({"eval": {"sets": {"long": {"params": {"n": 5}}}, "every": 0}}, "$.config.eval.every"),
    # divisibility between two fields: JSON Schema's multipleOf takes a constant, so one rule per divisor
    ({"rl": {"batch_size": 30, "group_size": 4}}, "$.config.rl.batch_size"),
    ({"rl": {"batch_size": 32, "group_size": 4}, "trainer": {"num_processes": 3}}, "$.config.rl.batch_size"),
    (
        {"rl": {"batch_size": 48}, "trainer": {"num_processes": 3}, "cluster": {"trainer_nodes": 2}},
        "$.config.trainer.num_processes",
    ),
    ({"actor": {"num_actors": 3}, "cluster": {"actor_nodes": 2}}, "$.config.actor.num_actors"),
    ({"trainer": {"offload_optimizer": True, "zero_stage": 0}}, "$.config.trainer.zero_stage"),
    ({"transport": {"weight_backend": "nccl"}}, "$.config.actor.engine"),
    ({"transport": {"weight_backend": "ipc"}}, "$.config.cluster.colocate"),
    ({"cluster": {"colocate": True}, "actor": {"gpu_memory_utilization": 0.3}}, "$.config.actor.engine"),
    (
        {
            "cluster": {"colocate": True},
            "actor": {"engine": "vllm", "num_actors": 2, "gpu_memory_utilization": 0.3},
        },
        "$.config.actor.num_actors",
    ),
    ({"cluster": {"colocate": True}, "actor": {"engine": "vllm"}}, "$.config.actor.gpu_memory_utilization"),
    (
        {"transport": {"weight_backend": "nccl"}, "actor": {"engine": "vllm"}, "trainer": {"device": "cpu"}},
        "$.config.trainer.device",
    ),
    (
        {
            "actor": {"engine": "vllm", "tensor_parallel_size": 2},
            "cluster": {"placement": "pools", "actor_gpus_per_node": 3},
        },
        "$.config.cluster.actor_gpus_per_node",
    ),
]


@pytest.mark.parametrize("flow", [rl_run, compare, sweep], ids=["rl-run", "compare", "sweep"])
@pytest.mark.parametrize(("change", "path"), MISTAKES)
def test_a_cross_field_mistake_is_refused_by_the_form_naming_the_field(flow, change, path) -> None:
    data = config_with(**change)
    with pytest.raises(ValidationError):
        PipelineConfig.model_validate(data)  # the same rule, as the run checks it
    errors = validate({"config": data}, parameter_schema(flow).model_dump())
    assert [error.json_path for error in errors] == [path], [error.message for error in errors]


@pytest.mark.parametrize(
    "change",
    [
        {"eval": {"greedy": True}, "actor": {"engine": "vllm"}},
        {"actor": {"engine": "vllm", "tensor_parallel_size": 2, "kv_cache_on_update": "recompute"}},
        {"eval": {"sets": {"long": {}}, "every": 5}},
        {"eval": {"greedy": False}},
        {
            "rl": {"batch_size": 48, "group_size": 8},
            "trainer": {"num_processes": 6},
            "cluster": {"trainer_nodes": 3},
        },
        {"actor": {"num_actors": 4}, "cluster": {"actor_nodes": 2}},
        {
            "actor": {"engine": "vllm", "tensor_parallel_size": 2, "num_actors": 2},
            "cluster": {"placement": "pools", "actor_gpus_per_node": 4},
        },
        {"actor": {"engine": "vllm", "tensor_parallel_size": 2}, "cluster": {"actor_gpus_per_node": 3}},
    ],
)
def test_the_same_settings_made_consistent_pass_both(change: dict[str, dict[str, Any]]) -> None:
    data = config_with(**change)
    PipelineConfig.model_validate(data)
    assert validate({"config": data}, parameter_schema(rl_run).model_dump()) == []
