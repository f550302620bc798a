"""Experiment configuration: typed, validated, loaded from TOML with ``--set`` overrides.

Every field carries a type, a constraint and a description: the same models are what the CLI
validates and what the Prefect run form renders. A bad value fails here, before any process
starts, with a message naming the field, the value and what is allowed.

The configuration is a tree of sections (``run``, ``model``, ``task``, ``actor``, ``rl``,
``trainer``, ``transport``, ``tracking``, ``cluster``); an override names a leaf as ``section.key=value``.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

Mode = Literal["pipeline", "conventional", "async"]
MODES: tuple[Mode, ...] = ("pipeline", "conventional", "async")


class ConfigError(ValueError):
    """A configuration that cannot run; the message is meant for the user as is."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


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
    max_lag: int = Field(
        2, ge=1, description="async mode: versions the actor may fall behind before it drains and updates."
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
    stall_timeout_s: float = Field(
        900.0,
        ge=0,
        description="End the run with an error naming the stall when no optimizer step completes for this "
        "many seconds (the first step included, so leave room for loading the model); with "
        "run.max_restarts the run restarts from its latest checkpoint instead. 0: never.",
    )
    max_restarts: int = Field(
        0,
        ge=0,
        le=10,
        description="When a stage crashes, stop every stage and start them all again from the run's "
        "latest checkpoint (or from the start), at most this many times; 0: a crash fails the run.",
    )


class ModelConfig(Section):
    path: Path | None = Field(
        None,
        description="Local Hugging Face model directory. Empty: the embedded tiny model, warm-started "
        "on the task and cached in the platform home.",
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
        path = path.expanduser()
        if not path.is_dir():
            raise ValueError(f"model directory {str(path)!r} does not exist (give a local Hugging Face dir)")
        if not (path / "config.json").is_file():
            raise ValueError(f"{str(path)!r} has no config.json: not a Hugging Face model directory")
        return path


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

    @field_validator("name")
    @classmethod
    def _known_task(cls, name: str) -> str:
        if name in BUILTIN_TASKS or _TASK_IMPORT_PATH.match(name):
            return name
        raise ValueError(
            f"unknown task {name!r}; valid: {', '.join(BUILTIN_TASKS)}, or 'package.module:Class' (your own)"
        )


class ActorConfig(Section):
    engine: Literal["transformers", "vllm"] = Field("transformers", description="Inference engine.")
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
    kv_cache_gib: float = Field(1.0, gt=0, description="vllm engine: memory for the KV cache, in GiB.")
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


class RLConfig(Section):
    group_size: int = Field(4, ge=2, le=256, description="Samples per prompt; advantages are leave-one-out.")
    batch_size: int = Field(32, ge=1, description="B: sequences per optimizer step.")
    loss: Literal["truncated_is", "ppo_clip"] = Field(
        "truncated_is", description="REINFORCE with truncated importance sampling, or PPO-clip."
    )
    is_cap: float = Field(5.0, gt=0, description="c: cap of the truncated importance weight min(r, c).")
    ppo_clip_epsilon: float = Field(0.2, gt=0, lt=1, description="PPO clip range epsilon.")
    normalize_advantages: bool = Field(False, description="Divide group advantages by the group std.")
    truncated: Literal["train", "mask", "penalise"] = Field(
        "train",
        description="A completion cut at actor.max_new_tokens: trained like any other (train), kept in its "
        "group's baseline with advantage 0 so it adds nothing to the loss (mask), or given reward "
        "-rl.truncated_penalty (penalise).",
    )
    truncated_penalty: float = Field(
        1.0, ge=0, description="rl.truncated=penalise: the reward is minus this."
    )
    format_reward: float = Field(
        0.0,
        ge=0,
        description="Added to the reward of a completion whose answer could be read (correct or wrong).",
    )
    drop_zero_variance_groups: bool = Field(
        False,
        description="Drop groups whose rewards are all equal (zero advantages, no signal: dynamic sampling); "
        "counted in samples/dropped_zero_variance.",
    )
    max_lag: int | None = Field(
        None,
        ge=0,
        description="Hard staleness bound: a sequence with a token more than this many versions older than "
        "the policy it would train is dropped and counted (samples/dropped_stale). Empty: no bound.",
    )

    @model_validator(mode="after")
    def _batch_holds_whole_groups(self) -> RLConfig:
        if self.batch_size % self.group_size:
            raise ValueError(
                f"rl.batch_size={self.batch_size} must be a multiple of rl.group_size={self.group_size} "
                "so that every batch holds whole groups"
            )
        return self


class TrainerConfig(Section):
    zero_stage: int = Field(2, ge=0, le=3, description="DeepSpeed ZeRO stage.")
    num_processes: int = Field(1, ge=1, le=64, description="Trainer ranks (data parallel).")
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


_EVAL_SET_NAME = r"^[A-Za-z0-9_-]+$"


class EvalConfig(Section):
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


class TrackingConfig(Section):
    enabled: bool = Field(True, description="Record the run in MLflow and the platform database.")
    mlflow_uri: str | None = Field(
        None,
        description="MLflow tracking URI (http://..., sqlite:///..., postgresql://...). Empty: "
        "MLFLOW_TRACKING_URI, else a SQLite store in the platform home.",
    )
    database_url: str | None = Field(
        None,
        description="SQLAlchemy URL of the platform database. Empty: PIPELINERL_DATABASE_URL, else a "
        "SQLite file in the platform home.",
    )
    figures_every: int = Field(
        0, ge=0, description="Log the run's figures to MLflow every N policy versions (0: at the end only)."
    )
    flush_interval_s: float = Field(
        2.0, gt=0, le=60, description="Seconds between batched writes of metrics to MLflow."
    )
    final_flush_timeout_s: float = Field(
        60.0,
        ge=0,
        description="At the end of a run, how long to keep retrying a tracking store that went away "
        "before giving up on the buffered metrics (the run directory keeps them all).",
    )


Role = Literal["trainer", "actor"]
ROLES: tuple[Role, ...] = ("trainer", "actor")


class ClusterConfig(Section):
    placement: Literal["local", "pools"] = Field(
        "local",
        description="local: every stage runs on the launching machine; pools: one Prefect flow run per "
        "role and node, submitted to the role's deployment on its work pool (actors, trainers). Pools need "
        "run.output_dir and the model on storage every node shares.",
    )
    trainer_deployment: str = Field(
        "rl-role/trainers",
        pattern=r"^[^/]+/[^/]+$",
        description="pools: the deployment (flow/deployment) running the trainer role (pool trainers).",
    )
    actor_deployment: str = Field(
        "rl-role/actors",
        pattern=r"^[^/]+/[^/]+$",
        description="pools: the deployment (flow/deployment) running the actor role (pool actors).",
    )
    trainer_nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="pools: nodes (flow runs) the trainer ranks are split over; node 0 also runs the "
        "preprocessor. trainer.num_processes must divide evenly.",
    )
    actor_nodes: int = Field(
        1,
        ge=1,
        le=64,
        description="pools: nodes (flow runs) the actors are split over; actor.num_actors must divide.",
    )
    trainer_gpus_per_node: int = Field(
        0, ge=0, le=16, description="pools: the `gpus` job variable of each trainer flow run (0: CPU)."
    )
    actor_gpus_per_node: int = Field(
        0, ge=0, le=16, description="pools: the `gpus` job variable of each actor flow run (0: CPU)."
    )
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="pools: how long a role flow run may wait for a worker of its pool before the run fails.",
    )

    def nodes(self, role: Role) -> int:
        return self.trainer_nodes if role == "trainer" else self.actor_nodes

    def gpus_per_node(self, role: Role) -> int:
        return self.trainer_gpus_per_node if role == "trainer" else self.actor_gpus_per_node

    def deployment(self, role: Role) -> str:
        return self.trainer_deployment if role == "trainer" else self.actor_deployment


