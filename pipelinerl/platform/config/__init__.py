"""Experiment configuration: typed, validated, loaded from TOML with ``--set`` overrides.

Every field carries a type, a constraint and a description: the same models are what the CLI
validates and what the Prefect run form renders. A bad value fails here, before any process
starts, with a message naming the field, the value and what is allowed.

The configuration is a tree of sections (``run``, ``model``, ``task``, ``actor``, ``rl``,
``trainer``, ``transport``, ``tracking``, ``cluster``); an override names a leaf as ``section.key=value``.

The sections live in ``base`` (the section model and the error), ``experiment`` (what a run does),
``recipe`` (how the trainer learns: the ``rl`` section) and ``infrastructure`` (where its stages run
and how they meet); this module assembles them into
``PipelineConfig`` and loads it.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from pipelinerl.platform.config.base import MODES, ConfigError, Mode, Section, multiple_of_field, schema_at
from pipelinerl.platform.config.experiment import (
    ActorConfig,
    EvalConfig,
    ModelConfig,
    RunConfig,
    TaskConfig,
    TrainerConfig,
)
from pipelinerl.platform.config.infrastructure import (
    PORTS,
    ROLES,
    ClusterConfig,
    Role,
    TrackingConfig,
    TransportConfig,
)
from pipelinerl.platform.config.recipe import KLConfig, OverlongConfig, RLConfig

__all__ = [
    "MODES",
    "PORTS",
    "ROLES",
    "ActorConfig",
    "ClusterConfig",
    "ConfigError",
    "EvalConfig",
    "KLConfig",
    "Mode",
    "ModelConfig",
    "OverlongConfig",
    "PipelineConfig",
    "RLConfig",
    "Role",
    "RunConfig",
    "Section",
    "TaskConfig",
    "TrackingConfig",
    "TrainerConfig",
    "TransportConfig",
    "apply_overrides",
    "flatten",
    "format_validation_error",
    "load_config",
    "parse_override",
    "with_overrides",
]


# What cluster.colocate (one GPU for trainer rank 0 and one vLLM actor) needs: each setting's allowed values.
COLOCATE_RULES: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("actor.num_actors", (1,)),
    ("actor.engine", ("vllm",)),
    ("actor.tensor_parallel_size", (1,)),
    ("trainer.num_processes", (1,)),
    ("trainer.device", ("auto", "cuda")),
    ("cluster.placement", ("local",)),
    ("transport.weight_backend", ("auto", "ipc", "gloo")),
)
# Colocated, the most of the GPU vLLM may take (actor.gpu_memory_utilization): the rest is the trainer's.
COLOCATED_GPU_SHARE = 0.6


class PipelineConfig(Section):
    # The cross-section rules, in JSON Schema too, so that Prefect's run form refuses a violation at
    # submission naming the field (_cross_checks enforces them all; two it cannot say in JSON Schema,
    # actors per node x tensor-parallel size within a node's GPUs and rl.overlong.buffer below
    # actor.max_new_tokens, are refused when the flow starts).
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": schema_at("eval.greedy", {"const": True}),
                    "then": schema_at("actor.engine", {"const": "vllm"}),
                },
                {
                    "if": schema_at("transport.weight_backend", {"const": "nccl"}),
                    "then": {
                        "allOf": [
                            schema_at("actor.engine", {"const": "vllm"}),
                            schema_at("trainer.device", {"enum": ["auto", "cuda"]}),
                        ]
                    },
                },
                {
                    "if": schema_at("transport.weight_backend", {"const": "ipc"}),
                    "then": schema_at("cluster.colocate", {"const": True}),
                },
                {
                    "if": schema_at("cluster.colocate", {"const": True}),
                    "then": {
                        "allOf": [schema_at(path, {"enum": list(values)}) for path, values in COLOCATE_RULES]
                    },
                },
                {
                    "if": {
                        "allOf": [
                            schema_at("cluster.colocate", {"const": True}),
                            schema_at("actor.kv_cache_gib", {"type": "null"}),
                        ]
                    },
                    "then": schema_at("actor.gpu_memory_utilization", {"maximum": COLOCATED_GPU_SHARE}),
                },
                *multiple_of_field("rl.batch_size", "trainer.num_processes", 64),
                *multiple_of_field("trainer.num_processes", "cluster.trainer_nodes", 64),
                *multiple_of_field("actor.num_actors", "cluster.actor_nodes", 64),
                *multiple_of_field(
                    "cluster.actor_gpus_per_node",
                    "actor.tensor_parallel_size",
                    16,
                    when=(
                        schema_at("cluster.placement", {"const": "pools"}),
                        schema_at("actor.engine", {"const": "vllm"}),
                        schema_at("cluster.actor_gpus_per_node", {"minimum": 1}),
                    ),
                ),
            ]
        }
    )

    run: RunConfig = Field(default_factory=RunConfig, description="What to run and for how long.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="The policy model.")
    task: TaskConfig = Field(default_factory=TaskConfig, description="The task and its splits.")
    actor: ActorConfig = Field(default_factory=ActorConfig, description="Generation.")
    rl: RLConfig = Field(default_factory=RLConfig, description="Rewards, advantages and the loss.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="Held-out evaluation during the run.")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="DeepSpeed training.")
    transport: TransportConfig = Field(default_factory=TransportConfig, description="ZeroMQ sockets.")
    tracking: TrackingConfig = Field(default_factory=TrackingConfig, description="MLflow and the database.")
    cluster: ClusterConfig = Field(default_factory=ClusterConfig, description="Where the stages run.")

    @model_validator(mode="after")
    def _cross_checks(self) -> PipelineConfig:
        if self.actor.kv_cache_on_update != "keep" and self.actor.engine != "vllm":
            raise ValueError(
                f"actor.kv_cache_on_update={self.actor.kv_cache_on_update!r} needs actor.engine='vllm' "
                "(the transformers engine always keeps the cache)"
            )
        if self.transport.weight_backend == "nccl" and (
            self.actor.engine != "vllm" or self.trainer.device == "cpu"
        ):
            raise ValueError(
                "transport.weight_backend='nccl' needs vLLM actors and a trainer on GPUs (actor.engine="
                f"{self.actor.engine!r}, trainer.device={self.trainer.device!r}); use 'gloo' or 'auto'"
            )
        if self.transport.weight_backend == "ipc" and not self.cluster.colocate:
            raise ValueError(
                "transport.weight_backend='ipc' hands CUDA memory to a process on the same GPU: it needs "
                "cluster.colocate=true"
            )
        if self.cluster.colocate:
            for path, values in COLOCATE_RULES:
                if (value := self.value_at(path)) not in values:
                    raise ValueError(
                        f"cluster.colocate=true shares one GPU between one trainer rank and one vLLM actor: "
                        f"{path}={value!r} must be {' or '.join(map(repr, values))}"
                    )
            share = self.actor.gpu_memory_utilization
            if self.actor.kv_cache_gib is None and share > COLOCATED_GPU_SHARE:
                raise ValueError(
                    f"cluster.colocate=true: actor.gpu_memory_utilization={share} would leave the trainer "
                    f"{1 - share:.0%} of the shared GPU; set it at most {COLOCATED_GPU_SHARE} (e.g. 0.3), or "
                    "size the cache with actor.kv_cache_gib"
                )
        if self.run.mode != "conventional" and self.actor.max_in_flight < self.rl.group_size:
            # Conventional rounds admit a group beyond H (max(H, G) in flight, workers/admission.py);
            # the continuous modes admit whole groups up to H, so a larger group would never start.
            raise ValueError(
                f"actor.max_in_flight={self.actor.max_in_flight} cannot hold one group of "
                f"rl.group_size={self.rl.group_size} samples: run.mode={self.run.mode!r} admits whole "
                "groups up to H and would never start one; raise actor.max_in_flight or lower rl.group_size"
            )
        if self.trainer.num_processes > 1 and self.rl.batch_size % self.trainer.num_processes:
            raise ValueError(
                f"rl.batch_size={self.rl.batch_size} must divide evenly over "
                f"trainer.num_processes={self.trainer.num_processes}"
            )
        if self.trainer.num_processes % self.cluster.trainer_nodes:
            raise ValueError(
                f"trainer.num_processes={self.trainer.num_processes} must divide evenly over "
                f"cluster.trainer_nodes={self.cluster.trainer_nodes}"
            )
        if self.actor.num_actors % self.cluster.actor_nodes:
            raise ValueError(
                f"actor.num_actors={self.actor.num_actors} must divide evenly over "
                f"cluster.actor_nodes={self.cluster.actor_nodes}"
            )
        for role in ("trainer", "actor"):
            queues = getattr(self.cluster, f"{role}_work_queues")
            nodes = self.cluster.nodes(role)
            if queues and len(queues) != nodes:
                raise ValueError(
                    f"cluster.{role}_work_queues={queues} names {len(queues)} queue(s) for "
                    f"cluster.{role}_nodes={nodes} nodes: give one per node, or none (the pool's default "
                    "queue)"
                )
        if self.eval.greedy and self.actor.engine != "vllm":
            raise ValueError(
                "eval.greedy=true needs actor.engine='vllm': the transformers engine samples every request "
                "of its batch at actor.temperature (leave eval.greedy off to evaluate at that temperature)"
            )
        if self.eval.sets and not self.eval.every:
            raise ValueError(
                f"eval.sets ({', '.join(self.eval.sets)}) are evaluated during the run: set eval.every too"
            )
        gpus, tp = self.cluster.actor_gpus_per_node, self.actor.tensor_parallel_size
        if gpus and self.actor.engine == "vllm" and self.cluster.placement == "pools":
            if gpus % tp:
                raise ValueError(
                    f"actor.tensor_parallel_size={tp} must divide cluster.actor_gpus_per_node={gpus}: "
                    "each actor takes that many GPUs of its node"
                )
            per_node = self.actor.num_actors // self.cluster.actor_nodes
            if per_node * tp > gpus:
                raise ValueError(
                    f"{per_node} actor(s) per node (actor.num_actors={self.actor.num_actors} over "
                    f"cluster.actor_nodes={self.cluster.actor_nodes}) x actor.tensor_parallel_size={tp} need "
                    f"{per_node * tp} GPUs per node; cluster.actor_gpus_per_node={gpus}"
                )
        if self.actor.tensor_parallel_size > 1 and self.actor.engine != "vllm":
            raise ValueError(
                f"actor.tensor_parallel_size={self.actor.tensor_parallel_size} needs actor.engine='vllm' "
                "(the transformers engine runs on one device)"
            )
        overlong = self.rl.overlong
        if overlong.enabled and overlong.buffer >= self.actor.max_new_tokens:
            # Not in the JSON Schema (it compares two fields, neither bounded): refused when the flow starts.
            raise ValueError(
                f"rl.overlong.buffer={overlong.buffer} must be below actor.max_new_tokens="
                f"{self.actor.max_new_tokens}: the penalty grows over the last rl.overlong.buffer tokens "
                "before actor.max_new_tokens, so every completion would be punished; lower the buffer or "
                "raise actor.max_new_tokens"
            )
        return self

    def mode_label(self) -> str:
        """What the run is, as comparisons and MLflow's child runs name it: ``pipeline``, ``async-lag2``,
        ``conventional-G8`` or, with strict rounds (generation, then training), ``conventional-G8-strict``."""
        if self.run.mode == "async":
            return f"async-lag{self.run.async_drain_lag}"
        if self.run.mode != "conventional":
            return self.run.mode
        label = f"conventional-G{self.run.steps_per_round}"
        return label if self.run.train_during_round else f"{label}-strict"

    def value_at(self, path: str) -> Any:
        """The setting at dotted ``path`` (``"actor.num_actors"``, ``"rl.kl.coef"``)."""
        value: Any = self
        for name in path.split("."):
            value = getattr(value, name)
        return value

    def weight_group_size(self) -> int:
        """Members of the weight group: trainer rank 0, then every actor's engine workers."""
        return 1 + self.actor.num_actors * self.workers_per_actor()

    def actor_first_weight_rank(self, actor_id: int) -> int:
        """The weight-group rank of actor ``actor_id``'s first worker (its others follow)."""
        return 1 + actor_id * self.workers_per_actor()

    def workers_per_actor(self) -> int:
        return self.actor.tensor_parallel_size if self.actor.engine == "vllm" else 1


