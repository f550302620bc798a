"""What a run checks before any process starts: its paths, ports, tracking stores, Hub ids, cores, task
and model. Each failure names the setting and what is valid (``ConfigError`` and the checks' own errors),
so a mistake costs seconds, not a run that dies after its model was prepared."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipelinerl.launch.actor_env import check_actor_interpreter
from pipelinerl.launch.hub_sources import resolve_hub_sources
from pipelinerl.launch.model_source import WARM_START_POSITIONS
from pipelinerl.launch.run_paths import check_run_paths
from pipelinerl.launch.run_prediction import check_plan_profile
from pipelinerl.platform.config import ConfigError, PipelineConfig
from pipelinerl.platform.tracking.mlflow_store import check_reachable, mlflow_uri
from pipelinerl.platform.transport import check_bindable
from pipelinerl.tasks import build_task
from pipelinerl.tasks.base import reference_completion
from pipelinerl.tasks.eval_sets import build_eval_sets


def preflight(config: PipelineConfig) -> PipelineConfig:
    """Fail before any process starts: bad run paths, ports in use, unreachable tracking stores, a Hub
    id that cannot be had. Returns ``config`` with its Hub ids resolved (``resolve_hub_sources``)."""
    check_run_paths(config)  # first: the later checks read the checkpoint as the model directory
    if config.cluster.placement == "local":  # placed on the pools, the actors' nodes have their own
        check_actor_interpreter(config)  # interpreters, and the ports are on trainer node 0
        check_cpus(config)
        for address in config.transport.all_bound_addresses(config.trainer.num_processes):
            check_bindable(address, setting="transport.base_port")
    if config.tracking.enabled:  # an unreachable store fails now, not after the model is prepared
        from pipelinerl.platform.tracking.db import database_url  # noqa: PLC0415 (SQLAlchemy: only for a tracked run)

        check_reachable(mlflow_uri(config))
        check_reachable(database_url(config), "platform database")
    config = resolve_hub_sources(config)
    check_task_and_model(config)
    check_plan_profile(config)  # a profile that cannot be read fails now, not at the run's end
    return config


def check_cpus(config: PipelineConfig) -> None:
    """The cores actor and trainer are pinned to exist for this process."""
    available = os.sched_getaffinity(0)
    for setting, cpus in (("actor.cpus", config.actor.cpus), ("trainer.cpus", config.trainer.cpus)):
        if missing := sorted(set(cpus) - available):
            raise ConfigError(
                f"{setting}={cpus}: core(s) {missing} are not available here; valid: {sorted(available)}"
            )


# Files of which a Hugging Face model directory holds at least one when it has a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json")


def check_task_and_model(config: PipelineConfig) -> None:
    """The task builds (its data is there, its options are right) and the model directory has what the
    prompts need: a tokenizer, an end-of-sequence token, the chat template asked for."""
    task = build_task(config.task)  # TaskError names the file, field or option
    if not task.problems("train", 1, config.run.seed):
        raise ConfigError(
            f"task {config.task.name!r} has no train problems (task.options={config.task.options})"
        )
    if not task.problems("eval", 1, config.run.seed):
        raise ConfigError(
            f"task {config.task.name!r} has no held-out problems (task.options={config.task.options})"
        )
    if config.eval.every:
        build_eval_sets(config, task)  # an eval set whose options do not build is named
    model_path = config.run.resume_from or config.model.path
    if model_path is None:
        _check_embedded_model_can_learn(config, task)
        return
    from transformers import AutoTokenizer  # noqa: PLC0415 (torch/transformers: after preflight)

    from pipelinerl.tasks.prompting import eos_token_ids, prompt_format  # noqa: PLC0415 (torch/transformers: after preflight)

    # transformers builds an empty tokenizer (a vocabulary of one) for a directory without one: look first.
    if not any((Path(model_path) / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(
            f"model directory {str(model_path)!r} has no usable tokenizer: none of "
            f"{', '.join(TOKENIZER_FILES)} is there (save it beside the model: tokenizer.save_pretrained)"
        )
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_path)
    except (OSError, ValueError) as error:
        raise ConfigError(f"model directory {str(model_path)!r} has no usable tokenizer: {error}") from None
    eos_token_ids(tokenizer, model_path)
    prompt_format(tokenizer, config.model.chat_template, config.model.system_prompt)


def _check_embedded_model_can_learn(config: PipelineConfig, task: Any) -> None:
    """The embedded model is warm-started on the task's reference completions, which must exist and fit."""
    if config.task.name == "arithmetic":
        return
    from pipelinerl.tasks.tokenizer import build_tokenizer, encode_completion, encode_prompt  # noqa: PLC0415 (torch/transformers: after preflight)

    tokenizer = build_tokenizer()
    longest = 0
    for problem in task.problems("train", 64, config.run.seed):
        try:
            completion = reference_completion(task, problem)
        except (AttributeError, ValueError) as error:
            raise ConfigError(
                f"task {config.task.name!r} cannot warm-start the embedded model ({error}); set model.path "
                "to a local Hugging Face model directory"
            ) from None
        prompt_tokens = len(encode_prompt(tokenizer, problem.prompt))
        longest = max(
            longest,
            prompt_tokens + max(config.actor.max_new_tokens, len(encode_completion(tokenizer, completion))),
        )
    if longest > WARM_START_POSITIONS:
        raise ConfigError(
            f"task {config.task.name!r}: a prompt and its completion take up to {longest} tokens of the "
            f"embedded model's character tokenizer, more than its {WARM_START_POSITIONS} positions; shorten "
            "the prompts (e.g. task.options.instruction) or actor.max_new_tokens, or set model.path"
        )
