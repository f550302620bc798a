"""The prompt audit (``platform/prompt_records.py``) on records written here: every prompt handed out
is trained once, dropped with its reason, in flight at the end or not reached again; a prompt skipped
by a resume or trained twice is found and named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pipelinerl.platform.checkpoint import TrainedSoFar, train_group_id, write_trained
from pipelinerl.platform.prompt_records import (
    REJECTED_BY_TRAINER,
    all_drops,
    audit_prompts,
    handed_out_again,
    trainer_dropped_path,
)


def handed(positions: list[int], attempt: float) -> list[dict[str, Any]]:
    return [
        {"position": p, "group_id": train_group_id(0, p, f"{int(attempt)}a"), "started_at": attempt}
        for p in positions
    ]


def trained(*groups: tuple[int, str]) -> dict[tuple[int, int], set[str]]:
    found: dict[tuple[int, int], set[str]] = {}
    for position, nonce in groups:
        found.setdefault((0, position), set()).add(train_group_id(0, position, nonce))
    return found


def test_a_resume_that_hands_out_its_gaps_again_passes_the_audit() -> None:
    # Attempt 1 handed out 0..7; its checkpoint had trained 0, 1, 3 (2 was dropped, 4 still in flight);
    # attempt 2 handed out 2 and 4 again first, then 5..9, and the run ended with 9 in flight.
    records = handed(list(range(8)), 1.0) + handed([2, 4, 5, 6, 7, 8, 9], 2.0)
    lineage = trained((0, "1a"), (1, "1a"), (3, "1a"), (4, "2a"), (5, "2a"), (6, "2a"), (7, "2a"), (8, "2a"))
    dropped = [{"group_id": train_group_id(0, 2, "1a"), "reason": "zero_variance"}]
    [actor] = audit_prompts({0: records}, lineage, dropped, versions=4).actors
    assert actor.ok and actor.handed_out == 10 and actor.trained_once == 8
    assert actor.dropped == {"zero_variance": 1} and actor.in_flight_at_end == [9]
    assert actor.skipped == [] and actor.not_reached == []


def test_a_resume_that_skips_what_its_checkpoint_had_not_trained_is_caught() -> None:
    # The old resume: attempt 2 went on after the last position trained (4) and never handed 2 again.
    records = handed([0, 1, 2, 3, 4], 1.0) + handed([5, 6, 7], 2.0)
    lineage = trained((0, "1a"), (1, "1a"), (3, "1a"), (4, "1a"), (5, "2a"), (6, "2a"))
    [actor] = audit_prompts({0: records}, lineage, [], versions=3).actors
    assert not actor.ok and actor.skipped == [2] and actor.in_flight_at_end == [7]


def test_a_prompt_trained_as_two_groups_is_trained_twice() -> None:
    records = handed([0, 1], 1.0) + handed([1, 2], 2.0)
    lineage = trained((0, "1a"), (1, "1a"), (1, "2a"), (2, "2a"))
    [actor] = audit_prompts({0: records}, lineage, [], versions=2).actors
    assert not actor.ok and actor.trained_twice == [1] and actor.trained_once == 2


def test_what_a_discarded_attempt_handed_beyond_where_the_last_one_got_was_not_reached() -> None:
    # Attempt 1 reached position 9 before it was cut back; attempt 2 (the last) ended at 6.
    records = handed(list(range(10)), 1.0) + handed([4, 5, 6], 2.0)
    lineage = trained(*[(p, "1a") for p in range(4)], (4, "2a"), (5, "2a"))
    [actor] = audit_prompts({0: records}, lineage, [], versions=3).actors
    assert actor.ok and actor.in_flight_at_end == [6] and actor.not_reached == [7, 8, 9]


def test_a_group_kept_through_a_trainer_restart_does_not_count_as_the_streams_progress() -> None:
    # The actor handed out 0..9 and outlived a restart of the trainer role from a checkpoint that had
    # trained 0..3: it kept its group of prompt 9 (young, sampled by the checkpoint's version) and took up
    # the stream at 4; the run ended with the stream at 6. Prompts 7 and 8 were not reached again, not
    # skipped: the kept group at 9 is no sign that the resumed stream got there.
    kept = {"position": 9, "group_id": train_group_id(0, 9, "1a"), "started_at": 2.0, "kept": True}
    records = handed(list(range(10)), 1.0) + [kept] + handed([4, 5, 6], 2.0)
    lineage = trained(*[(p, "1a") for p in range(4)], (4, "2a"), (5, "2a"), (9, "1a"))
    [actor] = audit_prompts({0: records}, lineage, [], versions=3).actors
    assert actor.ok, actor
    assert actor.not_reached == [7, 8] and actor.in_flight_at_end == [6] and actor.trained_once == 7


def test_a_kept_group_never_trained_is_in_flight_at_the_end() -> None:
    kept = {"position": 5, "group_id": train_group_id(0, 5, "1a"), "started_at": 2.0, "kept": True}
    records = handed(list(range(6)), 1.0) + [kept] + handed([3, 4], 2.0)
    lineage = trained(*[(p, "1a") for p in range(3)], (3, "2a"))
    [actor] = audit_prompts({0: records}, lineage, [], versions=2).actors
    assert actor.ok and actor.in_flight_at_end == [4, 5] and actor.not_reached == []


def test_drops_of_other_groups_and_strangers_are_ignored() -> None:
    records = handed([0, 1], 1.0)
    dropped = [{"group_id": "stranger-group", "reason": "incomplete_group"}, {"reason": "stale"}]
    [actor] = audit_prompts({0: records}, trained((0, "1a")), dropped, versions=1).actors
    assert actor.ok and actor.in_flight_at_end == [1] and not actor.dropped


def test_a_prompt_whose_rollouts_the_trainer_refused_is_dropped_with_that_reason(tmp_path: Path) -> None:
    """The trainer refused every member of prompt 1's group (their records, one file a rank): the
    audit reads its drops beside the preprocessor's and counts the prompt dropped, not in flight."""
    group = train_group_id(0, 1, "1a")
    refused = {"group_id": group, "reason": REJECTED_BY_TRAINER, "detail": "token id 70000 >= vocab"}
    trainer_dropped_path(tmp_path, 1).parent.mkdir(parents=True)
    trainer_dropped_path(tmp_path, 1).write_text(json.dumps(refused) + "\n")
    (tmp_path / "prompts" / "dropped.jsonl").write_text(
        json.dumps({"group_id": train_group_id(0, 2, "1a"), "reason": "zero_variance"}) + "\n"
    )
    drops = all_drops(tmp_path)
    assert [d["reason"] for d in drops] == ["zero_variance", REJECTED_BY_TRAINER]
    [actor] = audit_prompts({0: handed([0, 1, 2], 1.0)}, trained((0, "1a")), drops, versions=1).actors
    assert actor.ok and actor.trained_once == 1 and not actor.in_flight_at_end
    assert actor.dropped == {REJECTED_BY_TRAINER: 1, "zero_variance": 1}


def test_a_restart_hands_out_again_what_its_checkpoint_was_not_trained_on(tmp_path: Path) -> None:
    """Positions 0..9 handed out; the checkpoint trained 0..3 and 5 (4 was dropped): a restart from it
    hands out 4 and 6..9 again; from the start, all ten."""
    run_dir = tmp_path / "run"
    (run_dir / "prompts").mkdir(parents=True)
    (run_dir / "prompts" / "actor0.jsonl").write_text(
        "".join(json.dumps(r) + "\n" for r in handed(list(range(10)), 1.0))
    )
    (run_dir / "prompts" / "actor1.jsonl").write_text("")  # an actor that handed out nothing
    checkpoint = tmp_path / "v3"
    checkpoint.mkdir()
    so_far = TrainedSoFar()
    for position in (0, 1, 2, 3, 5):
        so_far.add(f"r{position}", train_group_id(0, position, "ab"))
    write_trained(checkpoint, 0, so_far)
    assert handed_out_again(run_dir, checkpoint) == 5
    assert handed_out_again(run_dir, None) == 10