class TransportConfig(Section):
    host: str = Field(
        "127.0.0.1",
        description="Address of trainer node 0, where the run's sockets are bound and every other stage "
        "connects. Loopback: plain TCP on one machine. Any other address: ZeroMQ traffic is encrypted and "
        "authenticated with the run's CurveZMQ keys; the weight group and DeepSpeed's own traffic are not, "
        "so keep them on a private cluster network.",
    )
    base_port: int = Field(
        21100,
        ge=1024,
        le=65000,
        description="First of the consecutive ports the run uses (see PORTS). Keep it below the kernel's "
        "ephemeral range (Linux: 32768-60999), where any outgoing connection may hold a port.",
    )
    queue_size: int = Field(
        32, ge=1, description="High-water mark of the rollout queue, in messages (bounds memory and lag)."
    )
    batches_ahead: int = Field(
        2,
        ge=1,
        le=64,
        description="Train batches the preprocessor may hand out beyond the trainer's latest published "
        "version (conventional mode adds the round's G-1): with 2, one batch waits while one trains. Work "
        "queued past that waits upstream, where the actors feel the backpressure, so the lag stays bounded.",
    )
    socket_buffer_kib: int = Field(
        16,
        ge=4,
        le=65536,
        description="Kernel send and receive buffer of the rollout and batch sockets, in KiB. The high-water "
        "marks count messages; unbounded kernel buffers would hold hundreds more (and their lag) on top.",
    )
    max_message_mib: int = Field(
        256,
        ge=1,
        le=4096,
        description="Largest message part (a header, or one array) any socket of the run accepts, in MiB. "
        "ZeroMQ refuses a larger one from its size prefix, before allocating it, and drops the connection "
        "that carried it; a stage refuses to send one, naming this setting. Raise it only for train "
        "batches whose header (one entry per sequence) or arrays outgrow it.",
    )

    @field_validator("host")
    @classmethod
    def _an_address(cls, host: str) -> str:
        if not host.strip() or any(c in host for c in "/:* "):
            raise ValueError(
                f"host {host!r} is not an address: give an IP address or a host name "
                "(e.g. 127.0.0.1, 10.0.0.5, trainer-0.cluster.local)"
            )
        return host

    @property
    def is_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    @property
    def max_message_bytes(self) -> int:
        return self.max_message_mib * 2**20

    def address(self, role: str) -> str:
        return f"tcp://{self.host}:{self.port(role)}"

    def port(self, role: str) -> int:
        return self.base_port + PORTS.index(role)

    def trainer_inbox(self, rank: int) -> str:
        """Where trainer ``rank`` receives its batches (each rank binds its own)."""
        return f"tcp://{self.host}:{self.base_port + len(PORTS) + rank}"

    def all_bound_addresses(self, trainer_ranks: int) -> list[str]:
        return [self.address(role) for role in PORTS] + [self.trainer_inbox(r) for r in range(trainer_ranks)]


