"""Every prompt a run handed out, and what became of it: the records ``pipelinerl runs audit`` checks.

A run's records of its train prompts, under ``prompts/`` in the run directory:

* ``actor<k>.jsonl``: one line per train group actor ``k`` handed out: its stream position, its group
  id (``a<k>-p<position>-<nonce>``) and when the actor process started (which attempt of the run it
  was). A restart does not cut it: a prompt handed out is a fact of the run's history.
* ``dropped.jsonl``: one line per drop by the preprocessor: the group, the reason (``zero_variance``,
  ``stale`` for ``rl.max_lag``, ``incomplete_group`` past the bound on incomplete groups), how many of
  its rollouts, and the step it was building. A restart moves the drops of discarded steps aside with
  the rest of their records (``restart_records``).
* ``trainer_dropped.rank<r>.jsonl``: one line per rollout trainer rank ``r`` refused at its boundary
  (``wire.impossible_values``: token ids outside its vocabulary, a version newer than its own,
  non-finite numbers): its group, reason ``rejected_by_trainer`` with the detail, and the version the
  step would have made (a restart sets the discarded versions' lines aside, as above). Its prompt is
  dropped if no other member of its group was trained.

What was trained is read from the surviving lineage's batch records (``batches/``, the exact batches
the steps trained, ``trainer.record_batches``).

``audit_prompts`` (pure over those records) says, per actor, for every stream position ever handed
out: trained once in the surviving lineage, trained twice (two train groups of one prompt: an error),
dropped (with the reasons), in flight at the end (handed out by the last attempt, or kept in an actor's
engine through a restart of the trainer role, and not trained when the run ended), not reached again
(handed out by an attempt that did not survive, beyond where the last attempt's stream got before the
end: its kept groups do not count as the stream's progress), or **skipped**: handed out by an attempt
that did not survive, below where the last attempt got, and never trained, dropped or handed out again
(an error: the loss a resume must not cause).

The platform database keeps the same records (its prompt ledger: ``prompt_handouts`` and
``prompt_outcomes``, written by the run's tracker), so ``PlatformStore.prompt_records`` gives the audit
what ``read_prompt_records`` gives it from the run directory: both are ``PromptRecords``.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelinerl.platform.batch_records import batch_record_path, read_batch_record
from pipelinerl.platform.checkpoint import TrainedSoFar, prompt_position, read_trained
from pipelinerl.platform.jsonl import step_records

PROMPTS_DIR = "prompts"


def handed_out_path(run_dir: Path, actor_id: int) -> Path:
    return run_dir / PROMPTS_DIR / f"actor{actor_id}.jsonl"


def dropped_prompts_path(run_dir: Path) -> Path:
    return run_dir / PROMPTS_DIR / "dropped.jsonl"


TRAINER_DROPS = "trainer_dropped.rank*.jsonl"  # in PROMPTS_DIR, one file a trainer rank
REJECTED_BY_TRAINER = "rejected_by_trainer"


def trainer_dropped_path(run_dir: Path, rank: int) -> Path:
    return run_dir / PROMPTS_DIR / f"trainer_dropped.rank{rank}.jsonl"


def all_drops(run_dir: Path) -> list[dict[str, Any]]:
    """Every drop the run recorded: the preprocessor's and each trainer rank's."""
    drops = _lines(dropped_prompts_path(run_dir))
    for path in sorted((run_dir / PROMPTS_DIR).glob(TRAINER_DROPS)):
        drops += _lines(path)
    return drops


class PromptAuditError(ValueError):
    """A run whose prompts cannot be audited; the message names what is missing."""


@dataclass
class ActorAudit:
    """One actor's prompts: every position handed out, by what became of it."""

    actor_id: int
    handed_out: int = 0
    trained_once: int = 0
    dropped: Counter[str] = field(default_factory=Counter)  # prompts never trained, by the drop's reason
    in_flight_at_end: list[int] = field(default_factory=list)
    # Handed out by an attempt that did not survive, beyond where the last attempt's stream got before
    # the run ended: the surviving lineage never reached them (a longer run would hand them out again).
    not_reached: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    trained_twice: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.skipped and not self.trained_twice


@dataclass(frozen=True)
class PromptAudit:
    actors: list[ActorAudit]
    versions: int  # the surviving lineage's steps read

    @property
    def ok(self) -> bool:
        return all(actor.ok for actor in self.actors)


def _lines(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines() if line.strip()]


def drop_version(drop: dict[str, Any]) -> int | None:
    """The policy version a drop belongs to: a trainer rank's refusal says the version its step would
    have made; the preprocessor's drop says the step whose batch it was building, which makes version
    step + 1 (``restart_records`` sets both aside by it)."""
    if "policy_version" in drop:
        return int(drop["policy_version"])
    return int(drop["step"]) + 1 if "step" in drop else None


def drop_key(drop: dict[str, Any]) -> tuple[str, str, int | None]:
    """(group, reason, version): one drop, however many of its group's rollouts have a record of it."""
    return str(drop.get("group_id", "")), str(drop.get("reason") or "unknown"), drop_version(drop)


def _main_reason(reasons: Counter[str]) -> str:
    # The most frequent; a tie goes to the first by name, not by the order the records were read in.
    return min(reasons, key=lambda reason: (-reasons[reason], reason))


