"""Supervised warm-start of the tiny default policy, cached on disk.

RL from a random model never sees a reward, so the default run starts from a tiny causal LM
(built from a config, no download) that a short supervised phase has taught the task's format
and part of its skill. The phase is sized so that RL starts from a held-out greedy success well
inside (0, 1) and has room to improve.

Prompt format (what the actor must feed the policy): the token ids of ``<bos>`` followed by the
characters of ``problem.prompt``, i.e. ``encode_prompt(tokenizer, problem.prompt)``. The policy
then writes ``task.reference_completion``-style text and ends it with ``<eos>``; decode the
generated ids with ``skip_special_tokens=True`` before ``task.verify``.

Cache: ``ensure_warm_start`` writes a Hugging Face directory (model, tokenizer, ``warmstart.json``)
under ``cache_dir/<task>-<preset>-<hash>``, where the hash covers every setting and
``WARM_START_VERSION``. The directory is built under a temporary name and renamed into place, so
a crash never leaves a half-written cache; a complete directory is reused as is.

Simplifications: one process, plain ``torch.optim.AdamW``, no dropout, fp32, the data order and
the initial weights fixed by ``seed`` (runs with different thread counts may differ in the last
bits, not in kind).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import shutil
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from pipelinerl.tasks import Problem, Task, get_task
from pipelinerl.tasks.tokenizer import build_tokenizer, encode_completion, encode_prompt

logger = logging.getLogger(__name__)

# Bump when a change to the task, tokenizer, model or training loop changes the weights produced,
# so stale caches are not reused.
WARM_START_VERSION = 1
METADATA_FILE = "warmstart.json"

# (hidden size, layers, heads): a Llama-style decoder with tied embeddings.
PRESETS: dict[str, tuple[int, int, int]] = {
    "tiny": (128, 4, 4),
    "small": (256, 4, 4),
}
# Longest prompt plus completion of the shipped tasks is about 100 tokens; leave room for RL.
MAX_POSITIONS = 256


@dataclass(frozen=True)
class WarmStartSettings:
    """Everything that determines the warm-start weights (all of it enters the cache key)."""

    task_name: str = "arithmetic"
    seed: int = 0
    preset: str = "tiny"
    sft_steps: int = 300
    batch_size: int = 64
    learning_rate: float = 1.5e-3
    warmup_steps: int = 30
    eval_problems: int = 200
    max_new_tokens: int = 80

    def cache_key(self) -> str:
        payload = json.dumps({"version": WARM_START_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_tiny_model(tokenizer: PreTrainedTokenizerBase, preset: str = "tiny") -> PreTrainedModel:
    """A freshly initialised fp32 Llama-style causal LM sized by ``preset`` (see ``PRESETS``)."""
    if preset not in PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; valid presets: {', '.join(PRESETS)}")
    hidden, layers, heads = PRESETS[preset]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=MAX_POSITIONS,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    return LlamaForCausalLM(config).to(torch.float32)


@torch.no_grad()
def evaluate_success(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    problems: list[Problem],
    max_new_tokens: int,
    batch_size: int = 64,
) -> float:
    """Greedy held-out success rate: the mean verifier score over ``problems``."""
    if not problems:
        raise ValueError("evaluate_success needs at least one problem")
    was_training = model.training
    model.eval()
    pad_id, eos_id = tokenizer.pad_token_id, tokenizer.eos_token_id
    total = 0.0
    try:
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            prompts = [encode_prompt(tokenizer, problem.prompt) for problem in chunk]
            width = max(len(prompt) for prompt in prompts)
            # Left padding keeps every prompt's last token in the last column, where generation starts.
            input_ids = torch.tensor([[pad_id] * (width - len(prompt)) + prompt for prompt in prompts])
            attention_mask = torch.tensor(
                [[0] * (width - len(prompt)) + [1] * len(prompt) for prompt in prompts]
            )
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=eos_id,
            )
            for problem, generated in zip(chunk, output[:, width:].tolist(), strict=True):
                completion = tokenizer.decode(_until_eos(generated, eos_id), skip_special_tokens=True)
                total += task.verify(problem, completion)
    finally:
        model.train(was_training)
    return total / len(problems)


def _until_eos(token_ids: list[int], eos_id: int) -> list[int]:
    return token_ids[: token_ids.index(eos_id)] if eos_id in token_ids else token_ids


def _sft_batches(
    task: Task, tokenizer: PreTrainedTokenizerBase, settings: WarmStartSettings
) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """(input_ids, attention_mask, labels) per step; labels are -100 outside the completion.

    Problems are sorted by length within groups of eight batches, so a batch holds sequences of
    similar length and little compute goes to padding; the batch order is then shuffled.
    """
    problems = task.problems("train", settings.sft_steps * settings.batch_size, settings.seed)
    examples = []
    for problem in problems:
        prompt = encode_prompt(tokenizer, problem.prompt)
        completion = encode_completion(tokenizer, task.reference_completion(problem))
        examples.append((prompt + completion, [-100] * len(prompt) + completion))
    rng = random.Random(settings.seed)
    group = 8 * settings.batch_size
    batches = []
    for start in range(0, len(examples), group):
        chunk = sorted(examples[start : start + group], key=lambda example: len(example[0]))
        batches.extend(chunk[i : i + settings.batch_size] for i in range(0, len(chunk), settings.batch_size))
    rng.shuffle(batches)
    pad_id = tokenizer.pad_token_id
    tensors = []
    for batch in batches:
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in batch])
        attention_mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch])
        labels = torch.tensor([labels + [-100] * (width - len(labels)) for _, labels in batch])
        tensors.append((input_ids, attention_mask, labels))
    return tensors


def _learning_rate_factor(step: int, settings: WarmStartSettings) -> float:
    """Linear warm-up to the peak, then constant (decay slowed the short run down)."""
    return min(1.0, (step + 1) / settings.warmup_steps)


def train_warm_start(settings: WarmStartSettings, console: Any = None) -> tuple[PreTrainedModel, Any, dict]:
    """Build and fine-tune the model; returns (model, tokenizer, metadata)."""
    task = get_task(settings.task_name)
    tokenizer = build_tokenizer()
    with torch.random.fork_rng():
        torch.manual_seed(settings.seed)
        model = build_tiny_model(tokenizer, settings.preset)
    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.learning_rate, betas=(0.9, 0.98), weight_decay=0.01
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _learning_rate_factor(step, settings)
    )
    batches = _sft_batches(task, tokenizer, settings)
    started = time.perf_counter()
    with _Progress(console, settings.sft_steps, "warm-start (supervised)") as progress:
        for step, (input_ids, attention_mask, labels) in enumerate(batches):
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            progress.advance(step + 1, loss.item())
    train_seconds = time.perf_counter() - started
    eval_problems = task.problems("eval", settings.eval_problems, settings.seed)
    success = evaluate_success(model, tokenizer, task, eval_problems, settings.max_new_tokens)
    metadata = {
        "version": WARM_START_VERSION,
        "settings": asdict(settings),
        "parameters": sum(parameter.numel() for parameter in model.parameters()),
        "train_seconds": round(train_seconds, 2),
        "torch_threads": torch.get_num_threads(),
        "eval_success": success,
        "eval_sample_size": len(eval_problems),
        "final_loss": loss.item(),
    }
    return model, tokenizer, metadata


def ensure_warm_start(
    cache_dir: Path,
    task_name: str = "arithmetic",
    seed: int = 0,
    console: Any = None,
    *,
    sft_steps: int = WarmStartSettings.sft_steps,
    eval_problems: int = WarmStartSettings.eval_problems,
) -> Path:
    """The warm-started model directory for these settings, trained now unless already cached.

    ``console`` is an optional ``rich.console.Console`` for a progress bar; without it, progress
    goes to this module's logger. ``sft_steps`` and ``eval_problems`` exist to make tests fast.
    """
    settings = WarmStartSettings(
        task_name=task_name, seed=seed, sft_steps=sft_steps, eval_problems=eval_problems
    )
    cache_dir = Path(cache_dir)
    target = cache_dir / f"{task_name}-{settings.preset}-{settings.cache_key()}"
    if (target / METADATA_FILE).is_file():
        _report(console, f"warm-start: reusing {target}")
        return target
    model, tokenizer, metadata = train_warm_start(settings, console)
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = cache_dir / f".{target.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        # Written last: its presence marks the directory complete.
        (staging / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
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
        f"on {metadata['eval_sample_size']} problems after {metadata['train_seconds']:.0f} s; saved to {target}",
    )
    return target


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
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self.bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} loss {task.fields[loss]:.3f}"),
                TimeRemainingColumn(),
                console=self.console,
            )
            self.bar.start()
            self.task_id = self.bar.add_task(self.description, total=self.total, loss=float("nan"))
        return self

    def advance(self, step: int, loss: float) -> None:
        if self.console is not None:
            self.bar.update(self.task_id, completed=step, loss=loss)
        elif step % self.every == 0 or step == self.total:
            logger.info("%s: step %d/%d loss %.3f", self.description, step, self.total, loss)

    def __exit__(self, *exc_info: object) -> None:
        if self.console is not None:
            self.bar.stop()
