"""The engine benchmark's measurements: continuous batching (with and without in-flight updates)
and the static ``generate`` baseline, each returning what it generated and how long it took."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import torch
from transformers import GenerationConfig

from pipelinerl.bench.engine_factories import UpdateTiming, WeightSender
from pipelinerl.bench.engine_workload import PERTURBATION_SCALE, Workload
from pipelinerl.workers.engines.protocol import iter_named_parameters
from pipelinerl.workers.staged_weights import StagedWeights

if TYPE_CHECKING:
    from pipelinerl.workers.engines.protocol import Engine


@dataclass
class GenerationStats:
    """What one measurement generated and how long it took."""

    sequences: int = 0
    useful_tokens: int = 0  # completion tokens up to and including each sequence's EOS
    raw_tokens: int = 0  # token slots computed, padding included (= useful for the engine)
    finished: int = 0  # sequences that ended with EOS
    wall_s: float = 0.0
    # The sequences in flight integrated over the wall time (run_continuous): over wall_s, how many the
    # engine held on average, below H by the refills in whole groups and the drain at the end.
    occupied_s: float = 0.0
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
    def mean_in_flight(self) -> float:
        return self.occupied_s / self.wall_s if self.wall_s else 0.0

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
            "mean_in_flight": self.mean_in_flight,
        }


class WeightUpdates:
    """Two full state dicts, loaded in turn: the model's weights perturbed, and the weights themselves."""

    def __init__(self, model: torch.nn.Module, seed: int) -> None:
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

    Wall time runs from the first submit to the last completion. ``updates`` are loaded by a second
    thread, as the actor's weight receiver does (through ``sender`` for an engine whose workers
    receive them over a weight group), while this thread keeps polling and refilling: the first as
    soon as the first decode step has run (sequences are in flight), then every ``update_interval_s``.
    Starting on progress rather than on the clock means every run with updates measures at least one,
    however fast the engine finishes the workload.
    """
    if updates is not None and not update_interval_s:
        raise ValueError("update_interval_s must be positive when updates are given")
    groups = iter(list(workload.groups()))
    stats = GenerationStats()
    done, generating = threading.Event(), threading.Event()
    updater = None
    if updates is not None and update_interval_s:
        updater = threading.Thread(
            target=_update_every,
            args=(lambda: updates.apply(engine, sender), update_interval_s, generating, done, stats),
            name="bench-updates",
        )
    started, cpu_started = time.perf_counter(), process_tree_cpu_s()
    since = started
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
            held = engine.num_in_flight
            completed = engine.poll(timeout_s=0.02)
            now = time.perf_counter()
            stats.occupied_s += held * (now - since)  # held from the last refill until this poll ended
            since = now
            if engine.num_in_flight:
                generating.set()
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
    update: Callable[[], UpdateTiming],
    interval_s: float,
    generating: threading.Event,
    done: threading.Event,
    stats: GenerationStats,
) -> None:
    """Once ``generating`` is set, ``update()`` at once and then every ``interval_s`` until ``done``;
    record each pause, stall and phases."""
    while not (generating.wait(0.01) or done.is_set()):
        pass
    while not done.is_set():
        timing = update()
        stats.pauses_ms.append(1000 * timing.pause_s)
        stats.stalls_ms.append(1000 * timing.stall_s)
        if timing.phases_ms:
            stats.phases_ms.append(timing.phases_ms)
        if done.wait(interval_s):
            break


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