@dataclass(frozen=True)
class PromptRecords:
    """What ``audit_prompts`` reads, from the run directory (``read_prompt_records``) or the platform
    database (``PlatformStore.prompt_records``)."""

    handed_out: dict[int, list[dict[str, Any]]]  # actor -> its hand-outs
    trained: dict[tuple[int, int], set[str]]  # (actor, position) -> the groups the lineage trained
    dropped: list[dict[str, Any]]
    versions: int

    def audit(self) -> PromptAudit:
        return audit_prompts(self.handed_out, self.trained, self.dropped, self.versions)


def trained_groups(run_dir: Path, ranks: int) -> dict[tuple[int, int], set[str]]:
    """(actor, position) -> the train groups of that prompt trained in the surviving lineage."""
    trained: dict[tuple[int, int], set[str]] = defaultdict(set)
    for version in sorted(step_records(run_dir)):
        for rank in range(ranks):
            path = batch_record_path(run_dir, version, rank)
            if not path.is_file():
                raise PromptAuditError(
                    f"{path} is missing: the audit reads what each step trained from its batch records "
                    "(trainer.record_batches)"
                )
            for sequence in read_batch_record(path).sequences:
                if (where := prompt_position(sequence.group_id)) is not None:
                    trained[where].add(sequence.group_id)
    return trained


def audit_prompts(
    handed_out: dict[int, list[dict[str, Any]]],
    trained: dict[tuple[int, int], set[str]],
    dropped: list[dict[str, Any]],
    versions: int,
) -> PromptAudit:
    """The audit of every actor's ``handed_out`` records against the lineage's ``trained`` groups and
    its ``dropped`` records (pure).

    A prompt never trained but dropped counts under its drops' most frequent reason, each drop counted
    once (``drop_key``): a trainer rank writes one record per rollout it refused, the platform database
    one row per drop, and the two must give the same audit."""
    reasons: dict[tuple[int, int], Counter[str]] = defaultdict(Counter)
    for group_id, reason, _ in {drop_key(drop) for drop in dropped}:
        if (where := prompt_position(group_id)) is not None:
            reasons[where][reason] += 1
    audits = []
    for actor_id, records in sorted(handed_out.items()):
        audit = ActorAudit(actor_id)
        last_attempt = max(float(record["started_at"]) for record in records)
        attempts_of: dict[int, set[float]] = defaultdict(set)
        for record in records:
            attempts_of[int(record["position"])].add(float(record["started_at"]))
        # Where the last attempt's stream got: a group an actor kept through a restart of the trainer role
        # is recorded as the last attempt's too, but may lie far beyond the stream's resumed position.
        reached = max(
            (
                int(record["position"])
                for record in records
                if float(record["started_at"]) == last_attempt and not record.get("kept", False)
            ),
            default=-1,
        )
        audit.handed_out = len(attempts_of)
        for position, attempts in sorted(attempts_of.items()):
            groups = trained.get((actor_id, position), set())
            if len(groups) == 1:
                audit.trained_once += 1
            elif len(groups) > 1:
                audit.trained_twice.append(position)
            elif reasons.get((actor_id, position)):
                audit.dropped[_main_reason(reasons[(actor_id, position)])] += 1
            elif last_attempt in attempts:
                audit.in_flight_at_end.append(position)
            elif position > reached:
                audit.not_reached.append(position)
            else:
                audit.skipped.append(position)
        audits.append(audit)
    return PromptAudit(audits, versions)


def handed_out_again(run_dir: Path, checkpoint: Path | None) -> int:
    """How many prompts the actors handed out that a restart from ``checkpoint`` (None: from the start)
    hands out again: every position its policy was not trained on (in flight, queued or dropped when the
    stage died, or handed out after the last one it trained), once per actor and position."""
    trained = read_trained(checkpoint) if checkpoint is not None else TrainedSoFar()
    again = 0
    for path in sorted((run_dir / PROMPTS_DIR).glob("actor*.jsonl")):
        if not (number := path.stem.removeprefix("actor")).isdigit():
            continue
        actor_id = int(number)
        start, gaps = trained.prompt_positions.get(actor_id, 0), set(trained.untrained_before(actor_id))
        positions = {int(record["position"]) for record in _lines(path)}
        again += sum(1 for position in positions if position >= start or position in gaps)
    return again


def read_prompt_records(run_dir: Path, ranks: int) -> PromptRecords:
    """``run_dir``'s prompt records and what its batch records say was trained."""
    prompts = run_dir / PROMPTS_DIR
    handed = {
        int(path.stem.removeprefix("actor")): _lines(path)
        for path in sorted(prompts.glob("actor*.jsonl"))
        if path.stem.removeprefix("actor").isdigit()
    }
    if not any(handed.values()):
        raise PromptAuditError(
            f"{str(run_dir)!r} has no record of the prompts its actors handed out "
            f"({PROMPTS_DIR}/actor<k>.jsonl): a run from before they were kept, or one that started no actor"
        )
    return PromptRecords(
        {k: v for k, v in handed.items() if v},
        trained_groups(run_dir, ranks),
        all_drops(run_dir),
        len(step_records(run_dir)),
    )


def audit_run(run_dir: Path, ranks: int) -> PromptAudit:
    """Read ``run_dir``'s prompt records and batch records and audit them."""
    return read_prompt_records(run_dir, ranks).audit()
