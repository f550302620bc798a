"""``pipelinerl bench engine``: continuous batching against static batches, and the in-flight update pause.

Run: ``pipelinerl bench engine [--engine transformers] [--in-flight 32] [--quick]``; writes
``docs/benchmarks/engine.json``.

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

Each repeat runs static, continuous and continuous-with-updates back to back; a ratio is the median
over repeats of one run's rate over its neighbour's (a shared machine's load drifts between repeats,
neighbours see about the same), and rates are medians over repeats.

Engine-agnostic: measurements use only the ``Engine`` protocol; ``ENGINES`` maps an ``--engine``
name to a factory. ``vllm`` runs vLLM's async engine (in ``.venv-vllm``, where the CLI re-runs the
command) and sends every update over a real gloo weight group from this process, as the trainer
does in a run; its stall is the time from the engine paused (after its step in progress) to
resumed, receiving the tensors included. The static baseline is always transformers' ``generate``
on the same weights.
"""

from __future__ import annotations

import json
import statistics
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
    engine: str = "transformers"
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
    kv_cache_on_update: str = "keep"  # vllm: keep the in-flight KV cache, or recompute it

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

# (pause, stall) in seconds of one in-flight update of ``engine`` to ``staged``'s weights.
WeightSender = Callable[["Engine", "StagedWeights"], tuple[float, float]]
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
    if settings.kv_cache_on_update != "keep":
        raise ValueError(
            "the transformers engine keeps its KV cache across updates; --kv-cache-on-update is vllm's"
        )
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
        kv_cache_on_update=settings.kv_cache_on_update,  # type: ignore[arg-type]
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
        self.phases_ms: list[dict[str, float]] = []  # per update: pause / load / label_resume
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

    def __call__(self, engine: Engine, staged: StagedWeights) -> tuple[float, float]:
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
        self.phases_ms.append(
            {
                **{name: 1000 * seconds for name, seconds in phases.items()},
                "load_in_worker": 1000 * in_worker[0],
            }
        )
        # Generation stops once the step in progress ends; from then on it waits for the tensors.
        return pause, phases["load"] + phases["label_resume"]

    def _broadcast(self, tensors: list[torch.Tensor]) -> None:
        self._group.broadcast(tensors)


# name -> factory(model_path, workload, in_flight, seed, threads)
ENGINES: dict[str, EngineFactory] = {"transformers": _transformers_engine, "vllm": _vllm_engine}


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
    """Full state dicts to load in turn: the model's weights, and the same weights perturbed."""

    def __init__(self, model: torch.nn.Module, seed: int, sender: WeightSender | None = None) -> None:
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
        self.loaded = 0
        self.sender = sender

    def apply(self, engine: Engine) -> tuple[float, float]:
        """Load the next state into ``engine`` in flight, as the actor does.

        Returns (pause, stall) in seconds: what ``update_weights`` reports, and the part of it after
        the loop parked (the load runs parked, so its start marks the park).
        """
        staged = self.sets[self.loaded % len(self.sets)]
        self.loaded += 1
        if self.sender is not None:  # the engine's workers receive over the weight group
            return self.sender(engine, staged)
        load_started: list[float] = []

        def load(model: torch.nn.Module) -> None:
            load_started.append(time.perf_counter())
            staged.load_into(model)

        pause = engine.update_weights(engine.policy_version + 1, load)
        resumed = time.perf_counter()
        return pause, resumed - load_started[0]


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
    update_interval_s: float | None = None,
    on_progress: Callable[[int], None] | None = None,
) -> GenerationStats:
    """Generate the workload with up to ``in_flight`` sequences, refilling whole groups like the actor.

    Wall time runs from the first submit to the last completion. ``updates`` are loaded every
    ``update_interval_s`` from the start by a second thread, as the actor's weight receiver does,
    while this thread keeps polling and refilling.
    """
    if updates is not None and not update_interval_s:
        raise ValueError("update_interval_s must be positive when updates are given")
    groups = iter(list(workload.groups()))
    stats = GenerationStats()
    done = threading.Event()
    updater = None
    if updates is not None and update_interval_s:
        updater = threading.Thread(
            target=_update_every, args=(engine, updates, update_interval_s, done, stats), name="bench-updates"
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
    engine: Engine, updates: WeightUpdates, interval_s: float, done: threading.Event, stats: GenerationStats
) -> None:
    """Load the next state every ``interval_s`` until ``done``; record each pause and stall."""
    while not done.wait(interval_s):
        pause, stall = updates.apply(engine)
        stats.pauses_ms.append(1000 * pause)
        stats.stalls_ms.append(1000 * stall)


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


def paired_ratio(numerators: list[GenerationStats], denominators: list[GenerationStats], rate: str) -> float:
    """Median over repeats of run r's ``rate`` over its neighbour's: a shared machine's load drifts
    between repeats, and neighbours in time see about the same load."""
    ratios = [
        getattr(numerator, rate) / getattr(denominator, rate)
        for numerator, denominator in zip(numerators, denominators, strict=True)
        if getattr(denominator, rate)
    ]
    return statistics.median(ratios) if ratios else float("nan")


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q)) if values else float("nan")


