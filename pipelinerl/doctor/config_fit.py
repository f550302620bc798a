"""A config against this machine: the model it names, the memory each role would take at ``model.dtype``
with the KV cache the actor would reserve, the GPUs each role needs, and whether it all fits, without
downloading the model or starting a run.

The figures come from ``memory_need`` (pure); this module gathers their inputs: the model's shape
(``model_facts``, built on torch's meta device so nothing is allocated) and the machine facts
``report`` already gathered.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipelinerl.doctor import memory_need as need
from pipelinerl.doctor.checks import Check, Status
from pipelinerl.doctor.model_facts import ModelFacts
from pipelinerl.launch.gpus import GpuPlanError, actor_gpu_pool, trainer_device
from pipelinerl.platform.config import ConfigError, PipelineConfig

SECTION = "Config"
GIB = need.GIB
RANK_SETTINGS = "trainer.zero_stage, trainer.num_processes, trainer.offload_optimizer"
ACTOR_SETTINGS = "actor.gpu_memory_utilization, actor.kv_cache_gib"
MEMORY_FIX = f"lower the need with {RANK_SETTINGS}, {ACTOR_SETTINGS}, actor.max_in_flight or model.dtype"


@dataclass(frozen=True)
class Gpus:
    """The GPUs a local launch would hand out (launch/gpus.py ``visible_gpus``), from the facts the
    report gathered: their ids, memory in bytes (None when unknown) and whether torch can use them."""

    ids: list[str]
    memory: list[float | None]
    torch_cuda: bool


def visible(torch: dict[str, Any], smi: dict[str, Any] | None, environ: Mapping[str, str]) -> Gpus:
    listed = (smi or {}).get("gpus", [])
    if "CUDA_VISIBLE_DEVICES" in environ:
        ids = [part.strip() for part in environ["CUDA_VISIBLE_DEVICES"].split(",") if part.strip()]
    else:
        ids = [str(gpu["index"]) for gpu in listed]
    devices = torch.get("devices", [])
    by_index = {str(gpu["index"]): gpu.get("memory_gib") for gpu in listed}
    memory: list[float | None] = []
    for position, gpu in enumerate(ids):
        gib = devices[position]["memory_gib"] if position < len(devices) else by_index.get(gpu)
        memory.append(None if gib is None else float(gib) * GIB)
    return Gpus(ids, memory, bool(ids) and bool(torch.get("cuda_available")))


@dataclass(frozen=True)
class Layout:
    """Where each role runs: the trainer on cuda or not, vLLM actors on GPUs or not; ``error`` is the
    launcher's own refusal when it would refuse."""

    trainer_on_cuda: bool
    actors_on_gpu: bool
    error: str | None = None


def layout(config: PipelineConfig, gpus: Gpus) -> Layout:
    cluster, vllm = config.cluster, config.actor.engine == "vllm"
    if cluster.placement == "pools":  # each node resolves its own; the job's `gpus` variable says how many
        on_cuda = config.trainer.device != "cpu" and (
            config.trainer.device == "cuda" or cluster.trainer_gpus_per_node > 0
        )
        return Layout(on_cuda, vllm and cluster.actor_gpus_per_node > 0)
    try:
        on_cuda = trainer_device(config.trainer.device, gpus.ids, gpus.torch_cuda) == "cuda"
        trainer_gpus = gpus.ids[: config.trainer.num_processes] if on_cuda else []
        actor_gpu_pool(gpus.ids, trainer_gpus, engine=config.actor.engine, colocate=cluster.colocate)
    except GpuPlanError as error:
        return Layout(False, False, str(error))
    # vLLM actors take GPUs wherever the node has some (launch/stages.py), however many are left.
    return Layout(on_cuda, vllm and bool(gpus.ids))


def check_model(model: ModelFacts | BaseException) -> Check:
    if isinstance(model, BaseException):
        if isinstance(model, ConfigError):
            fix = "fetch the model (the command above), or set model.path to a local model directory"
            return Check(SECTION, "model", "FAIL", str(model), fix)
        return Check(
            SECTION,
            "model",
            "FAIL",
            f"cannot read the model's config: {type(model).__name__}: {model}",
            "set model.path to a Hugging Face model directory (config.json), a cached Hub id, or leave it "
            "empty for the embedded tiny model",
        )
    shape = model.shape
    detail = (
        f"{model.architecture} from {model.source}: {shape.params / 1e6:,.1f} M parameters, "
        f"{shape.layers} layers, {shape.kv_heads} KV heads x {shape.head_dim}"
    )
    return Check(SECTION, "model", "PASS", detail, data={"source": model.source, **vars(shape)})


