"""The launcher's notice of a restart of the trainer role and the actors' answers (platform/rebase.py)."""

from __future__ import annotations

from pathlib import Path

from pipelinerl.platform.rebase import (
    Rebase,
    RebaseAnswer,
    answer_path,
    clear_rebase,
    kept_groups,
    read_answers,
    read_rebase,
    write_answer,
    write_rebase,
)


def answer(actor_id: int, attempt: int) -> RebaseAnswer:
    return RebaseAnswer(actor_id, attempt, 4, 1, 4, 2, 3, paused_at=10.0)


def test_a_notice_is_read_back_and_removes_the_answers_to_the_attempt_before(tmp_path: Path) -> None:
    assert read_rebase(tmp_path) is None
    write_rebase(tmp_path, Rebase(1, 3, "/runs/r/checkpoints/v3"))
    write_answer(tmp_path, answer(0, 1))
    assert read_answers(tmp_path, 1, num_actors=2) == {0: answer(0, 1)}
    write_rebase(tmp_path, Rebase(2, 0, None))
    assert read_rebase(tmp_path) == Rebase(2, 0, None)
    assert not answer_path(tmp_path, 0).exists(), "an answer to attempt 1 does not answer attempt 2"
    write_answer(tmp_path, answer(1, 2))
    write_answer(tmp_path, answer(0, 2))
    assert sorted(read_answers(tmp_path, 2, num_actors=2)) == [0, 1]
    assert read_answers(tmp_path, 3, num_actors=2) == {}
    clear_rebase(tmp_path)
    assert read_rebase(tmp_path) is None
    clear_rebase(tmp_path)  # twice: nothing to clear


def test_a_half_written_notice_or_answer_reads_as_none_yet(tmp_path: Path) -> None:
    (tmp_path / "restart").mkdir()
    (tmp_path / "restart" / "rebase.json").write_text('{"attempt": 1, "vers')
    assert read_rebase(tmp_path) is None
    answer_path(tmp_path, 0).write_text("{")
    assert read_answers(tmp_path, 1, num_actors=1) == {}


G = 4


def pending(*groups: tuple[str, int, str]) -> dict[str, tuple[str, int, str]]:
    """``(group, members still being written, split)`` -> the actor's pending sequences."""
    out = {}
    for group, members, split in groups:
        for k in range(members):
            out[f"{group}-{k}"] = (group, G, split)
    return out


def test_whole_train_groups_are_kept_when_the_engine_never_ran_a_discarded_version() -> None:
    held = pending(("a0-p1-x", G, "train"), ("a0-p2-y", G - 1, "train"), ("eval-v3", G, "eval"))
    # a group with a member already sent cannot complete in the new preprocessor; eval rounds start again
    assert kept_groups(held, engine_version=3, version=3) == {"a0-p1-x"}
    assert kept_groups(held, engine_version=2, version=3) == {"a0-p1-x"}, "older versions are the lineage's"
    assert kept_groups(held, engine_version=4, version=3) == set(), "every sequence has a token of v4"
    assert kept_groups({}, engine_version=0, version=0) == set()