def _progress_task(
    progress: Progress | None, description: str, total: float | None
) -> Callable[[int], None] | None:
    if progress is None:
        return None
    task = progress.add_task(description, total=total)
    return lambda advance: progress.advance(task, advance)


def run_engine_bench(
    model_path: Path, settings: EngineBenchSettings, progress: Progress | None = None
) -> dict[str, Any]:
    """All three measurements; returns the headline numbers, details and notes for the record."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    if settings.engine not in ENGINES:
        raise ValueError(f"unknown engine {settings.engine!r}; valid: {', '.join(sorted(ENGINES))}")
    transformers_logging.disable_progress_bar()  # the benchmark's own progress bars say enough
    torch.set_num_threads(settings.threads)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    workload = build_workload(tokenizer, settings)
    baseline_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    warmup = Workload(**{**asdict(workload), "prompts": workload.prompts[: settings.in_flight]})

    factory = ENGINES[settings.engine]
    engine, sender = factory(model_path, workload, settings)
    updates = WeightUpdates(baseline_model, settings.seed, sender)
    continuous_runs: list[GenerationStats] = []
    static_runs: list[GenerationStats] = []
    update_runs: list[GenerationStats] = []
    in_flight = settings.in_flight
    try:
        # One untimed pass each first: lazy initialisation (kernels, caches) is not throughput.
        run_continuous(engine, warmup, in_flight)
        run_static(baseline_model, warmup, in_flight, settings.seed)
        for repeat in range(settings.repeats):
            # static, continuous, continuous with updates: each ratio compares neighbours in time.
            label = f"({repeat + 1}/{settings.repeats})"
            total = workload.num_sequences
            static_runs.append(
                run_static(
                    baseline_model,
                    workload,
                    in_flight,
                    settings.seed + repeat,
                    on_progress=_progress_task(
                        progress, f"static generate, batch {in_flight} {label}", total
                    ),
                )
            )
            continuous_runs.append(
                run_continuous(
                    engine,
                    workload,
                    in_flight,
                    on_progress=_progress_task(progress, f"continuous, H = {in_flight} {label}", total),
                )
            )
            update_runs.append(
                run_continuous(
                    engine,
                    workload,
                    in_flight,
                    updates=updates,
                    update_interval_s=settings.update_interval_s,
                    on_progress=_progress_task(progress, f"continuous + in-flight updates {label}", total),
                )
            )
    finally:
        engine.close()

    pauses = [pause for run in update_runs for pause in run.pauses_ms]
    stalls = [stall for run in update_runs for stall in run.stalls_ms]
    update_wall_s = sum(run.wall_s for run in update_runs)
    static_padding = 1 - sum(run.useful_tokens for run in static_runs) / max(
        1, sum(run.raw_tokens for run in static_runs)
    )
    headline = {
        "continuous_over_static_ratio": paired_ratio(continuous_runs, static_runs, "useful_tokens_per_s"),
        # No update within the runs (an interval longer than a run) measures nothing: null, not 0.
        "update_pause_fraction": sum(stalls) / 1000 / update_wall_s if stalls else float("nan"),
        "update_pause_ms_median": percentile(pauses, 50),
        "update_pause_ms_p99": percentile(pauses, 99),
        "update_stall_ms_median": percentile(stalls, 50),
        "update_stall_ms_p99": percentile(stalls, 99),
        "update_pause_fraction_upper_bound": sum(pauses) / 1000 / update_wall_s if pauses else float("nan"),
        "continuous_over_static_ratio_per_cpu_s": paired_ratio(
            continuous_runs, static_runs, "useful_tokens_per_cpu_s"
        ),
        "tokens_per_s_with_updates_over_without": paired_ratio(
            update_runs, continuous_runs, "useful_tokens_per_s"
        ),
        "tokens_per_cpu_s_with_updates_over_without": paired_ratio(
            update_runs, continuous_runs, "useful_tokens_per_cpu_s"
        ),
        "continuous_tokens_per_s": statistics.median(run.useful_tokens_per_s for run in continuous_runs),
        "continuous_sequences_per_s": statistics.median(run.sequences_per_s for run in continuous_runs),
        "static_useful_tokens_per_s": statistics.median(run.useful_tokens_per_s for run in static_runs),
        "static_raw_tokens_per_s": statistics.median(run.raw_tokens_per_s for run in static_runs),
        "static_padding_fraction": static_padding,
    }
    details = {
        "continuous_runs": [run.summary() for run in continuous_runs],
        "static_runs": [run.summary() for run in static_runs],
        "update_runs": [run.summary() for run in update_runs],
        "updates": {
            "count": len(pauses),
            "interval_s": settings.update_interval_s,
            "interval_source": settings.update_interval_source,
            "wall_s": round(update_wall_s, 3),
            "pause_ms_mean": float(np.mean(pauses)) if pauses else float("nan"),
            "pause_ms_max": max(pauses, default=float("nan")),
            "stall_ms_mean": float(np.mean(stalls)) if stalls else float("nan"),
            "stall_ms_max": max(stalls, default=float("nan")),
            "pauses_ms": [round(pause, 3) for pause in pauses],
            "stalls_ms": [round(stall, 3) for stall in stalls],
            # vllm: median of each phase (waiting for the step in progress, receive + load, relabel +
            # resume) and of the receive + load time inside the worker (the rest of "load" is the RPC)
            "phases_ms_median": _phase_medians(sender),
            "parameters_per_update": updates.parameters,
            "bytes_per_update": updates.bytes_per_update,
        },
        "workload": {
            "sequences": workload.num_sequences,
            "prompts": settings.num_prompts,
            "group_size": workload.group_size,
            "max_new_tokens": workload.max_new_tokens,
            "max_prompt_tokens": workload.max_prompt_tokens,
            "temperature": workload.temperature,
        },
        "model": {"path": str(model_path), "parameters": updates.parameters},
    }
    notes = [
        "continuous: the engine keeps up to H in flight and refills a whole group of G when there is "
        "room (the actor's policy); tokens/s = completion tokens (EOS included) / time to finish all N.",
        "static: model.generate on consecutive batches of H of the same prompts, same sampling "
        "(temperature, no top-k/top-p), behaviour log-probs computed from the processed scores; "
        "useful tokens stop at each sequence's first EOS, raw tokens include padding.",
        f"updates: one full-state load every {settings.update_interval_s:.3f} s "
        f"({settings.update_interval_source}) while the workload runs again, as in a pipeline run "
        "where the trainer publishes after every optimizer step. pause = update_weights from the "
        "request to resuming (the actor's weights/update_pause_ms; it includes finishing the current "
        "decode step, whose tokens are not lost); stall = the loop parked (load start to resuming). "
        "update_pause_fraction = sum of stalls / wall time of those runs; "
        "update_pause_fraction_upper_bound uses the pauses instead.",
    ]
    return {"headline": headline, "details": details, "notes": notes}


def _phase_medians(sender: WeightSender | None) -> dict[str, float] | None:
    phases = getattr(sender, "phases_ms", None)
    if not phases:
        return None
    return {name: statistics.median(update[name] for update in phases) for name in phases[0]}


def render_engine_table(record: dict[str, Any]) -> str:
    from pipelinerl.workers.bench.report import markdown_table

    updates = record["updates"]
    targets = record["targets"]
    in_flight = record["settings"]["in_flight"]
    rows = [
        [f"continuous batching, H = {in_flight} (tokens/s)", record["continuous_tokens_per_s"], ""],
        [f"static `generate`, batch {in_flight}: useful tokens/s", record["static_useful_tokens_per_s"], ""],
        [f"static `generate`, batch {in_flight}: raw tokens/s", record["static_raw_tokens_per_s"], ""],
        ["static padding fraction", record["static_padding_fraction"], ""],
        [
            "continuous / static (useful tokens/s)",
            record["continuous_over_static_ratio"],
            _target_text(targets["continuous_over_static_ratio"]),
        ],
        [
            "the same per CPU second (this process and its children)",
            record["continuous_over_static_ratio_per_cpu_s"],
            "",
        ],
        [
            "in-flight update pause (request to resume), median / p99 (ms)",
            _pair(record, "update_pause_ms"),
            "",
        ],
        [
            "generation loop stalled (parked to resume), median / p99 (ms)",
            _pair(record, "update_stall_ms"),
            "",
        ],
        [
            f"update pause fraction: stalls / actor time ({updates['count']} updates, one per "
            f"{updates['interval_s']:.2f} s)",
            record["update_pause_fraction"],
            _target_text(targets["update_pause_fraction"]),
        ],
        ["the same with whole pauses (upper bound)", record["update_pause_fraction_upper_bound"], ""],
        ["tokens/s with updates / without", record["tokens_per_s_with_updates_over_without"], ""],
        ["the same per CPU second", record["tokens_per_cpu_s_with_updates_over_without"], ""],
    ]
    return markdown_table(["measure", "value", "target"], rows)


def _pair(record: dict[str, Any], prefix: str) -> str:
    from pipelinerl.workers.bench.report import format_value

    return f"{format_value(record[prefix + '_median'])} / {format_value(record[prefix + '_p99'])}"


def _target_text(target: dict[str, Any]) -> str:
    bound = f"≥ {target['at_least']:g}" if "at_least" in target else f"< {target['below']:g}"
    verdict = {True: "met", False: "not met", None: "no value"}[target["met"]]
    return f"{bound}: {verdict}"