@dataclass(frozen=True)
class Needs:
    """What one trainer rank and one actor take, and the memory of the actor's GPU (None: unknown)."""

    rank: need.TrainerRankNeed
    actor: need.ActorNeed
    actor_gpu_memory: float | None


def actor_gpu_memory(config: PipelineConfig, gpus: Gpus, where: Layout) -> float | None:
    """The memory of actor 0's first GPU: trainer rank 0's when colocated, else the first one after the
    trainer's; None off GPUs, on pool nodes, or when this machine has no such GPU."""
    if not where.actors_on_gpu or config.cluster.placement == "pools":
        return None
    first = 0 if config.cluster.colocate or not where.trainer_on_cuda else config.trainer.num_processes
    return gpus.memory[first] if first < len(gpus.memory) else None


def role_needs(config: PipelineConfig, shape: need.ModelShape, gpus: Gpus, where: Layout) -> Needs:
    """Each role at ``model.dtype`` as its stage resolves it (bf16 on a CUDA stage, fp32 on CPU); the
    actor's cache as its engine would reserve it for prompts of ``run.plan_prompt_tokens`` tokens (the
    actor sizes it from the task's longest prompt, which the doctor does not build)."""
    from pipelinerl.platform.dtypes import policy_dtype_name  # noqa: PLC0415 (torch)
    from pipelinerl.workers.engines.vllm_engine import CPU_KV_CACHE_GIB  # noqa: PLC0415 (torch)

    trainer, actor = config.trainer, config.actor
    trainer_dtype = policy_dtype_name(config.model.dtype, cuda=where.trainer_on_cuda)
    rank = need.trainer_rank_need(
        shape.params,
        trainer_dtype,
        trainer.num_processes,
        trainer.zero_stage,
        trainer.offload_optimizer,
        reference_model=config.rl.kl.coef > 0,
    )
    vllm = actor.engine == "vllm"
    # The transformers engine keeps its weights in host memory, at the dtype its process resolves.
    actor_dtype = policy_dtype_name(config.model.dtype, cuda=where.actors_on_gpu if vllm else gpus.torch_cuda)
    tokens = config.run.plan_prompt_tokens + actor.max_new_tokens
    per_token = shape.kv_bytes_per_token(actor_dtype)
    memory = actor_gpu_memory(config, gpus, where)
    reserved: float | None
    if not vllm:
        blocks = need.transformers_cache_blocks(
            actor.kv_cache_blocks, actor.kv_block_size, actor.max_in_flight, tokens
        )
        reserved = float(blocks * actor.kv_block_size * per_token)
    elif where.actors_on_gpu and actor.kv_cache_gib is None and memory is None:
        reserved = None
    else:
        reserved = need.vllm_cache_bytes(
            kv_cache_gib=actor.kv_cache_gib,
            on_gpu=where.actors_on_gpu,
            cpu_default_gib=CPU_KV_CACHE_GIB,
            gpu_memory_utilization=actor.gpu_memory_utilization,
            gpu_memory=memory or 0.0,
            weights=shape.params * need.DTYPE_BYTES[actor_dtype],
            tensor_parallel_size=actor.tensor_parallel_size,
        )
    return Needs(rank, need.actor_need(shape, actor_dtype, actor.max_in_flight, tokens, reserved), memory)


def _cache_fix(config: PipelineConfig, actor: need.ActorNeed, held: int, on_gpu: bool) -> str:
    """The settings that make the actor's cache hold H full sequences, with values that do."""
    settings = config.actor
    lower = f"lower actor.max_in_flight to {max(held, 1)}" if held else "lower actor.max_new_tokens"
    if settings.engine != "vllm":
        blocks = need.transformers_cache_blocks(
            0, settings.kv_block_size, actor.max_in_flight, actor.sequence_tokens
        )
        return f"{lower}, or set actor.kv_cache_blocks to {blocks} or 0 (room for H full sequences)"
    per_gpu = actor.kv_full / GIB / (settings.tensor_parallel_size if on_gpu else 1)  # the setting is per GPU
    raise_it = f"raise actor.kv_cache_gib to {per_gpu:.2f} or more"
    if settings.kv_cache_gib is None and actor.kv_reserved is not None and actor.kv_reserved > 0:
        raise_it += " (or actor.gpu_memory_utilization)"
    return f"{lower}, or {raise_it}"