def parse_override(text: str) -> tuple[list[str], Any]:
    """Split ``section.key=value``; the value is read as a TOML value, else taken as a string."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not of the form section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.strip().split("."), value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {text!r}: {part!r} is a value, not a section")
            node = child
        node[path[-1]] = value
    return data


def format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "config"
        message = item["msg"].removeprefix("Value error, ")
        if item["type"] == "extra_forbidden":
            lines.append(f"{where}: unknown setting (check its spelling and section)")
        elif item["type"] == "value_error":
            lines.append(f"{where}: {message}")
        else:
            lines.append(f"{where}: {message} (got {item.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_config(path: Path | None = None, overrides: list[str] | None = None) -> PipelineConfig:
    """Read a TOML file (optional), apply ``section.key=value`` overrides, validate."""
    data: dict[str, Any] = {}
    if path is not None:
        if not path.is_file():
            raise ConfigError(f"config file {str(path)!r} does not exist")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {str(path)!r} is not valid TOML: {exc}") from exc
    apply_overrides(data, overrides or [])
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None


def flatten(config: BaseModel, prefix: str = "") -> dict[str, Any]:
    """``{"run.mode": "pipeline", ...}``: for logs, tracking params and overrides."""
    flat: dict[str, Any] = {}
    for name in type(config).model_fields:
        value = getattr(config, name)
        key = f"{prefix}{name}"
        if isinstance(value, BaseModel):
            flat.update(flatten(value, key + "."))
        else:
            flat[key] = str(value) if isinstance(value, Path) else value
    return flat


def with_overrides(config: PipelineConfig, values: dict[str, Any]) -> PipelineConfig:
    """``config`` with ``{"section.key": value}`` applied and validated again (sweeps, comparisons)."""
    data = config.model_dump(mode="json")
    for key, value in values.items():
        section, *inner, leaf = key.split(".") if "." in key else ("", key)
        node = data.get(section)
        if not isinstance(node, dict):
            raise ConfigError(f"override {key!r} does not name a setting as section.key")
        for part in inner:  # into a mapping setting, e.g. task.options.generator
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {part!r} is a value, not a mapping")
        node[leaf] = value
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc)) from None
