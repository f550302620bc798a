"""The prompt ledger on a real SQLite file: hand-outs kept per attempt and never cut, outcomes cut with
the versions a restart discards, every row written once; and ``pipelinerl runs audit`` gives the same
report from the platform database (filled live by the tracker, or caught up from the run directory) as
from the run directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from pipelinerl.cli import app
from pipelinerl.platform.batch_records import batch_record_path, write_batch_record
from pipelinerl.platform.checkpoint import train_group_id
from pipelinerl.platform.config import PipelineConfig, load_config
from pipelinerl.platform.prompt_records import (
    REJECTED_BY_TRAINER,
    audit_prompts,
    audit_run,
    dropped_prompts_path,
    handed_out_path,
    trainer_dropped_path,
)
from pipelinerl.platform.restart_records import Discarded
from pipelinerl.platform.tracking.catch_up import missing_records
from pipelinerl.platform.tracking.prompt_ledger import drop_row, handout_row, trained_rows
from pipelinerl.platform.tracking.run_tracker import RunTracker
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.platform.wire import TrainBatch, TrainSequence
from tests.unit.platform.tracking.test_store import STARTED, create

RUN_ID = "20261125-010000-pipeline-cd34"
FIRST, SECOND = 100.0, 200.0  # the two attempts' start times


def group(position: int, nonce: str) -> str:
    return train_group_id(0, position, nonce)


def handout(position: int, nonce: str, started_at: float, kept: bool = False) -> dict[str, Any]:
    record: dict[str, Any] = {
        "position": position,
        "group_id": group(position, nonce),
        "started_at": started_at,
    }
    return record | {"kept": True} if kept else record


def refusal(position: int, nonce: str, version: int, rollout: int) -> dict[str, Any]:
    """A trainer rank's record of one refused rollout: one line per rollout, so two of one group here."""
    return {
        "group_id": group(position, nonce),
        "rollout_id": f"{group(position, nonce)}-r{rollout}",
        "reason": REJECTED_BY_TRAINER,
        "detail": "token id 900 outside the vocabulary",
        "policy_version": version,
        "rank": 0,
        "time": 1.0,
    }


def preprocessor_drop(position: int, nonce: str, reason: str, step: int) -> dict[str, Any]:
    return {"group_id": group(position, nonce), "reason": reason, "rollouts": 2, "step": step, "time": 1.0}


def step(version: int, groups: list[str]) -> dict[str, Any]:
    """The trainer's record of the step that made ``version``, which trained two rollouts of each group."""
    return {
        "step": version,
        "policy_version": version,
        "time": 1000.0 + version,
        "rl/loss": -0.5,
        "rl/ess": 0.9,
        "lag/histogram": [4 * len(groups)],
        "trainer/tokens": 40,
        "trainer/samples": 2 * len(groups),
        "trainer/step_s": 1.0,
        "trainer/wait_s": 0.1,
        "samples/trained": 2 * version,
        "tokens/trained": 40 * version,
        "rollouts": [[f"{group_id}-r{k}", version - 1] for group_id in groups for k in range(2)],
        "trained_groups": sorted(groups),
    }


# One actor, two attempts. Attempt 1 hands out prompts 0..6; v1 trains 0 and 1, prompt 2's group has
# equal rewards (dropped while building step 1), v2 trains 3, v3 trains 4 while the trainer refuses
# prompt 5's rollouts. The trainer role crashes; the run resumes from v2 (v3 and its refusals are
# discarded) and the actor, which outlived the restart, keeps prompt 6's group. Attempt 2 hands out 4,
# 5, 7 and 8 again; v3 trains 4 and 6, v4 trains 5, prompt 7 is refused by the trainer and dropped stale;
# 8 is in flight at the end.
ATTEMPT_1 = [handout(p, "1a", FIRST) for p in range(7)]
ATTEMPT_2 = [handout(6, "1a", SECOND, kept=True)] + [handout(p, "2b", SECOND) for p in (4, 5, 7, 8)]
STEPS_1 = [step(1, [group(0, "1a"), group(1, "1a")]), step(2, [group(3, "1a")]), step(3, [group(4, "1a")])]
DROPS_1 = [preprocessor_drop(2, "1a", "zero_variance", step=1)]
REFUSED_1 = [refusal(5, "1a", 3, k) for k in range(2)]
STEPS_2 = [step(3, [group(4, "2b"), group(6, "1a")]), step(4, [group(5, "2b")])]
DROPS_2 = [preprocessor_drop(7, "2b", "stale", step=3)]
REFUSED_2 = [refusal(7, "2b", 4, k) for k in range(2)]
DISCARDED = Discarded(attempt=1, reason="trainer0 died", resumed_from_version=2, discarded_versions=[3])