def check_role_memory(config: PipelineConfig, needs: Needs, where: Layout) -> Check:
    """Each role's model state; WARN when the actor's cache cannot hold H full sequences, FAIL when it
    cannot hold one (the engine refuses to start)."""
    rank, actor = needs.rank, needs.actor
    on = "cuda" if where.trainer_on_cuda else "cpu"
    host = f", optimizer on host {need.size(rank.host)}" if rank.offloaded else ""
    trainer_text = (
        f"trainer rank ({on}, {rank.dtype}, ZeRO-{config.trainer.zero_stage} over "
        f"{config.trainer.num_processes}): {need.size(rank.device)} = weights {need.size(rank.weights)} + "
        f"grads {need.size(rank.grads)} + Adam {need.size(0.0 if rank.offloaded else rank.optimizer)}"
        + (f" + KL reference {need.size(rank.reference)}" if rank.reference else "")
        + host
    )
    engine = config.actor.engine
    place = "GPU" if where.actors_on_gpu else "CPU"
    full = (
        f"H={actor.max_in_flight} full sequences of {actor.sequence_tokens} tokens (run.plan_prompt_tokens="
        f"{config.run.plan_prompt_tokens} + actor.max_new_tokens={config.actor.max_new_tokens}) need "
        f"{need.size(actor.kv_full)}"
    )
    reserved = "not known here" if actor.kv_reserved is None else need.size(actor.kv_reserved)
    actor_text = (
        f"actor ({engine} on {place}, {actor.dtype}): weights {need.size(actor.weights)} + KV cache "
        f"{reserved} reserved; {full}"
    )
    data = {
        "trainer_rank": {**vars(rank), "device_bytes": rank.device, "host_bytes": rank.host},
        "actor": {**vars(actor), "kv_full": actor.kv_full, "sequences_held": actor.sequences_held},
    }
    detail = f"{trainer_text}; {actor_text}"
    held = actor.sequences_held
    if held is None or held >= actor.max_in_flight:
        return Check(SECTION, "memory per role", "PASS", detail, data=data)
    status: Status = "WARN" if held >= 1 else "FAIL"
    holds = f"the reserved cache holds {held} of H={actor.max_in_flight} full sequences"
    return Check(
        SECTION,
        "memory per role",
        status,
        f"{detail}: {holds}",
        _cache_fix(config, actor, held, where.actors_on_gpu),
        data,
    )


def _ids(ids: list[str]) -> str:
    return ",".join(ids) or "none"


def check_gpus(config: PipelineConfig, gpus: Gpus, where: Layout) -> Check:
    """The GPUs the roles take against those this machine shows (local), or against each pool node's
    ``gpus`` job variable (pools: each node checks its own GPUs when its stage starts, launch/gpus.py)."""
    trainer, actor, cluster = config.trainer, config.actor, config.cluster
    if cluster.placement == "pools":
        return _check_pool_gpus(config, where)
    if where.error is not None:
        fix = (
            "set cluster.colocate=false, or trainer.device='cuda' where a GPU is"
            if "cluster.colocate" in where.error
            else "set trainer.device='auto' or 'cpu' (valid: auto, cpu, cuda)"
        )
        return Check(SECTION, "GPUs per role", "FAIL", where.error, fix)
    wanted = need.gpu_need(
        trainer_on_cuda=where.trainer_on_cuda,
        ranks=trainer.num_processes,
        actors_on_gpu=where.actors_on_gpu,
        num_actors=actor.num_actors,
        tp=actor.tensor_parallel_size,
        colocate=cluster.colocate,
    )
    data = {"trainer": wanted.trainer, "actors": wanted.actors, "visible": gpus.ids}
    if wanted.total == 0:
        unused = f"; GPUs {_ids(gpus.ids)} unused" if gpus.ids else ""
        detail = f"CPU only: trainer and {actor.num_actors} actor(s) on CPU{unused}"
        return Check(SECTION, "GPUs per role", "PASS", detail, data=data)
    parts = [f"trainer.num_processes={trainer.num_processes} on cuda"] if wanted.trainer else []
    if wanted.actors:
        parts.append(
            f"actor.num_actors={actor.num_actors} x actor.tensor_parallel_size={actor.tensor_parallel_size}"
        )
    shared = " (the actor shares trainer rank 0's GPU: cluster.colocate)" if cluster.colocate else ""
    detail = f"needs {wanted.total} GPU(s): {' + '.join(parts)}{shared}; this machine shows {len(gpus.ids)}"
    if wanted.total > len(gpus.ids):
        return Check(
            SECTION,
            "GPUs per role",
            "FAIL",
            f"{detail} ({_ids(gpus.ids)})",
            f"need at most {len(gpus.ids)}: lower trainer.num_processes, actor.num_actors or "
            "actor.tensor_parallel_size, set cluster.colocate=true (1 rank + 1 vLLM actor on one GPU), or "
            "trainer.device='cpu'",
            data,
        )
    trainer_ids = gpus.ids[: wanted.trainer]
    actor_ids = gpus.ids[wanted.trainer : wanted.total]
    where_text = f"trainer on GPU(s) {_ids(trainer_ids)}" if wanted.trainer else "trainer on CPU"
    if wanted.actors:
        where_text += f", actors on GPU(s) {_ids(actor_ids)}"
    elif not where.actors_on_gpu:
        where_text += f", {actor.engine} actors on CPU"
    return Check(SECTION, "GPUs per role", "PASS", f"{detail}: {where_text}", data=data)


