"""The sections that say what a run does: ``run``, ``model``, ``task``, ``actor``, ``trainer``, ``eval``
(``rl``, how the trainer learns, is ``recipe.py``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from pipelinerl.platform.config.base import Mode, Section, requires_when, schema_at
from pipelinerl.platform.config.hub_ids import hub_id_problem, looks_like_hub_id


class RunConfig(Section):
    name: str = Field("pipelinerl", min_length=1, description="Experiment name (the MLflow experiment).")
    mode: Mode = Field(
        "pipeline",
        description="pipeline: in-flight weight updates; conventional: G steps per generation round; "
        "async: weights change only between sequences (ablation).",
    )
    seed: int = Field(0, ge=0, description="Seed for data order, sampling and model initialisation.")
    max_steps: int = Field(
        100,
        ge=1,
        description="Train until the policy reaches this version (optimizer steps; a resumed run counts "
        "the steps of its checkpoint).",
    )
    max_wall_s: float = Field(
        3600.0, gt=0, description="Stop training after this many seconds even if max_steps is not reached."
    )
    steps_per_round: int = Field(
        4, ge=1, le=64, description="conventional mode: optimizer steps G per generation round."
    )
    train_during_round: bool = Field(
        True,
        description="conventional mode: the trainer takes a round's first steps while the actor still "
        "generates the rest of the round (true), or waits until the whole round is generated (false: "
        "generation, then training, as the paper's baseline runs).",
    )
    async_drain_lag: int = Field(
        2,
        ge=1,
        description="async mode: versions the actor may fall behind the newest weights it received before "
        "it drains (admits nothing until its sequences finish) and loads them. Not rl.max_lag, which "
        "drops stale sequences before training.",
    )
    output_dir: Path = Field(
        Path("runs"), description="Each run writes its own directory, named by its run id, under this one."
    )
    home: Path = Field(
        Path("~/.pipelinerl"),
        description="Platform home: warm-start cache, the default MLflow store and platform database.",
    )
    resume_from: Path | None = Field(
        None,
        description="A checkpoint directory (runs/RUN_ID/checkpoints/vVERSION) to continue training from: "
        "the policy, its version and samples trained are restored.",
    )
    first_step_timeout_s: float = Field(
        1800.0,
        ge=0,
        description="End the run with an error naming the stall when the stages have not completed their "
        "first optimizer step this many seconds after they started (loading the model, starting the "
        "engines, the first batch); with run.max_restarts the run restarts instead. 0: never.",
    )
    stall_timeout_s: float = Field(
        900.0,
        ge=0,
        description="End the run with an error naming the stall when no optimizer step completes for this "
        "many seconds after an earlier one (the first step has run.first_step_timeout_s); with "
        "run.max_restarts the run restarts from its latest checkpoint instead. 0: never.",
    )
    max_restarts: int = Field(
        0,
        ge=0,
        le=10,
        description="When a stage crashes, stop every stage and start them all again from the run's "
        "latest checkpoint (or from the start), at most this many times; 0: a crash fails the run.",
    )
    actors_survive_restart: bool = Field(
        True,
        description="When a trainer rank or the preprocessor crashes (run.max_restarts), restart only those: "
        "the actors keep their engines, keep the groups every token of which the checkpoint's lineage "
        "sampled, hand out again the prompts it was not trained on, and take the checkpoint's weights as an "
        "in-flight update. false: every stage restarts. Runs placed on worker pools restart every stage.",
    )
    preload_stages: bool = Field(
        True,
        description="On a machine without GPUs, fork the stages (trainer ranks, preprocessor, a transformers "
        "actor) from a server that imports each stage's module once (torch, transformers; the trainer's with "
        "DeepSpeed), instead of starting each as a new interpreter that imports them again (seconds of CPU "
        "per stage and restart). false: every stage is a new interpreter, as on GPU machines.",
    )
    plan_profile: str | None = Field(
        None,
        description="A cost profile (a shipped name from `pipelinerl plan profiles`, or a profile file): "
        "when the run ends, the simulator predicts it from this profile and the run's own completion "
        "lengths, and the prediction is logged beside what the run measured (MLflow plan/predicted/... "
        "and plan/measured/..., plan_prediction.json in the run directory). Empty: no prediction.",
    )
    plan_prompt_tokens: int = Field(
        40, ge=0, description="Tokens per prompt the prediction of run.plan_profile assumes."
    )

    @model_validator(mode="before")
    @classmethod
    def _max_lag_was_renamed(cls, data: Any) -> Any:
        # Said by name rather than as an unknown setting: run.max_lag read like rl.max_lag (the
        # preprocessor's staleness drop) and a config still using it would otherwise not say where it went.
        if isinstance(data, dict) and "max_lag" in data:
            raise ValueError(
                f"run.max_lag={data['max_lag']!r} was renamed run.async_drain_lag (async mode: versions "
                "the actor may fall behind before it drains); for dropping stale sequences see rl.max_lag"
            )
        return data


class HubSnapshot(Section):
    """Recorded by the launcher: the Hub id a local path was resolved from (not a setting)."""

    id: str = Field(description="The Hugging Face Hub id asked for.")
    revision: str | None = Field(None, description="The revision asked for (empty: main).")
    commit: str = Field(description="The commit of the snapshot the run loaded.")


class ModelConfig(Section):
    path: Path | None = Field(
        None,
        description="Local Hugging Face model directory, or a Hugging Face Hub id ('Qwen/Qwen2.5-0.5B-"
        "Instruct'; revision in model.revision) that the launcher downloads once, before any stage "
        "starts (offline: HF_HUB_OFFLINE=1 reads only the cache). Empty: the embedded tiny model, "
        "warm-started on the task and cached in the platform home.",
    )
    revision: str | None = Field(
        None,
        description="With a Hub id in model.path: the branch, tag or commit to load (empty: main).",
    )
    cache_dir: Path | None = Field(
        None,
        description="With a Hub id in model.path: download the snapshot into this Hugging Face cache "
        "directory (shared storage when stages run on other nodes). Empty: HF_HUB_CACHE, else HF_HOME/hub.",
    )
    hub_snapshot: HubSnapshot | None = Field(
        None,
        description="Written by the launcher into the run's config.json when model.path was a Hub id: "
        "the id, the revision asked and the commit loaded (model.path then holds the local snapshot).",
    )
    warmstart_max_steps: int = Field(
        600,
        ge=1,
        description="Most supervised steps of the embedded model's warm-start; it stops earlier once the "
        "task is partly learned (ignored with a path).",
    )
    chat_template: str = Field(
        "auto",
        description="How prompts are built: 'auto' renders a task's chat messages with the tokenizer's chat "
        "template (plain text when the task or the tokenizer has none), 'none' always uses plain text, or "
        "the path of a Jinja chat template file.",
    )
    system_prompt: str | None = Field(
        None, description="A system message put before a task's chat messages (when a chat template applies)."
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Precision of the policy's weights on the trainer and the actors: float32, bfloat16, or "
        "auto (bfloat16 where the stage runs on a CUDA GPU, float32 on CPU, where bf16 is slower). With "
        "bfloat16 the trainer keeps float32 master weights in DeepSpeed's optimizer; the actors receive "
        "the bf16 weights.",
    )
    lm_head_fp32: bool = Field(
        False,
        description="Compute the LM head (hidden states to vocabulary logits) in float32 on the trainer and "
        "the actors when the weights are in a lower precision (bf16/fp16): same head math on both sides, "
        "a smaller rl/behaviour_mismatch. The weights keep their precision (model.dtype); with float32 "
        "weights it changes nothing.",
    )

    @field_validator("path")
    @classmethod
    def _path_is_model_dir(cls, path: Path | None) -> Path | None:
        if path is None:
            return None
        written = str(path)
        path = path.expanduser()
        if not path.is_dir() and looks_like_hub_id(written):  # a Hub id: the launcher resolves it
            if (problem := hub_id_problem(written)) is not None:
                raise ValueError(
                    f"model.path {written!r} is no local directory and not a valid Hugging Face Hub id: "
                    f"{problem}"
                )
            return Path(written)
        if not path.is_dir():
            raise ValueError(
                f"model directory {str(path)!r} does not exist (give a local Hugging Face dir, or a Hub id "
                "such as 'Qwen/Qwen2.5-0.5B-Instruct')"
            )
        if not (path / "config.json").is_file():
            raise ValueError(f"{str(path)!r} has no config.json: not a Hugging Face model directory")
        return path

    @model_validator(mode="after")
    def _revision_needs_hub_id(self) -> ModelConfig:
        if self.revision is not None and not self.is_hub_id():
            where = (
                "empty (the embedded model)"
                if self.path is None
                else f"the local directory {str(self.path)!r}"
            )
            raise ValueError(
                f"model.revision={self.revision!r} needs a Hugging Face Hub id in model.path, which is "
                f"{where}; drop model.revision or name the model by id"
            )
        return self

    def is_hub_id(self) -> bool:
        """model.path names a Hub id still to resolve (not an existing directory)."""
        return (
            self.path is not None
            and not self.path.expanduser().is_dir()
            and looks_like_hub_id(str(self.path))
        )


# The tasks the package ships (``pipelinerl/tasks``); a user's own is named "package.module:Class".
BUILTIN_TASKS: tuple[str, ...] = ("arithmetic", "math", "reasoning_gym")
_TASK_IMPORT_PATH = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class TaskConfig(Section):
    name: str = Field(
        "arithmetic",
        description="The task: arithmetic (the embedded default), math (a local dataset or the shipped set, "
        "checked with math-verify), reasoning_gym (a procedural generator), or your own as "
        "'package.module:Class' (docs/tasks.md).",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="The task's own settings, passed to its constructor (e.g. math: dataset, question_field; "
        "reasoning_gym: generator, params); see docs/tasks.md.",
    )
    train_problems: int = Field(20000, ge=1, description="Size of the deterministic train split.")
    eval_problems: int = Field(200, ge=1, description="Held-out problems for eval success.")
    hub_snapshot: HubSnapshot | None = Field(
        None,
        description="Written by the launcher into the run's config.json when the math task's dataset was "
        "a Hub id: the id, the revision asked and the commit read (options.dataset then holds the snapshot).",
    )

    @field_validator("name")
    @classmethod
    def _known_task(cls, name: str) -> str:
        if name in BUILTIN_TASKS or _TASK_IMPORT_PATH.match(name):
            return name
        raise ValueError(
            f"unknown task {name!r}; valid: {', '.join(BUILTIN_TASKS)}, or 'package.module:Class' (your own)"
        )


class ActorConfig(Section):
    # What the cross-checks of PipelineConfig say, in JSON Schema: Prefect's form refuses it at submission.
    model_config = ConfigDict(
        json_schema_extra=requires_when(
            ("kv_cache_on_update", {"const": "recompute"}, "engine", "vllm"),
            ("tensor_parallel_size", {"minimum": 2}, "engine", "vllm"),
        )
    )

    engine: Literal["transformers", "vllm"] = Field(
        "transformers",
        description="Inference engine: transformers (in this environment, CPU) or vllm (its own "
        "environment, make vllm-env). tensor_parallel_size above 1, kv_cache_on_update=recompute and "
        "eval.greedy need vllm.",
    )
    num_actors: int = Field(1, ge=1, le=64, description="Actor processes (each one engine).")
    max_in_flight: int = Field(32, ge=1, le=4096, description="H: sequences in flight per actor.")
    temperature: float = Field(1.0, gt=0, le=10, description="Sampling temperature.")
    max_new_tokens: int = Field(96, ge=1, description="Longest completion in tokens.")
    kv_cache_blocks: int = Field(
        0, ge=0, description="KV-cache blocks of the transformers engine (0: enough for H full sequences)."
    )
    kv_block_size: int = Field(
        32, ge=1, description="Tokens per KV-cache block (transformers engine; vLLM on CPU uses 32)."
    )
    kv_cache_on_update: Literal["keep", "recompute"] = Field(
        "keep",
        description="vllm engine, at an in-flight weight update: keep the KV cache written by the older "
        "weights (the paper's behaviour), or clear it so in-flight prefixes are recomputed under the new "
        "ones.",
    )
    kv_cache_gib: float | None = Field(
        None,
        gt=0,
        description="vllm engine: memory for the KV cache, in GiB. Empty: 1 GiB on CPU; on a GPU, what "
        "actor.gpu_memory_utilization leaves beside the weights and activations.",
    )
    gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="vllm engine on a GPU, when actor.kv_cache_gib is empty: the fraction of the GPU's "
        "memory vLLM may take (weights, activations, KV cache). Lower it when the trainer shares the GPU.",
    )
    cuda_graphs: Literal["auto", "on", "off"] = Field(
        "auto",
        description="vllm engine: capture CUDA graphs for decoding (auto: on a GPU; vLLM's CPU build runs "
        "eagerly, and 'on' there is refused).",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=16,
        description="vllm engine: GPUs (workers) per actor. Each worker joins the weight group, receives "
        "the full tensors and lets vLLM shard them.",
    )
    torch_threads: int = Field(1, ge=1, description="torch threads of each actor process.")
    cpus: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="CPU cores the actor processes are confined to (empty: no pinning). With trainer.cpus, "
        "gives actor and trainer their own cores, as they would own their own GPUs (benchmarks).",
    )
    python: str | None = Field(
        None,
        description="Interpreter that runs the actor (default: the current one). The vllm engine needs "
        "an environment with vLLM: `make vllm-env` builds .venv-vllm/bin/python.",
    )


class TrainerConfig(Section):
    # offload_optimizer needs ZeRO (stage 1 or more), in JSON Schema too (Prefect's form refuses it).
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": schema_at("offload_optimizer", {"const": True}),
                    "then": schema_at("zero_stage", {"minimum": 1}),
                }
            ]
        }
    )

    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where the trainer ranks run: cuda (one GPU per rank, NCCL among ranks), cpu (gloo), or "
        "auto: cuda where the node has GPUs and torch can use them, else cpu.",
    )
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    activation_checkpointing: bool = Field(
        False,
        description="Recompute each layer's activations in the backward pass instead of keeping them "
        "(the model's gradient checkpointing): less memory for long sequences, about a third more compute.",
    )
    offload_optimizer: bool = Field(
        False,
        description="Keep the optimizer's state in host memory (DeepSpeed ZeRO offload; needs "
        "trainer.zero_stage >= 1): frees GPU memory for a larger model, at the cost of step time.",
    )
    num_processes: int = Field(1, ge=1, le=64, description="Trainer ranks (data parallel).")
    record_batches: bool = Field(
        True,
        description="Keep the exact batch each step trained (token ids, log-probs, versions, advantages, "
        "micro-batch packing) in the run directory's batches/, so a step can be replayed; about twice the "
        "step's compressed token data in tokens/ (trainer/batch_record_bytes).",
    )
    learning_rate: float = Field(3e-5, gt=0, le=1, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip.")
    warmup_steps: int = Field(0, ge=0, description="Linear learning-rate warm-up steps.")
    micro_batch_tokens: int = Field(
        8192, ge=16, description="Padded tokens per micro-batch (sequences x longest length)."
    )
    torch_threads: int = Field(1, ge=1, description="torch threads of each trainer process.")
    cpus: list[Annotated[int, Field(ge=0)]] = Field(
        default_factory=list,
        description="CPU cores the trainer ranks and the preprocessor are confined to (empty: no pinning).",
    )
    checkpoint_every: int = Field(
        25,
        ge=0,
        description="Save a Hugging Face checkpoint every N policy versions (0: only the final one).",
    )

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> TrainerConfig:
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError(
                "trainer.offload_optimizer=true needs trainer.zero_stage 1, 2 or 3 (ZeRO holds the optimizer "
                "state it offloads); got zero_stage=0"
            )
        return self


_EVAL_SET_NAME = r"^[A-Za-z0-9_-]+$"


class EvalConfig(Section):
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"sets": {"minProperties": 1}}, "required": ["sets"]},
                    "then": {"properties": {"every": {"minimum": 1}}, "required": ["every"]},
                }
            ]
        }
    )

    every: int = Field(
        0,
        ge=0,
        description="Evaluate the held-out set every this many policy versions during the run, through the "
        "actor's own engine (0: only at the start and the end).",
    )
    samples: int = Field(
        1,
        ge=1,
        le=64,
        description="k: samples per held-out problem (pass@1 is their mean, pass@k any correct).",
    )
    name: str = Field(
        "heldout",
        pattern=_EVAL_SET_NAME,
        description="The name, in metrics (eval/NAME/pass_at_1), of the set drawn from the task's own "
        "held-out split.",
    )
    sets: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="More named eval sets: name -> task options that replace those of task.options for "
        "that set, whose held-out split is evaluated too, e.g. {math500 = {dataset = '/data/math500.jsonl', "
        "eval_fraction = 0.99}} or {chain_sum_long = {generator = 'chain_sum', params = {max_terms = 6}}}.",
    )
    greedy: bool = Field(
        False,
        description="Decode the eval sets greedily (temperature 0) instead of at actor.temperature; needs "
        "actor.engine='vllm' (the transformers engine's batch samples every request at one temperature).",
    )
    hub_snapshots: dict[str, HubSnapshot] = Field(
        default_factory=dict,
        description="Written by the launcher into the run's config.json for each eval set whose math "
        "dataset was a Hub id: set name -> the id, the revision asked and the commit read.",
    )

    @field_validator("sets")
    @classmethod
    def _set_names(cls, sets: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name in sets:
            if not re.match(_EVAL_SET_NAME, name):
                raise ValueError(f"eval set name {name!r} may use only letters, digits, '_' and '-'")
        return sets

    @model_validator(mode="after")
    def _distinct_names(self) -> EvalConfig:
        if self.name in self.sets:
            raise ValueError(f"eval.sets names {self.name!r}, already eval.name (the task's own set)")
        return self

    def set_names(self) -> list[str]:
        """Every eval set, the task's own first."""
        return [self.name, *self.sets]
