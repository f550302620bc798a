"""The model a run starts from, and how well it does on the held-out problems.

``resolve_model``: a checkpoint to resume from, a Hub id (fetched once into the Hub cache), a local
model directory, or the embedded default, warm-started on the task and cached in ``run.home``
(``launch/warmstart.py``). ``held_out_success``: the greedy success of a model directory on the task's
held-out problems (the run's start and end, and the learning benchmark's checkpoints).

torch and transformers load inside the functions, after preflight (``launch/preflight.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelinerl.launch.hub_sources import resolve_hub_sources
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.tasks import build_task

# Positions of the embedded model warm-started on a task other than arithmetic (prompt + completion).
WARM_START_POSITIONS = 512


def resolve_model(config: PipelineConfig, console: Any = None) -> Path:
    if config.run.resume_from is not None:
        return config.run.resume_from  # checked by preflight: a checkpoint is a model directory
    if config.model.is_hub_id():  # launch resolved it in preflight; other callers resolve it here
        return resolve_hub_sources(config).model.path or Path()
    if config.model.path is not None:
        return config.model.path
    from pipelinerl.launch.warmstart import ensure_warm_start  # noqa: PLC0415 (torch/transformers: after preflight)

    cache_dir = config.run.home.expanduser() / "warmstart"
    # The arithmetic warm start keeps the settings its cache was made with; another task's is built for
    # longer sequences and reports its success on completions as long as the actor's.
    longer = (
        {}
        if config.task.name == "arithmetic"
        else {"max_positions": WARM_START_POSITIONS, "max_new_tokens": config.actor.max_new_tokens}
    )
    return ensure_warm_start(
        cache_dir,
        task_name=config.task.name,
        task_options=dict(config.task.options),
        seed=config.run.seed,
        max_steps=config.model.warmstart_max_steps,
        console=console,
        **longer,
    )


def held_out_success(config: PipelineConfig, model_path: Path) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 (torch/transformers: after preflight)

    from pipelinerl.launch.warmstart import evaluate_success  # noqa: PLC0415 (torch/transformers: after preflight)
    from pipelinerl.platform.dtypes import policy_dtype  # noqa: PLC0415 (torch/transformers: after preflight)
    from pipelinerl.platform.model_loading import serialise_model_loading  # noqa: PLC0415 (transformers)
    from pipelinerl.tasks.prompting import eos_token_ids, prompt_format  # noqa: PLC0415 (torch/transformers: after preflight)

    serialise_model_loading()  # runs may share this process: one load at a time
    task = build_task(config.task)
    problems = task.problems("eval", config.task.eval_problems, config.run.seed)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=policy_dtype(config.model.dtype)).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    return evaluate_success(
        model,
        tokenizer,
        task,
        problems,
        max_new_tokens=config.actor.max_new_tokens,
        prompt=prompt_format(tokenizer, config.model.chat_template, config.model.system_prompt),
        eos_ids=eos_token_ids(tokenizer, model_path),
    )