def _check_pool_gpus(config: PipelineConfig, where: Layout) -> Check:
    cluster, trainer, actor = config.cluster, config.trainer, config.actor
    ranks = trainer.num_processes // cluster.trainer_nodes
    actors = actor.num_actors // cluster.actor_nodes
    per_actor = actor.tensor_parallel_size if where.actors_on_gpu else 0
    detail = (
        f"pools: each node checks its own GPUs when its stage starts; trainer node: {ranks} rank(s) "
        f"{'on cuda' if where.trainer_on_cuda else 'on CPU'}, cluster.trainer_gpus_per_node="
        f"{cluster.trainer_gpus_per_node}; actor node: {actors} actor(s) x {per_actor} GPU(s), "
        f"cluster.actor_gpus_per_node={cluster.actor_gpus_per_node}"
    )
    data = {"trainer_ranks_per_node": ranks, "actor_gpus_per_node_needed": actors * per_actor}
    if where.trainer_on_cuda and cluster.trainer_gpus_per_node < ranks:
        return Check(
            SECTION,
            "GPUs per role",
            "FAIL",
            f"{detail}: {ranks} trainer rank(s) on cuda per node need {ranks} GPU(s)",
            f"set cluster.trainer_gpus_per_node to {ranks} or more, or trainer.device='cpu'",
            data,
        )
    return Check(SECTION, "GPUs per role", "SKIP", detail, data=data)


def _gpu_loads(
    config: PipelineConfig, needs: Needs, gpus: Gpus, where: Layout
) -> dict[int, list[tuple[str, float]]]:
    """What each GPU holds: trainer ranks on the first ones, then each actor's ``tensor_parallel_size``
    (the colocated actor on trainer rank 0's); a vLLM actor takes ``gpu_memory_utilization`` of its GPU,
    or its weights' share and ``actor.kv_cache_gib`` when that is set."""
    trainer, actor = config.trainer, config.actor
    loads: dict[int, list[tuple[str, float]]] = {}
    if where.trainer_on_cuda:
        for rank in range(trainer.num_processes):
            loads.setdefault(rank, []).append((f"trainer rank {rank}", need.with_margin(needs.rank.device)))
    if not where.actors_on_gpu:
        return loads
    tp = actor.tensor_parallel_size
    first = 0 if config.cluster.colocate or not where.trainer_on_cuda else trainer.num_processes
    for actor_id in range(actor.num_actors):
        for worker in range(tp):
            index = first + actor_id * tp + worker
            if index >= len(gpus.ids):
                continue  # GPUs per role fails: the machine lacks it
            memory = gpus.memory[index] or 0.0
            taken = (
                actor.gpu_memory_utilization * memory
                if actor.kv_cache_gib is None
                else need.with_margin(needs.actor.weights / tp) + actor.kv_cache_gib * GIB
            )
            loads.setdefault(index, []).append((f"actor {actor_id}", taken))
    return loads


