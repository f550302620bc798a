"""Policy checkpoints: a Hugging Face model directory plus ``checkpoint.json`` saying which policy it is.

Layout of ``runs/<id>/checkpoints/v000010/`` (and of ``runs/<id>/final/``)::

    config.json, model.safetensors, tokenizer files   the policy, loadable by transformers / vLLM
    checkpoint.json                                    CheckpointInfo below
    deepspeed/                                         optimizer state, for resuming training

A run resumes from one with ``run.resume_from=<dir>``: the policy starts at the saved version
with its samples and tokens counted, and the trainer reloads the optimizer state when present.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

INFO_FILE = "checkpoint.json"
OPTIMIZER_DIR = "deepspeed"


class CheckpointInfo(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    run_id: str = Field(description="The run that trained this policy.")
    policy_version: int = Field(ge=0, description="Optimizer steps taken to reach this policy.")
    samples_trained: int = Field(ge=0)
    tokens_trained: int = Field(ge=0)
    created_at: float = Field(description="Unix time the checkpoint was written.")


class CheckpointError(ValueError):
    """A directory that cannot be resumed from; the message names it and what is missing."""


def checkpoint_dir(run_dir: Path, version: int) -> Path:
    return run_dir / "checkpoints" / f"v{version:06d}"


def write_info(directory: Path, info: CheckpointInfo) -> None:
    (directory / INFO_FILE).write_text(info.model_dump_json(indent=2))


def read_info(directory: Path) -> CheckpointInfo:
    """The checkpoint's metadata; a clear error when ``directory`` is not a checkpoint."""
    path = directory.expanduser() / INFO_FILE
    if not (directory / "config.json").is_file():
        raise CheckpointError(f"{str(directory)!r} is not a checkpoint: it has no config.json (model)")
    if not path.is_file():
        raise CheckpointError(f"{str(directory)!r} is not a checkpoint: it has no {INFO_FILE}")
    try:
        return CheckpointInfo.model_validate_json(path.read_text())
    except ValidationError as error:
        raise CheckpointError(f"{str(path)!r} is not valid checkpoint metadata: {error}") from None


def starting_version(resume_from: Path | None) -> int:
    """The policy version a run starts at: 0, or the checkpoint's when resuming from one."""
    return 0 if resume_from is None else read_info(resume_from).policy_version


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The run's complete checkpoint with the highest policy version, if any (an interrupted one,
    without its ``checkpoint.json``, does not count)."""
    complete = [d for d in (run_dir / "checkpoints").glob("v*") if (d / INFO_FILE).is_file()]
    return max(complete, key=lambda d: read_info(d).policy_version, default=None)
