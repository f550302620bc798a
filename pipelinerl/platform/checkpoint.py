"""Policy checkpoints: a Hugging Face model directory plus ``checkpoint.json`` saying which policy it is.

Layout of ``runs/<id>/checkpoints/v000010/`` (and of ``runs/<id>/final/``)::

    config.json, model.safetensors, tokenizer files   the policy, loadable by transformers / vLLM
    checkpoint.json                                    CheckpointInfo below
    deepspeed/                                         optimizer state, for resuming training

A run resumes from one with ``run.resume_from=<dir>``: the policy starts at the saved version
with its samples and tokens counted, and the trainer reloads the optimizer state when present.
"""

from __future__ import annotations

import re
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


# ----- what the checkpointed policy was trained on -------------------------------------------------
#
# Beside the policy, every trainer rank writes ``trained.rank<r>.json``: the rollout ids it trained
# into this policy and, per actor, the prompt-stream position after the last train group it trained.
# A trainer resumed from the checkpoint refuses those ids again (the ledger as a guard, not only an
# audit), and each actor resumes its prompt stream at its position.

TRAINED_FILE = "trained.rank{rank}.json"
_TRAIN_GROUP = re.compile(r"^a(\d+)-p(\d+)-[0-9a-f]+$")


def train_group_id(actor_id: int, position: int, nonce: str) -> str:
    """The id of the train group an actor samples from the ``position``-th prompt of its stream."""
    return f"a{actor_id}-p{position}-{nonce}"


def prompt_position(group_id: str) -> tuple[int, int] | None:
    """(actor id, stream position) of a train group id, or None for any other group id."""
    match = _TRAIN_GROUP.match(group_id)
    return None if match is None else (int(match[1]), int(match[2]))


def with_position(ranges: list[tuple[int, int]], position: int) -> list[tuple[int, int]]:
    """Sorted disjoint ``[start, end)`` ranges with ``position`` added (few: trained positions are
    mostly contiguous, so this stays cheap)."""
    return union_of_ranges([*ranges, (position, position + 1)])


def union_of_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The positions of every range, as sorted disjoint ranges (touching ones joined)."""
    union: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if union and start <= union[-1][1]:
            union[-1] = (union[-1][0], max(union[-1][1], end))
        else:
            union.append((start, end))
    return union


class TrainedSoFar(BaseModel):
    """One trainer rank's share of what a policy was trained on."""

    model_config = ConfigDict(extra="forbid")

    rollout_ids: list[str] = Field(default_factory=list)
    prompt_positions: dict[int, int] = Field(
        default_factory=dict, description="actor id -> stream position after its last trained group"
    )
    trained_positions: dict[int, list[tuple[int, int]]] | None = Field(
        None,
        description="actor id -> the stream positions trained, as [start, end) ranges (None: a checkpoint "
        "from before they were kept, which knows only prompt_positions)",
    )

    def add(self, rollout_id: str, group_id: str) -> None:
        self.rollout_ids.append(rollout_id)
        if (where := prompt_position(group_id)) is not None:
            actor_id, position = where
            self.prompt_positions[actor_id] = max(self.prompt_positions.get(actor_id, 0), position + 1)
            trained = self.trained_positions = self.trained_positions or {}
            trained[actor_id] = with_position(trained.get(actor_id, []), position)

    def untrained_before(self, actor_id: int) -> list[int]:
        """The positions of ``actor_id``'s stream before ``prompt_positions`` that this policy was not
        trained on (in flight, queued or dropped when it was saved): what a resumed actor hands out
        again before going on. None known for a checkpoint from before they were kept."""
        if self.trained_positions is None:
            return []
        untrained: list[int] = []
        next_free = 0
        for start, end in self.trained_positions.get(actor_id, []):
            untrained += range(next_free, start)
            next_free = end
        return untrained + list(range(next_free, self.prompt_positions.get(actor_id, 0)))


def write_trained(directory: Path, rank: int, trained: TrainedSoFar) -> None:
    (directory / TRAINED_FILE.format(rank=rank)).write_text(trained.model_dump_json())


def read_trained(directory: Path) -> TrainedSoFar:
    """Every rank's share merged (no file: a checkpoint from before they were written, nothing known)."""
    merged = TrainedSoFar()
    for path in sorted(directory.glob(TRAINED_FILE.format(rank="*"))):
        try:
            share = TrainedSoFar.model_validate_json(path.read_text())
        except ValidationError as error:
            raise CheckpointError(f"{str(path)!r} is not a record of trained rollouts: {error}") from None
        merged.rollout_ids.extend(share.rollout_ids)
        for actor_id, position in share.prompt_positions.items():
            merged.prompt_positions[actor_id] = max(merged.prompt_positions.get(actor_id, 0), position)
        if share.trained_positions is not None:  # a group's members may have gone to several ranks
            trained = merged.trained_positions = merged.trained_positions or {}
            for actor_id, ranges in share.trained_positions.items():
                trained[actor_id] = union_of_ranges([*trained.get(actor_id, []), *ranges])
    return merged


# ----- where the run's policy started -------------------------------------------------------------
#
# ``start.json`` in the run directory: the model the trainer started from (a Hugging Face directory,
# a warm start, or the checkpoint ``run.resume_from`` named) and its policy version. A replay from
# before the run's first checkpoint resumes from it.

START_FILE = "start.json"


class RunStart(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model_path: Path = Field(description="The model the trainer started from.")
    policy_version: int = Field(ge=0, description="Its policy version (0 unless resumed).")


def write_start(run_dir: Path, start: RunStart) -> None:
    (run_dir / START_FILE).write_text(start.model_dump_json(indent=2))


def read_start(run_dir: Path) -> RunStart:
    path = run_dir / START_FILE
    if not path.is_file():
        raise CheckpointError(f"{str(run_dir)!r} records no starting model ({START_FILE} is missing)")
    try:
        return RunStart.model_validate_json(path.read_text())
    except ValidationError as error:
        raise CheckpointError(f"{str(path)!r} is not a run's starting model: {error}") from None


def policy_at_or_before(run_dir: Path, version: int) -> tuple[Path, int, bool]:
    """(model directory, its version, whether it is a checkpoint to resume) of the run's latest policy
    at or before ``version``: a complete checkpoint of the run, else the model it started from."""
    start = read_start(run_dir)
    model_path = start.model_path if start.model_path.is_absolute() else run_dir / start.model_path
    best: tuple[Path, int, bool] = (model_path, start.policy_version, start.policy_version > 0)
    for directory in sorted((run_dir / "checkpoints").glob("v*")):
        if not (directory / INFO_FILE).is_file():
            continue  # interrupted while it was written
        found = read_info(directory).policy_version
        if best[1] < found <= version:
            best = (directory, found, True)
    return best
