"""Supervised warm-start of the tiny default policy, cached on disk.

RL from a random model never sees a reward, so the default run starts from a tiny causal LM
(built from a config, no download) that a short supervised phase has taught the task's format
and part of its skill. The phase is sized so that RL starts from a held-out greedy success well
inside (0, 1) and has room to improve: training stops once a teacher-forced check says the task
is partly learned (``target_success``), because the skill appears abruptly at a step that moves
with the seed and the thread count. Stopping just past that jump matters: RL then gained 14 to
25 points within 60 to 80 steps, while a model stopped before it (one that solved only one- and
two-digit sums) gained 1 to 3.

Prompt format (what the actor must feed the policy): the token ids of ``<bos>`` followed by the
characters of ``problem.prompt``, i.e. ``encode_prompt(tokenizer, problem.prompt)``. The policy
then writes ``task.reference_completion``-style text and ends it with ``<eos>``; decode the
generated ids with ``skip_special_tokens=True`` before ``task.verify``.

Cache: ``ensure_warm_start`` writes a Hugging Face directory (model, tokenizer, ``warmstart.json``)
under ``cache_dir/<task>-<preset>-<hash>``, where the hash covers every setting,
``WARM_START_VERSION`` and a sample of the task's problems and reference solutions. The
directory is built under a temporary name and renamed into place, so a crash never leaves a
half-written cache; a complete directory is reused as is.

Simplifications: one process, plain ``torch.optim.AdamW``, no dropout, fp32, the data order and
the initial weights fixed by ``seed`` (thread counts change the float rounding, hence the exact
stopping step, not the kind of model).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from filelock import FileLock, Timeout
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from transformers import (
    GenerationMixin,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from pipelinerl.tasks import Problem, Task, get_task
from pipelinerl.tasks.base import reference_completion, safe_score
from pipelinerl.tasks.prompting import PromptFormat, encode_problem, eos_token_ids, pad_token_id
from pipelinerl.tasks.tokenizer import build_tokenizer, encode_completion, encode_prompt

logger = logging.getLogger(__name__)

# Bump when a change to the task, tokenizer, model or training loop changes the weights produced,
# so stale caches are not reused.
WARM_START_VERSION = 3
METADATA_FILE = "warmstart.json"

# (hidden size, MLP size, layers, heads): a Llama-style decoder with tied embeddings.
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (128, 512, 4, 4),
    "small": (256, 1024, 4, 4),
}
# Longest prompt plus completion of the shipped tasks is about 100 tokens; leave room for RL.
MAX_POSITIONS = 256


@dataclass(frozen=True)
class WarmStartSettings:
    """Everything that determines the warm-start weights (all of it enters the cache key)."""

    task_name: str = "arithmetic"
    # The task's options (task.options), e.g. a reasoning-gym generator and its parameters.
    task_options: dict[str, Any] = field(default_factory=dict)
    seed: int = 0
    preset: str = "tiny"
    # Training stops at the first check where the teacher-forced exact match reaches this, or
    # after ``max_steps``. A fixed step count is fragile: the skill appears abruptly (success
    # went from 4 % to 42 % within 100 steps) at a step that moves with seed and thread count.
    target_success: float = 0.35
    max_steps: int = 600
    check_every: int = 10
    check_problems: int = 128
    # 32 reached the target in ~20 % more steps than 64 at half the cost per step.
    batch_size: int = 32
    # Each batch is split by length into this many micro-batches whose token losses are summed:
    # the gradient is the whole batch's, but less compute goes to padding (batches stay mixed,
    # since length-homogeneous batches learned more slowly per step).
    micro_batches: int = 4
    learning_rate: float = 2e-3
    warmup_steps: int = 30
    eval_problems: int = 200
    max_new_tokens: int = 80
    # Longest prompt plus completion the model is built for (the shipped math set needs about 400).
    max_positions: int = MAX_POSITIONS

    def task(self) -> Task:
        return get_task(self.task_name, **self.task_options)

    def cache_key(self) -> str:
        """Hash of the settings, ``WARM_START_VERSION`` and a sample of the task's data.

        The sample makes a change to the task's prompts or reference solutions a new key even
        when nobody remembered to bump the version.
        """
        task = self.task()
        sample = [
            (problem.prompt, reference_completion(task, problem), problem.answer)
            for split in ("train", "eval")
            for problem in task.problems(split, 16, self.seed)
        ]
        settings = asdict(self)
        # Settings added later enter the key only when changed, so the caches made before stay valid.
        for name, default in (("task_options", {}), ("max_positions", MAX_POSITIONS)):
            if settings[name] == default:
                del settings[name]
        payload = json.dumps(
            {"version": WARM_START_VERSION, "task_sample": sample, **settings}, sort_keys=True
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_tiny_model(
    tokenizer: PreTrainedTokenizerBase, preset: str = "tiny", max_positions: int = MAX_POSITIONS
) -> PreTrainedModel:
    """A freshly initialised fp32 Llama-style causal LM sized by ``preset`` (see ``PRESETS``)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    hidden, mlp, layers, heads = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=mlp,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )
    return LlamaForCausalLM(config).float()


