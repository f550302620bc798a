"""A run's model and math datasets named by Hugging Face Hub id, resolved once before any stage starts.

``resolve_hub_sources(config)`` (called by the launcher's pre-flight) returns the config with each id
replaced by its local snapshot (``platform/hub.py``: the Hugging Face cache, or ``model.cache_dir``),
so every stage and node loads the same directory and commit, and with the id, the revision asked and
the commit kept in ``model.hub_snapshot``, ``task.hub_snapshot`` and ``eval.hub_snapshots`` (the run's
config.json, its MLflow tags and the platform database).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from pipelinerl.platform.config import ConfigError, PipelineConfig, format_validation_error
from pipelinerl.platform.hub import resolve_snapshot
from pipelinerl.tasks.math_sources import names_hub_dataset


def resolve_hub_sources(config: PipelineConfig) -> PipelineConfig:
    """``config`` with a model and a math dataset named by Hub id resolved, once, to local snapshots:
    every stage then loads the same directory and commit. The id, the revision asked and the commit
    are kept in ``model.hub_snapshot`` / ``task.hub_snapshot`` (config.json, MLflow tags, database)."""
    data = config.model_dump(mode="json")
    changed = False
    if config.model.is_hub_id():
        snapshot = resolve_snapshot(
            str(config.model.path), revision=config.model.revision, cache_dir=config.model.cache_dir
        )
        data["model"].update(
            path=str(snapshot.path),
            revision=None,
            hub_snapshot={"id": snapshot.repo_id, "revision": snapshot.revision, "commit": snapshot.commit},
        )
        changed = True
    if config.task.name == "math":
        if (recorded := _resolve_dataset(config, data["task"]["options"], "task.options")) is not None:
            data["task"]["hub_snapshot"] = recorded
            changed = True
        for name, options in data["eval"]["sets"].items():  # a set's own dataset (else the task's)
            if "dataset" not in options and "dataset_revision" not in options:
                continue
            merged = {**config.task.options, **options}
            if (recorded := _resolve_dataset(config, merged, f"eval.sets.{name}")) is not None:
                options["dataset"] = merged["dataset"]
                options.pop("dataset_revision", None)
                data["eval"]["hub_snapshots"][name] = recorded
                changed = True
    if not changed:
        return config
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as error:  # e.g. a snapshot without config.json: not a model directory
        raise ConfigError(format_validation_error(error)) from None


def _resolve_dataset(config: PipelineConfig, options: dict[str, Any], where: str) -> dict[str, Any] | None:
    """Math task ``options`` naming a Hub dataset: its snapshot put in place of the id (in ``options``,
    ``dataset_revision`` dropped), and what to record; None when the dataset is no Hub id."""
    dataset = options.get("dataset")
    if not isinstance(dataset, str) or not names_hub_dataset(dataset):
        return None
    revision = options.get("dataset_revision")
    if revision is not None and not isinstance(revision, str):
        raise ConfigError(f"{where}.dataset_revision must be text, got {revision!r}")
    snapshot = resolve_snapshot(
        dataset,
        revision=revision,
        repo_type="dataset",
        cache_dir=config.model.cache_dir,
        setting=f"{where}.dataset",
    )
    options["dataset"] = str(snapshot.path)
    options.pop("dataset_revision", None)
    return {"id": snapshot.repo_id, "revision": snapshot.revision, "commit": snapshot.commit}