# Port offsets from transport.base_port, in this order; trainer inboxes follow, one per rank.
PORTS = ("rollouts", "weights", "weight_group", "trainer_dist")


class PipelineConfig(Section):
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
        if self.eval.greedy and self.actor.engine != "vllm":
            raise ValueError(
                "eval.greedy=true needs actor.engine='vllm': the transformers engine samples every request "
                "of its batch at actor.temperature (leave eval.greedy off to evaluate at that temperature)"
            )
        if self.eval.sets and not self.eval.every:
            raise ValueError(
                f"eval.sets ({', '.join(self.eval.sets)}) are evaluated during the run: set eval.every too"
            )
        if self.actor.tensor_parallel_size > 1 and self.actor.engine != "vllm":
            raise ValueError(
                f"actor.tensor_parallel_size={self.actor.tensor_parallel_size} needs actor.engine='vllm' "
                "(the transformers engine runs on one device)"
            )
        return self

    def mode_label(self) -> str:
        """What the run is, as comparisons and MLflow's child runs name it: ``pipeline``, ``async-lag2``,
        ``conventional-G8`` or, with strict rounds (generation, then training), ``conventional-G8-strict``."""
        if self.run.mode == "async":
            return f"async-lag{self.run.max_lag}"
        if self.run.mode != "conventional":
            return self.run.mode
        label = f"conventional-G{self.run.steps_per_round}"
        return label if self.run.train_during_round else f"{label}-strict"

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
