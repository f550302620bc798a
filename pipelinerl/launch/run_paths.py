"""The run's paths checked before any work: ``run.output_dir`` can hold a new run, ``run.resume_from``
is a checkpoint that leaves something to train.

Both used to fail late: a ``run.resume_from`` that does not exist was first read as a model directory
("model directory … has no usable tokenizer", naming neither the setting nor the missing path), after
the task had been built; an ``run.output_dir`` that cannot be written failed with a bare ``Errno``
once the model was prepared. Every message here names the setting, the path and what is wrong.
"""

from __future__ import annotations

import os
import pwd
import tempfile
from pathlib import Path

from pipelinerl.platform.checkpoint import CheckpointError, read_info
from pipelinerl.platform.config import ConfigError, PipelineConfig

CHECKPOINT_HINT = "a checkpoint directory such as runs/RUN_ID/checkpoints/v000010 or runs/RUN_ID/final"


def check_run_paths(config: PipelineConfig) -> None:
    """``ConfigError`` naming ``run.resume_from`` or ``run.output_dir`` when either cannot serve."""
    if config.run.resume_from is not None:
        check_resume_from(config.run.resume_from, config.run.max_steps)
    check_output_dir(config.run.output_dir)


def check_resume_from(resume_from: Path, max_steps: int) -> None:
    path = resume_from.expanduser()
    setting = f"run.resume_from={str(resume_from)!r}"
    if not path.exists():
        raise ConfigError(f"{setting}: no such directory; give {CHECKPOINT_HINT}")
    if not path.is_dir():
        raise ConfigError(f"{setting} is a file, not a directory; give {CHECKPOINT_HINT}")
    try:
        info = read_info(path)
    except CheckpointError as error:
        raise ConfigError(f"{setting}: {error}; give {CHECKPOINT_HINT}") from None
    if info.policy_version >= max_steps:
        raise ConfigError(
            f"{setting} is at policy version {info.policy_version}; run.max_steps={max_steps} leaves nothing "
            "to train (max_steps counts versions from 0, so raise it)"
        )


def check_output_dir(output_dir: Path) -> None:
    """The directory exists or can be made, and a file can be written in it (tried, not guessed:
    permission bits say nothing of a read-only mount, and root passes every ``os.access`` test)."""
    path = output_dir.expanduser()
    setting = f"run.output_dir={str(output_dir)!r}"
    blocker = next((parent for parent in (path, *path.parents) if parent.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(f"{setting}: {str(blocker)!r} is a file, not a directory; runs need a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".pipelinerl-write-check-"):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise ConfigError(
            f"{setting}: cannot write there ({reason}: {error.filename or path}); give a directory this user "
            f"({_user()}) can create and write"
        ) from None


def _user() -> str:
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:
        return f"uid {os.getuid()}"