def check_memory_fit(
    config: PipelineConfig, needs: Needs, gpus: Gpus, where: Layout, available: float
) -> Check:
    """The roles' memory against this machine's: host memory for the roles on CPU (and every process's
    footprint, and the offloaded optimizer), each GPU for the roles placed on it."""
    if config.cluster.placement == "pools":
        return Check(
            SECTION,
            "memory fit",
            "SKIP",
            f"pools: the stages run on pool nodes; a trainer rank needs "
            f"{need.size(need.with_margin(needs.rank.total))}, an actor "
            f"{need.size(need.with_margin(needs.actor.total))} (with the margins)",
        )
    if where.error is not None:
        return Check(SECTION, "memory fit", "SKIP", "the roles have no place on this machine (GPUs per role)")
    trainer, actor = config.trainer, config.actor
    footprint = need.PROCESS_FOOTPRINT_GIB * GIB
    rank_host = (needs.rank.host + footprint) if where.trainer_on_cuda else need.with_margin(needs.rank.total)
    actor_host = (
        actor.tensor_parallel_size * footprint if where.actors_on_gpu else need.with_margin(needs.actor.total)
    )
    host = trainer.num_processes * rank_host + actor.num_actors * actor_host + footprint
    host_status = need.fit(host, available)
    lines = [
        f"host: {need.size(host)} of {need.size(available)} available ({trainer.num_processes} trainer "
        f"rank(s) x {need.size(rank_host)}, {actor.num_actors} actor(s) x {need.size(actor_host)}, "
        f"preprocessor {need.size(footprint)}; model state x{need.ACTIVATION_MARGIN} + "
        f"{need.PROCESS_FOOTPRINT_GIB:g} GiB per process)"
    ]
    statuses: list[Status] = [host_status]
    data: dict[str, Any] = {"host_need_bytes": host, "host_available_bytes": available, "gpus": {}}
    fitting: list[tuple[float, str]] = []  # (share of the GPU, its line): summed up in one line
    for index, loads in sorted(_gpu_loads(config, needs, gpus, where).items()):
        total, memory, gpu = sum(taken for _, taken in loads), gpus.memory[index], gpus.ids[index]
        names = ", ".join(name for name, _ in loads)
        data["gpus"][gpu] = {"need_bytes": total, "memory_bytes": memory, "roles": names}
        if memory is None:
            lines.append(f"GPU {gpu} needs {need.size(total)} ({names}), its memory unknown")
            continue
        line = f"GPU {gpu} needs {need.size(total)}, has {need.size(memory)} ({names})"
        statuses.append(gpu_fit := need.fit(total, memory, need.GPU_WARN_SHARE))
        if gpu_fit == "PASS":
            fitting.append((total / memory, line))
        else:
            lines.append(line)
        if actor.kv_cache_gib is None and any(name.startswith("actor") for name, _ in loads):
            weights = need.with_margin(needs.actor.weights / actor.tensor_parallel_size)
            if weights > actor.gpu_memory_utilization * memory:
                statuses.append("FAIL")
                lines.append(
                    f"actor.gpu_memory_utilization={actor.gpu_memory_utilization} of GPU {gpu} "
                    f"({need.size(actor.gpu_memory_utilization * memory)}) cannot hold the actor's weights "
                    f"({need.size(weights)})"
                )
    if len(fitting) == 1:
        lines.append(fitting[0][1])
    elif fitting:
        lines.append(f"{len(fitting)} GPUs fit, the fullest: {max(fitting)[1]}")
    status: Status = "FAIL" if "FAIL" in statuses else "WARN" if "WARN" in statuses else "PASS"
    fix = ""
    if status != "PASS":
        room = "free host memory (stop other programs)" if host_status != "PASS" else ""
        fix = "; ".join(filter(None, [room, MEMORY_FIX]))
    return Check(SECTION, "memory fit", status, "; ".join(lines), fix, data)


def config_checks(
    config: PipelineConfig,
    model: ModelFacts | BaseException,
    torch: dict[str, Any],
    smi: dict[str, Any] | None,
    environ: Mapping[str, str] | None = None,
    available: float | None = None,
) -> list[Check]:
    """The config section: ``model`` is ``model_facts``'s answer (or what it raised); ``torch``, ``smi``,
    ``environ`` and ``available`` (host bytes) stand in for this machine in tests."""
    import psutil  # noqa: PLC0415 (only when the check runs)

    environ = os.environ if environ is None else environ
    available = float(psutil.virtual_memory().available) if available is None else available
    gpus = visible(torch, smi, environ)
    where = layout(config, gpus)
    checks = [check_model(model), check_gpus(config, gpus, where)]
    if isinstance(model, BaseException):
        skipped = "needs the model's shape (see model)"
        return checks + [
            Check(SECTION, "memory per role", "SKIP", skipped),
            Check(SECTION, "memory fit", "SKIP", skipped),
        ]
    needs = role_needs(config, model.shape, gpus, where)
    return checks + [
        check_role_memory(config, needs, where),
        check_memory_fit(config, needs, gpus, where, available),
    ]
