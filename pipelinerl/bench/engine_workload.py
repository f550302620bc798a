"""The engine benchmark's settings and workload: the embedded task's prompts in the actor's order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pipelinerl.tasks import get_task
from pipelinerl.tasks.tokenizer import encode_prompt
from pipelinerl.workers.prompt_stream import prompt_stream

if TYPE_CHECKING:
    pass

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
