"""Actors that outlive a restart of the trainer role: the launcher's notice and the actors' answers.

When a trainer rank or the preprocessor dies and the run restarts from checkpoint ``c``, the actors
keep their engines (a vLLM engine takes a minute to start on CPU, minutes for a large model on GPUs).
The exchange, through files of the run directory (shared by every node of a cluster):

1. the launcher stops the trainer role and writes ``restart/rebase.json`` (``Rebase``: the attempt
   and the version ``c`` the lineage resumes from);
2. each actor stops admitting prompts; keeps the train groups still whole in its engine whose every
   token was sampled by a version ``<= c`` (valid in the resumed lineage); aborts every other
   sequence; drops what it had queued for the dead preprocessor (a new rollout socket); goes on
   with the prompt stream of ``c`` (the prompts ``c``'s policy was not trained on handed out again,
   ``restart/regenerated`` of them); closes its record file (the launcher cuts it) and answers with
   ``restart/actor<k>.json`` (``RebaseAnswer``);
3. once every actor answered, the launcher sets the discarded versions aside and starts the trainer
   role from ``c``; trainer rank 0 publishes ``c``'s weights as an ordinary in-flight update, which the
   actors load (going back from their newer version to ``c``) before they admit prompts again.

An actor that does not answer in time makes the launcher restart every stage, as before.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pipelinerl.platform.atomic_file import write_atomically

REBASE_DIR = "restart"
REBASE_FILE = "rebase.json"


@dataclass(frozen=True)
class Rebase:
    """The launcher's notice: the trainer role restarts as ``attempt`` from policy ``version``."""

    attempt: int
    version: int
    checkpoint: str | None  # the checkpoint directory, None when the lineage resumes from the start


@dataclass(frozen=True)
class RebaseAnswer:
    """What one actor did with what it held when the trainer role died."""

    actor_id: int
    attempt: int
    engine_version: int  # the version its engine ran when it paused
    kept_groups: int  # train groups kept whole in the engine (every token by a version <= c)
    kept_sequences: int
    aborted_sequences: int  # sequences with a token of a discarded version, or of a group already cut
    regenerated_prompts: int  # prompts handed out before, neither trained into c nor kept: handed out again
    paused_at: float

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def rebase_path(run_dir: Path) -> Path:
    return run_dir / REBASE_DIR / REBASE_FILE


def answer_path(run_dir: Path, actor_id: int) -> Path:
    return run_dir / REBASE_DIR / f"actor{actor_id}.json"


def write_rebase(run_dir: Path, rebase: Rebase) -> None:
    """Announce ``rebase``; every earlier answer is removed first (they answered an older attempt)."""
    (run_dir / REBASE_DIR).mkdir(parents=True, exist_ok=True)
    for old in (run_dir / REBASE_DIR).glob("actor*.json"):
        old.unlink()
    write_atomically(rebase_path(run_dir), json.dumps(asdict(rebase)))


def clear_rebase(run_dir: Path) -> None:
    """No rebase is pending (every stage starts again: a fresh actor has nothing to rebase)."""
    rebase_path(run_dir).unlink(missing_ok=True)


def read_rebase(run_dir: Path) -> Rebase | None:
    path = rebase_path(run_dir)
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None
    return Rebase(int(data["attempt"]), int(data["version"]), data.get("checkpoint"))


def write_answer(run_dir: Path, answer: RebaseAnswer) -> None:
    write_atomically(answer_path(run_dir, answer.actor_id), json.dumps(answer.as_record()))


def read_answers(run_dir: Path, attempt: int, num_actors: int) -> dict[int, RebaseAnswer]:
    """The answers to ``attempt`` given so far, by actor."""
    answers: dict[int, RebaseAnswer] = {}
    for actor_id in range(num_actors):
        try:
            data = json.loads(answer_path(run_dir, actor_id).read_text())
        except (FileNotFoundError, ValueError):
            continue
        if int(data.get("attempt", -1)) == attempt:
            answers[actor_id] = RebaseAnswer(**data)
    return answers


def kept_groups(pending: Mapping[str, tuple[str, int, str]], engine_version: int, version: int) -> set[str]:
    """The train groups an actor keeps when the lineage resumes from ``version`` (pure).

    ``pending``: every sequence still being written, ``request id -> (group id, group size, split)``. A
    group is kept when it is a train group whose members are all still being written (none went to the
    dead preprocessor, so it can complete in the new one) and the engine never ran a version after
    ``version`` (then every token of it is valid in the resumed lineage)."""
    if engine_version > version:
        return set()
    members: Counter[str] = Counter()
    sizes: dict[str, int] = {}
    for group_id, group_size, split in pending.values():
        if split == "train":
            members[group_id] += 1
            sizes[group_id] = group_size
    return {group_id for group_id, count in members.items() if count == sizes[group_id]}