def write_lines(path: Path, records: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def sequence(group_id: str, rollout: int) -> TrainSequence:
    return TrainSequence(
        rollout_id=f"{group_id}-r{rollout}",
        group_id=group_id,
        prompt_token_ids=np.arange(3, dtype=np.int32),
        completion_token_ids=np.arange(2, dtype=np.int32),
        behaviour_logprobs=np.zeros(2, dtype=np.float32),
        token_versions=np.zeros(2, dtype=np.int32),
        reward=1.0,
        advantage=0.5,
        finished=True,
    )


def config(tmp_path: Path) -> PipelineConfig:
    return load_config(None, [f"run.home={tmp_path / 'home'}"])


def run_directory(tmp_path: Path) -> Path:
    """The run directory as the run left it: the restart set v3's records of attempt 1 aside."""
    run_dir = tmp_path / RUN_ID
    (run_dir / "config.json").parent.mkdir(parents=True)
    (run_dir / "config.json").write_text(config(tmp_path).model_dump_json())
    steps = STEPS_1[:2] + STEPS_2
    write_lines(run_dir / "metrics.jsonl", steps)
    write_lines(handed_out_path(run_dir, 0), ATTEMPT_1 + ATTEMPT_2)
    write_lines(dropped_prompts_path(run_dir), DROPS_1 + DROPS_2)
    write_lines(trainer_dropped_path(run_dir, 0), REFUSED_2)
    for record in steps:
        sequences = [sequence(group_id, k) for group_id in record["trained_groups"] for k in range(2)]
        micro_batches = [list(range(len(sequences)))]
        batch = TrainBatch(record["policy_version"] - 1, sequences, micro_batches, created_at=1.0)
        write_batch_record(batch_record_path(run_dir, record["policy_version"], 0), batch)
    return run_dir


def tracked_live(store: PlatformStore, tmp_path: Path) -> None:
    """The tracker as the launcher drives it: each attempt's records as its files grow, then the restart."""
    tracker = RunTracker.attach(config(tmp_path), RUN_ID, store, None, None)
    tracker.handout_records(0, ATTEMPT_1)
    tracker.drop_records(DROPS_1)
    tracker.trainer_records(STEPS_1)
    tracker.drop_records(REFUSED_1)
    tracker.restarted(1, DISCARDED)
    tracker.handout_records(0, ATTEMPT_2)
    tracker.trainer_records(STEPS_2)
    tracker.drop_records(DROPS_2 + REFUSED_2)
    assert tracker.write([]), "every write was taken"


def test_a_group_handed_out_by_two_attempts_is_two_rows_each_written_once(store: PlatformStore) -> None:
    create(store, RUN_ID)
    rows = [handout_row(0, record) for record in ATTEMPT_1 + ATTEMPT_2]
    assert store.record_handouts(RUN_ID, rows) == len(rows)
    assert store.record_handouts(RUN_ID, rows) == 0, "written again: nothing new"
    handed = store.prompt_records(RUN_ID).handed_out[0]
    kept = [record for record in handed if record["group_id"] == group(6, "1a")]
    assert [(r["started_at"], r["kept"]) for r in kept] == [(FIRST, False), (SECOND, True)]


def test_outcomes_are_written_once_and_a_restart_cuts_the_discarded_versions_only(
    store: PlatformStore,
) -> None:
    create(store, RUN_ID)
    store.record_handouts(RUN_ID, [handout_row(0, record) for record in ATTEMPT_1])
    drops = [row for record in DROPS_1 + REFUSED_1 if (row := drop_row(record)) is not None]
    assert [row["version"] for row in drops] == [2, 3, 3]
    outcomes = trained_rows(1, [group(0, "1a"), group(1, "1a")]) + trained_rows(3, [group(4, "1a")]) + drops
    assert store.record_outcomes(RUN_ID, outcomes) == 5, "the trainer's two refusals of one group: one drop"
    assert store.record_outcomes(RUN_ID, outcomes) == 0
    store.discard_after(RUN_ID, 2)
    records = store.prompt_records(RUN_ID)
    assert records.trained == {(0, 0): {group(0, "1a")}, (0, 1): {group(1, "1a")}}
    assert records.dropped == [{"group_id": group(2, "1a"), "reason": "zero_variance", "policy_version": 2}]
    assert len(records.handed_out[0]) == len(ATTEMPT_1), "hand-outs are history: a restart keeps them"


def test_the_ledger_refuses_unknown_runs_by_name(store: PlatformStore) -> None:
    with pytest.raises(LookupError, match="no run 'nosuch'"):
        store.record_handouts("nosuch", [handout_row(0, ATTEMPT_1[0])])
    with pytest.raises(LookupError, match="no run 'nosuch'"):
        store.prompt_records("nosuch")
    with pytest.raises(LookupError, match="no run 'nosuch'"):
        store.find_run_id("nosuch")


def test_one_drop_counts_once_and_a_tie_of_reasons_goes_by_name() -> None:
    """Per rollout (the trainer's records) or per drop (the database's rows): the same audit."""
    handed = {0: [handout(0, "1a", FIRST)]}
    per_rollout = [*REFUSED_1[:1], *REFUSED_1, {"group_id": group(0, "1a"), "reason": "stale", "step": 2}]
    per_rollout = [{**drop, "group_id": group(0, "1a")} for drop in per_rollout]
    per_drop = [per_rollout[0], per_rollout[-1]]
    for drops in (per_rollout, per_drop, per_drop[::-1]):
        [actor] = audit_prompts(handed, {}, drops, versions=0).actors
        assert actor.dropped == {REJECTED_BY_TRAINER: 1}, drops


def test_the_database_filled_live_and_the_run_directory_give_the_same_audit(
    store: PlatformStore, tmp_path: Path
) -> None:
    create(store, RUN_ID)
    tracked_live(store, tmp_path)
    from_database = store.prompt_records(RUN_ID).audit()
    from_directory = audit_run(run_directory(tmp_path), ranks=1)
    assert from_database == from_directory
    [actor] = from_database.actors
    assert actor.ok and from_database.versions == 4
    assert (actor.handed_out, actor.trained_once, actor.in_flight_at_end) == (9, 6, [8])
    assert actor.dropped == {"zero_variance": 1, REJECTED_BY_TRAINER: 1}


def test_a_crashed_run_caught_up_from_its_directory_gives_the_same_audit(
    store: PlatformStore, tmp_path: Path
) -> None:
    create(store, RUN_ID, started_at=STARTED)
    run_dir = run_directory(tmp_path)
    tracker = RunTracker.attach(config(tmp_path), RUN_ID, store, None, None)
    assert tracker.write(missing_records(run_dir, 1, store.recorded_versions(RUN_ID)))
    assert tracker.write(missing_records(run_dir, 1, store.recorded_versions(RUN_ID))), "twice: no harm"
    assert store.prompt_records(RUN_ID).audit() == audit_run(run_dir, ranks=1)


def test_runs_audit_prints_the_same_report_from_a_run_id_as_from_its_directory(
    url: str, store: PlatformStore, tmp_path: Path
) -> None:
    create(store, RUN_ID)
    tracked_live(store, tmp_path)
    run_dir = run_directory(tmp_path)
    runner = CliRunner()
    by_directory = runner.invoke(app, ["runs", "audit", str(run_dir)], terminal_width=200)
    by_id = runner.invoke(app, ["runs", "audit", RUN_ID[:15], "--url", url], terminal_width=200)
    assert by_directory.exit_code == by_id.exit_code == 0, by_directory.output + by_id.output
    assert by_id.output == by_directory.output
    assert f"prompts of {RUN_ID} (4 steps" in by_id.output

    unknown = runner.invoke(app, ["runs", "audit", "nosuch-run", "--url", url], terminal_width=200)
    assert unknown.exit_code == 2
    assert "'nosuch-run' is not a run directory" in unknown.output
    assert "no run 'nosuch-run' in the platform database" in unknown.output
