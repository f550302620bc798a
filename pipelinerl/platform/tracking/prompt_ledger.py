"""The prompt ledger in the platform database: every train group handed out, and what became of it.

The run's tracker fills it from the records the stages write under ``prompts/`` (each actor's
hand-outs, the preprocessor's and each trainer rank's drops) and from the groups each step record
says it trained; ``PlatformStore.prompt_records`` reads it back as the ``PromptRecords`` that
``pipelinerl runs audit`` checks (``platform/prompt_records.py``), the same as a run directory gives.

Rows are keyed so that a record written again adds nothing: a write retried after an outage, or a
crashed run caught up from its run directory (``catch_up.py``), is in the ledger once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from pipelinerl.platform.checkpoint import prompt_position
from pipelinerl.platform.prompt_records import PromptRecords, drop_key
from pipelinerl.platform.tracking.db import PromptHandout, PromptOutcome, StepStats

TRAINED, DROPPED = "trained", "dropped"
NO_REASON = ""  # a trained group's reason: part of the key, which admits no NULL


def handout_row(actor_id: int, record: Mapping[str, Any]) -> dict[str, Any]:
    """A line of ``prompts/actor<k>.jsonl`` as a ``prompt_handouts`` row."""
    return {
        "group_id": str(record["group_id"]),
        "started_at": float(record["started_at"]),
        "actor_id": int(actor_id),
        "position": int(record["position"]),
        "kept": bool(record.get("kept", False)),
    }


def drop_row(record: Mapping[str, Any]) -> dict[str, Any] | None:
    """A drop record (``prompts/dropped.jsonl``, ``prompts/trainer_dropped.rank<r>.jsonl``) as a
    ``prompt_outcomes`` row; None for one that names no version (no stage writes such a record)."""
    group_id, reason, version = drop_key(dict(record))  # as the audit of the run directory reads it
    if version is None:
        return None
    return {"group_id": group_id, "version": version, "outcome": DROPPED, "reason": reason}


def trained_rows(version: int, group_ids: Iterable[str]) -> list[dict[str, Any]]:
    """The groups the step that made ``version`` trained, as ``prompt_outcomes`` rows."""
    return [
        {"group_id": str(group_id), "version": int(version), "outcome": TRAINED, "reason": NO_REASON}
        for group_id in group_ids
    ]


def read_prompt_records(session: Session, run_id: str) -> PromptRecords:
    """The run's ledger as the audit reads it: hand-outs by actor, the trained groups by (actor,
    position), the drops, and how many versions the surviving lineage has."""
    handed: dict[int, list[dict[str, Any]]] = defaultdict(list)
    handouts = select(PromptHandout).where(PromptHandout.run_id == run_id)
    for handout in session.scalars(
        handouts.order_by(PromptHandout.actor_id, PromptHandout.started_at, PromptHandout.position)
    ):
        handed[handout.actor_id].append(
            {
                "position": handout.position,
                "group_id": handout.group_id,
                "started_at": handout.started_at,
                "kept": handout.kept,
            }
        )
    trained: dict[tuple[int, int], set[str]] = defaultdict(set)
    dropped: list[dict[str, Any]] = []
    outcomes = select(PromptOutcome).where(PromptOutcome.run_id == run_id)
    for outcome in session.scalars(outcomes.order_by(PromptOutcome.version, PromptOutcome.group_id)):
        if outcome.outcome == DROPPED:
            dropped.append(
                {"group_id": outcome.group_id, "reason": outcome.reason, "policy_version": outcome.version}
            )
        elif (where := prompt_position(outcome.group_id)) is not None:
            trained[where].add(outcome.group_id)
    versions = session.scalar(select(func.count()).select_from(StepStats).where(StepStats.run_id == run_id))
    return PromptRecords(dict(handed), dict(trained), dropped, int(versions or 0))
