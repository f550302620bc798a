"""The sections that say where and how a run's stages meet: ``tracking``, ``cluster``, ``transport``."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator

from pipelinerl.platform.config.base import Section


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
    trainer_work_queues: list[str] = Field(
        default_factory=list,
        description="pools: the work queue of each trainer node's flow run, in node order (empty: the pool's "
        "default queue). Pins node 0 to the worker on the host transport.host names, where every socket of "
        "the run is bound; e.g. one queue per host, polled by that host's worker only.",
    )
    actor_work_queues: list[str] = Field(
        default_factory=list,
        description="pools: the work queue of each actor node's flow run, in node order (empty: the pool's "
        "default queue, which any worker of the pool may take; a worker started with --limit 1 takes one).",
    )
    trainer_gpus_per_node: int = Field(
        0, ge=0, le=16, description="pools: the `gpus` job variable of each trainer flow run (0: CPU)."
    )
    actor_gpus_per_node: int = Field(
        0, ge=0, le=16, description="pools: the `gpus` job variable of each actor flow run (0: CPU)."
    )
    colocate: bool = Field(
        False,
        description="One GPU for the trainer and one vLLM actor (a one-GPU machine): the actor runs on the "
        "trainer's GPU and weight updates travel as CUDA IPC handles, not through NCCL (which refuses two "
        "ranks on one GPU). Needs a single trainer rank and actor, local placement, and an "
        "actor.gpu_memory_utilization low enough to leave the trainer its memory (e.g. 0.3).",
    )
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="pools: how long a role flow run may wait for a worker of its pool before the run fails.",
    )

    heartbeat_timeout_s: float = Field(
        60.0,
        ge=15,
        description="pools: a role flow run whose heartbeat (written every 5 s to the shared run directory) "
        "is older than this has lost its host (powered off, cable cut, its worker killed with it): the run "
        "names the host and fails, or restarts with run.max_restarts with the role on another worker.",
    )

    def nodes(self, role: Role) -> int:
        return self.trainer_nodes if role == "trainer" else self.actor_nodes

    def gpus_per_node(self, role: Role) -> int:
        return self.trainer_gpus_per_node if role == "trainer" else self.actor_gpus_per_node

    def work_queue(self, role: Role, node: int) -> str | None:
        """The work queue of ``role``'s node ``node`` (None: the pool's default queue)."""
        queues = self.trainer_work_queues if role == "trainer" else self.actor_work_queues
        return queues[node] if queues else None

    def deployment(self, role: Role) -> str:
        return self.trainer_deployment if role == "trainer" else self.actor_deployment


class TransportConfig(Section):
    host: str = Field(
        "127.0.0.1",
        description="Address of trainer node 0, where the run's sockets and stores are bound (on it only) "
        "and every other stage connects. ZeroMQ traffic is always encrypted and authenticated with the "
        "run's CurveZMQ keys, on loopback too; the weight group and DeepSpeed's own traffic are not, so "
        "beyond loopback keep them on a private cluster network.",
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

    weight_backend: Literal["auto", "gloo", "nccl", "ipc"] = Field(
        "auto",
        description="How the trainer's weights reach the actors after each step (the weight group). auto: "
        "CUDA IPC handles with cluster.colocate; NCCL when the trainer runs on GPUs and the actors are vLLM "
        "on GPUs of their own; else gloo (through host memory: the CPU path, and the fallback when neither "
        "applies).",
    )
    weight_bucket_mib: int = Field(
        32,
        ge=1,
        le=16384,
        description="Largest bucket of a weight update, in MiB: consecutive tensors travel flattened in one "
        "broadcast of at most this size (a larger tensor alone). Trainer and actors each hold one bucket "
        "beside the model; fewer, larger buckets mean fewer round trips, but past a few tens of MiB the "
        "copy into and out of a bucket costs more than the trips it saves (pipelinerl bench weights).",
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