@torch.no_grad()
def evaluate_success(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: list[Problem],
    max_new_tokens: int,
    batch_size: int = 64,
    prompt: PromptFormat | None = None,
    eos_ids: list[int] | None = None,
) -> float:
    """Greedy held-out success rate: the share of ``problems`` whose completion is scored ``correct``
    (a task's partial credit, such as reasoning-gym's for a near miss, does not count as success).

    Prompts are built as the actor builds them (``prompt``: plain text by default); generation stops
    at any of ``eos_ids`` (default: the tokenizer's) and the completion at the task's first stop string.
    """
    if not problems:
        raise ValueError("evaluate_success needs at least one problem")
    if not isinstance(model, GenerationMixin):  # transformers 5: causal-LM classes generate, not every model
        raise TypeError(f"evaluate_success needs a model that generates, got {type(model).__name__}")
    was_training = model.training
    model.eval()
    pad_id = pad_token_id(tokenizer)
    eos = eos_ids or eos_token_ids(tokenizer)
    prompt = prompt or PromptFormat(None)
    total = 0.0
    try:
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            prompts = [encode_problem(tokenizer, problem, prompt) for problem in chunk]
            width = max(len(ids) for ids in prompts)
            # Left padding keeps every prompt's last token in the last column, where generation starts.
            input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in prompts])
            attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in prompts])
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=eos,
            )
            for problem, generated in zip(chunk, output[:, width:].tolist(), strict=True):
                completion = tokenizer.decode(_until_eos(generated, eos), skip_special_tokens=True)
                assert isinstance(completion, str)  # one sequence decodes to one string
                score = safe_score(task, problem, _until_stop(completion, task.stop_strings))
                total += score.label == "correct"
    finally:
        model.train(was_training)
    return total / len(problems)


def _until_eos(token_ids: list[int], eos_ids: list[int]) -> list[int]:
    ends = [index for index, token in enumerate(token_ids) if token in eos_ids]
    return token_ids[: ends[0]] if ends else token_ids


def _until_stop(text: str, stop_strings: tuple[str, ...]) -> str:
    """``text`` up to and including its first stop string (the actor cuts completions the same way)."""
    ends = [text.index(stop) + len(stop) for stop in stop_strings if stop in text]
    return text[: min(ends)] if ends else text


Example = tuple[list[int], list[int]]
Batch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _examples(task: Task, tokenizer: PreTrainedTokenizerBase, problems: list[Problem]) -> list[Example]:
    """(input ids, labels) per problem: the prompt, then the reference completion and ``<eos>``.

    Labels are -100 on the prompt, so the loss covers the completion tokens only.
    """
    examples = []
    for problem in problems:
        prompt = encode_prompt(tokenizer, problem.prompt)
        completion = encode_completion(tokenizer, reference_completion(task, problem))
        examples.append((prompt + completion, [-100] * len(prompt) + completion))
    return examples


