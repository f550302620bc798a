"""A restart's records: the run directory keeps the attempt the final policy descends from.

When a stage crashes and the run starts every stage again from its latest checkpoint (policy
version ``c``), the versions the crashed attempt trained after ``c`` are thrown away with the
policy that held them: the next attempt trains versions ``c+1, c+2, ...`` again, from other rollouts.
``discard_after`` (called by the launcher while no stage runs) makes the run directory say so:

* the records of the discarded versions move out of ``metrics.jsonl``, ``actor<k>.jsonl``,
  ``eval.jsonl`` and ``preprocessor.jsonl`` (and their ``tokens/step_*`` files) into
  ``discarded/attempt<n>/``, so every file in the run directory describes the surviving lineage;
* ``restarts.jsonl`` gains one ``Discarded`` record: which attempt crashed and why, the version
  resumed from, the versions discarded, the rollouts trained into them, and the rollouts that were
  in flight (in the preprocessor's queue, in batches sent but never trained, in the actors'
  engines) and are lost with the crashed processes.

The tracker applies the same cut to MLflow and the platform database (``RunTracker.restarted``).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipelinerl.platform.atomic_file import write_atomically
from pipelinerl.platform.batch_records import BATCHES_DIR
from pipelinerl.platform.prompt_records import PROMPTS_DIR, TRAINER_DROPS, handed_out_again
from pipelinerl.platform.rebase import RebaseAnswer
from pipelinerl.platform.step_digests import DIGESTS_DIR
from pipelinerl.platform.tracking.metric_registry import ACTOR_IN_FLIGHT, QUEUE_ROLLOUTS

RESTARTS_FILE = "restarts.jsonl"
DISCARDED_DIR = "discarded"


@dataclass(frozen=True)
class Discarded:
    """What the restart after attempt ``attempt`` threw away."""

    attempt: int
    reason: str
    resumed_from_version: int
    discarded_versions: list[int] = field(default_factory=list)
    discarded_rollouts: int = 0  # trained into the discarded versions
    lost_in_flight: int = 0  # generated, never trained, gone with the crashed processes
    time: float = 0.0
    # Where the actors outlived the restart (platform/rebase.py): what they kept and handed out again.
    actors_restarted: bool = True
    kept_in_actors: int = 0  # sequences of train groups kept whole in the engines
    regenerated: int = 0  # prompts handed out again (``restart/regenerated``)

    def describe(self) -> str:
        versions = self.discarded_versions
        span = "no version" if not versions else f"versions {versions[0]}..{versions[-1]}"
        actors = (
            ""
            if self.actors_restarted
            else f"; the actors kept their engines, {self.kept_in_actors} sequences and "
            f"{self.regenerated} prompts handed out again"
        )
        return (
            f"attempt {self.attempt} ({self.reason}): resumed from version {self.resumed_from_version}; "
            f"{span} discarded ({self.discarded_rollouts} rollouts trained into them), "
            f"{self.lost_in_flight} rollouts lost in flight{actors}"
        )

    def as_record(self) -> dict[str, Any]:
        return asdict(self)


def _version(record: dict[str, Any]) -> int:
    return int(record["policy_version"])


def _fed_version(record: dict[str, Any]) -> int:
    # A preprocessor record is one batch sent; its ``step`` s feeds the step that makes version s + 1.
    return int(record["step"]) + 1


# Each record file of the run directory, with the policy version its record belongs to.
VERSIONED_FILES: dict[str, Callable[[dict[str, Any]], int]] = {
    "metrics.jsonl": _version,
    "eval.jsonl": _version,
    "preprocessor.jsonl": _fed_version,
    "prompts/dropped.jsonl": _fed_version,  # a drop while building step s's batch: version s + 1's
}
ACTOR_FILES = "actor*.jsonl"


def _read(path: Path) -> list[str]:
    # Complete lines only: a line cut by the crash is dropped with the attempt that wrote it.
    if not path.exists():
        return []
    text = path.read_text()
    return text.splitlines()[: text.count("\n")]


def _split(
    path: Path, version_of: Callable[[dict[str, Any]], int], after: int
) -> tuple[list[str], list[str]]:
    kept: list[str] = []
    thrown: list[str] = []
    for line in _read(path):
        if not line.strip():
            continue
        try:
            (thrown if version_of(json.loads(line)) > after else kept).append(line)
        except (ValueError, KeyError, TypeError):
            kept.append(line)  # not a record of a version: nothing to cut
    return kept, thrown


def _rewrite(path: Path, lines: list[str]) -> None:
    write_atomically(path, "".join(line + "\n" for line in lines))


def _lost_in_flight(
    run_dir: Path, last_trained: int, sequences_per_batch: int, aborted_in_actors: int | None
) -> int:
    """Rollouts generated but never trained, at the crashed attempt's last records: the preprocessor's
    queue, batches it sent for steps the trainer never finished, and each actor's engine (those the
    surviving actors aborted, where they survived)."""
    preprocessor = [json.loads(line) for line in _read(run_dir / "preprocessor.jsonl") if line.strip()]
    queued = int(preprocessor[-1].get(QUEUE_ROLLOUTS, 0)) if preprocessor else 0
    untrained_batches = sum(1 for record in preprocessor if _fed_version(record) > last_trained)
    if aborted_in_actors is not None:
        return queued + untrained_batches * sequences_per_batch + aborted_in_actors
    in_engines = 0
    for path in run_dir.glob(ACTOR_FILES):
        records = [json.loads(line) for line in _read(path) if line.strip()]
        if records:
            in_engines += int(records[-1].get(ACTOR_IN_FLIGHT, 0))
    return queued + untrained_batches * sequences_per_batch + in_engines


def discard_after(
    run_dir: Path,
    resumed_from_version: int,
    *,
    attempt: int,
    reason: str,
    sequences_per_batch: int,
    answers: Sequence[RebaseAnswer] | None = None,
    checkpoint: Path | None = None,
) -> Discarded:
    """Move every record of a version above ``resumed_from_version`` aside and record what went.

    Call only while no stage of the run appends to these files: none alive, or actors that outlived the
    restart and gave their ``answers`` (they closed their files and answered, ``platform/rebase.py``).
    ``checkpoint``: where the run resumes (None: its start), for the prompts handed out again."""
    metrics = [json.loads(line) for line in _read(run_dir / "metrics.jsonl") if line.strip()]
    last_trained = max((_version(record) for record in metrics), default=resumed_from_version)
    thrown_metrics = [record for record in metrics if _version(record) > resumed_from_version]
    discarded = Discarded(
        attempt=attempt,
        reason=reason,
        resumed_from_version=resumed_from_version,
        discarded_versions=sorted({_version(record) for record in thrown_metrics}),
        discarded_rollouts=sum(len(record.get("rollouts", [])) for record in thrown_metrics),
        lost_in_flight=_lost_in_flight(
            run_dir,
            last_trained,
            sequences_per_batch,
            None if answers is None else sum(answer.aborted_sequences for answer in answers),
        ),
        time=time.time(),
        actors_restarted=answers is None,
        kept_in_actors=sum(answer.kept_sequences for answer in answers or ()),
        regenerated=(
            handed_out_again(run_dir, checkpoint)
            if answers is None
            else sum(answer.regenerated_prompts for answer in answers)
        ),
    )
    aside = run_dir / DISCARDED_DIR / f"attempt{attempt}"
    files = {run_dir / name: version_of for name, version_of in VERSIONED_FILES.items()}
    files.update({path: _version for path in run_dir.glob(ACTOR_FILES)})
    # A trainer's refusals carry the version their step would have made.
    files.update({path: _version for path in (run_dir / PROMPTS_DIR).glob(TRAINER_DROPS)})
    for path, version_of in files.items():
        kept, thrown = _split(path, version_of, resumed_from_version)
        if path.exists():
            _rewrite(path, kept)
        if thrown:
            aside.mkdir(parents=True, exist_ok=True)
            with (aside / path.name).open("a") as handle:
                handle.writelines(line + "\n" for line in thrown)
    # The discarded steps' token data, batch records and weight digests, also of a step whose metrics
    # never came.
    for folder in ("tokens", BATCHES_DIR, DIGESTS_DIR):
        for path in sorted((run_dir / folder).glob("step_*.*")):
            if _step_version(path) > resumed_from_version:
                (aside / folder).mkdir(parents=True, exist_ok=True)
                os.replace(path, aside / folder / path.name)
    with (run_dir / RESTARTS_FILE).open("a") as handle:
        handle.write(json.dumps(discarded.as_record()) + "\n")
    return discarded


def _step_version(path: Path) -> int:
    """The version of a step file named ``step_<version>_rank<r>.<ext>`` or ``step_<version>.<ext>``."""
    return int(path.name.split(".")[0].split("_")[1])


def read_restarts(run_dir: Path) -> list[dict[str, Any]]:
    """The run's ``Discarded`` records, oldest first (none for a run that never restarted)."""
    return [json.loads(line) for line in _read(run_dir / RESTARTS_FILE) if line.strip()]