def _collate(examples: list[Example], pad_id: int) -> Batch:
    """Right-padded (input_ids, attention_mask, labels)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in examples])
    attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in examples])
    labels = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in examples])
    return input_ids, attention_mask, labels


def _training_batches(examples: list[Example], settings: WarmStartSettings, pad_id: int) -> list[list[Batch]]:
    """Per optimizer step, its batch as length-sorted micro-batches (see ``micro_batches``)."""
    steps = []
    for start in range(0, len(examples), settings.batch_size):
        batch = sorted(examples[start : start + settings.batch_size], key=lambda example: len(example[0]))
        size = math.ceil(len(batch) / settings.micro_batches)
        steps.append([_collate(batch[i : i + size], pad_id) for i in range(0, len(batch), size)])
    return steps


def _completion_tokens(labels: torch.Tensor) -> int:
    # The causal LM loss predicts labels[:, 1:], so the first column never counts.
    return int((labels[:, 1:] != -100).sum())


def _accumulate_step_loss(model: PreTrainedModel, micro_batches: list[Batch]) -> float:
    """Backpropagate the mean token loss of the whole step; returns that loss."""
    total_tokens = sum(_completion_tokens(labels) for _, _, labels in micro_batches)
    step_loss = 0.0
    for input_ids, attention_mask, labels in micro_batches:
        # Re-weight each micro-batch's mean by its share of the step's completion tokens.
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
        loss = loss * (_completion_tokens(labels) / total_tokens)
        loss.backward()
        step_loss += loss.item()
    return step_loss


@torch.no_grad()
def teacher_forced_exact_match(model: PreTrainedModel, batch: Batch) -> float:
    """Fraction of sequences whose every completion token is the model's argmax given the prefix.

    For a task with one deterministic reference solution this equals greedy success (up to the
    rare right answer reached by wrong steps) at the cost of a single forward pass.
    """
    input_ids, attention_mask, labels = batch
    was_training = model.training
    model.eval()
    try:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1]
    finally:
        model.train(was_training)
    targets = labels[:, 1:]
    correct = (logits.argmax(dim=-1) == targets) | (targets == -100)
    return correct.all(dim=1).float().mean().item()


def train_warm_start(settings: WarmStartSettings, console: Any = None) -> tuple[PreTrainedModel, Any, dict]:
    """Build the model and fine-tune it on reference completions; returns (model, tokenizer, metadata)."""
    task = settings.task()
    tokenizer = build_tokenizer()
    pad_id = tokenizer.pad_token_id
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        model = build_tiny_model(tokenizer, settings.preset, settings.max_positions)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate, betas=(0.9, 0.98), weight_decay=0.01
    )
    # Linear warm-up, then constant: a decaying rate slowed the short run down.
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / settings.warmup_steps)
    )
    train_problems = task.problems("train", settings.max_steps * settings.batch_size, settings.seed)
    batches = _training_batches(_examples(task, tokenizer, train_problems), settings, pad_id)
    # Checks use train-split problems from another stream, so the eval split stays untouched.
    check_problems = task.problems("train", settings.check_problems, settings.seed + 1)
    check_batch = _collate(_examples(task, tokenizer, check_problems), pad_id)
    check_success = 0.0
    steps_done = 0
    started = time.perf_counter()
    with _Progress(console, settings.max_steps, "warm-start (supervised)") as progress:
        for micro_batches in batches:
            loss = _accumulate_step_loss(model, micro_batches)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            steps_done += 1
            if steps_done % settings.check_every == 0:
                check_success = teacher_forced_exact_match(model, check_batch)
            progress.advance(steps_done, loss, check_success)
            if check_success >= settings.target_success:
                break
    train_seconds = time.perf_counter() - started
    eval_problems = task.problems("eval", settings.eval_problems, settings.seed)
    success = evaluate_success(model, tokenizer, task, eval_problems, settings.max_new_tokens)
    metadata = {
        "version": WARM_START_VERSION,
        "settings": asdict(settings),
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "sft_steps": steps_done,
        "train_seconds": round(train_seconds, 2),
        "torch_threads": torch.get_num_threads(),
        "final_loss": round(loss, 4),
        "check_success": check_success,
        "eval_success": success,
        "eval_sample_size": len(eval_problems),
    }
    return model, tokenizer, metadata


def warm_start_dir(cache_dir: Path, settings: WarmStartSettings) -> Path:
    """Where the warm start for ``settings`` lives in ``cache_dir`` (complete once it holds metadata)."""
    label = settings.task_name.replace(":", "-").replace(".", "-")  # a user's 'package.module:Class'
    return Path(cache_dir) / f"{label}-{settings.preset}-{settings.cache_key()}"


def warm_start_lock(target: Path) -> Path:
    """The lock file held by the one process that trains ``target``."""
    return target.parent / f".{target.name}.lock"


def ensure_warm_start(
    cache_dir: Path,
    task_name: str = "arithmetic",
    seed: int = 0,
    console: Any = None,
    *,
    max_steps: int = WarmStartSettings.max_steps,
    eval_problems: int = WarmStartSettings.eval_problems,
    **overrides: Any,
) -> Path:
    """The warm-started model directory for these settings, trained now unless already cached.

    ``console`` is an optional ``rich.console.Console`` for a progress bar; without it, progress
    goes to this module's logger. ``max_steps`` and ``eval_problems`` make tests fast; other
    ``WarmStartSettings`` fields can be overridden by name.
    """
    settings = WarmStartSettings(
        task_name=task_name, seed=seed, max_steps=max_steps, eval_problems=eval_problems, **overrides
    )
    cache_dir = Path(cache_dir)
    target = warm_start_dir(cache_dir, settings)
    if (target / METADATA_FILE).is_file():
        _report(console, f"warm-start: reusing {target}")
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    # One process trains a given warm start; others (parallel test workers, a second `make run`)
    # wait for it and reuse its result instead of training the same model again.
    lock = FileLock(warm_start_lock(target))
    try:
        held = lock.acquire(timeout=1)
    except Timeout:
        _report(console, f"warm-start: another process is training {target.name}; waiting for it")
        held = lock.acquire()
    with held:
        if (target / METADATA_FILE).is_file():
            _report(console, f"warm-start: reusing {target}")
            return target
        _train_into(target, settings, console)
    return target


def _train_into(target: Path, settings: WarmStartSettings, console: Any) -> None:
    """Train the warm start and move it to ``target`` in one rename (never half-written)."""
    cache_dir = target.parent
    model, tokenizer, metadata = train_warm_start(settings, console)
    staging = cache_dir / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        # Written last: its presence marks the directory complete.
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
        if target.exists() and not (target / METADATA_FILE).is_file():
            shutil.rmtree(target)  # left incomplete by a crash: replaced, never reused
        try:
            staging.rename(target)
        except OSError:
            # Another process finished the same warm start first; its copy is equivalent.
            if not (target / METADATA_FILE).is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    _report(
        console,
        f"warm-start: held-out greedy success {metadata['eval_success']:.1%} "
        f"on {metadata['eval_sample_size']} problems after {metadata['train_seconds']:.0f} s; "
        f"saved to {target}",
    )


def _report(console: Any, message: str) -> None:
    if console is not None:
        console.print(message)
    else:
        logger.info(message)


class _Progress:
    """A rich progress bar on ``console`` if given, else a log line every tenth of the run."""

    def __init__(self, console: Any, total: int, description: str) -> None:
        self.console, self.total, self.description = console, total, description
        self.every = max(1, total // 10)

    def __enter__(self) -> _Progress:
        if self.console is not None:
            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("step {task.completed}/{task.total} loss {task.fields[loss]:.3f}"),
                TextColumn("exact {task.fields[check]:.0%}"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.bar.start()
            self.task_id = self.bar.add_task(self.description, total=self.total, loss=float("nan"), check=0.0)
        return self

    def advance(self, step: int, loss: float, check: float) -> None:
        if self.console is not None:
            self.bar.update(self.task_id, completed=step, loss=loss, check=check)
        elif step % self.every == 0 or step == self.total:
            logger.info(
                "%s: step %d/%d loss %.3f exact match %.2f", self.description, step, self.total, loss, check
            )

    def __exit__(self, *exc_info: object) -> None:
        if self.console is not None:
            self.bar.stop()
