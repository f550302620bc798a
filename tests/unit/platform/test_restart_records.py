"""A restart's cut of the run directory: records after the resumed version set aside, what went said."""

from __future__ import annotations

import json
from pathlib import Path

from pipelinerl.platform.rebase import RebaseAnswer
from pipelinerl.platform.restart_records import discard_after, read_restarts


def write_lines(path: Path, records: list[dict], tail: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def read_lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def crashed_run(run_dir: Path) -> None:
    """Versions 1..5 trained (4 rollouts each); the preprocessor sent batches for steps 0..6 and holds 3
    rollouts; actor 0 has 2 sequences in its engine; the crash cut the trainer's last line."""
    run_dir.mkdir()
    trainer = [
        {"policy_version": v, "rollouts": [[f"r{v}-{i}", v - 1] for i in range(4)], "time": float(v)}
        for v in range(1, 6)
    ]
    write_lines(run_dir / "metrics.jsonl", trainer, tail='{"policy_version": 6, "rol')
    write_lines(
        run_dir / "preprocessor.jsonl",
        [{"step": s, "queue/rollouts": 3, "time": float(s)} for s in range(7)],
    )
    write_lines(run_dir / "actor0.jsonl", [{"policy_version": v, "actor/in_flight": 2} for v in range(1, 6)])
    write_lines(run_dir / "eval.jsonl", [{"policy_version": v, "pass@1": 0.1} for v in (2, 4)])
    (run_dir / "tokens").mkdir()
    (run_dir / "batches").mkdir()
    for version in range(1, 6):
        (run_dir / "tokens" / f"step_{version:06d}_rank0.npz").write_bytes(b"x")
    # Trainer ranks' refusals of the steps that would make versions 2 and 5.
    for rank, version in ((0, 2), (1, 5)):
        drop = {"group_id": f"a0-p{version}-x", "reason": "rejected_by_trainer", "policy_version": version}
        write_lines(run_dir / "prompts" / f"trainer_dropped.rank{rank}.jsonl", [drop])
    (run_dir / "digests").mkdir()
    for version in range(1, 7):  # step 6's batch was written, its metrics line was cut
        (run_dir / "batches" / f"step_{version:06d}_rank0.batch").write_bytes(b"x")
        (run_dir / "digests" / f"step_{version:06d}.json").write_bytes(b"{}")


def test_records_after_the_resumed_version_are_set_aside_and_counted(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    crashed_run(run_dir)
    discarded = discard_after(
        run_dir, 3, attempt=1, reason="stage actor0 exited with code -9", sequences_per_batch=4
    )
    assert discarded.discarded_versions == [4, 5]
    assert discarded.discarded_rollouts == 8
    # queue 3 + batches for versions 6 and 7 (steps 5, 6) never trained: 2 x 4, + 2 in the engine
    assert discarded.lost_in_flight == 3 + 8 + 2
    assert [r["policy_version"] for r in read_lines(run_dir / "metrics.jsonl")] == [1, 2, 3]
    assert [r["step"] for r in read_lines(run_dir / "preprocessor.jsonl")] == [0, 1, 2]
    assert [r["policy_version"] for r in read_lines(run_dir / "actor0.jsonl")] == [1, 2, 3]
    assert [r["policy_version"] for r in read_lines(run_dir / "eval.jsonl")] == [2]
    aside = run_dir / "discarded" / "attempt1"
    assert [r["policy_version"] for r in read_lines(aside / "metrics.jsonl")] == [4, 5]
    # A trainer's refusal goes with the step it was refused from.
    assert [r["policy_version"] for r in read_lines(run_dir / "prompts/trainer_dropped.rank0.jsonl")] == [2]
    assert read_lines(run_dir / "prompts/trainer_dropped.rank1.jsonl") == []
    assert [r["policy_version"] for r in read_lines(aside / "trainer_dropped.rank1.jsonl")] == [5]
    assert [r["step"] for r in read_lines(aside / "preprocessor.jsonl")] == [3, 4, 5, 6]
    assert sorted(p.name for p in (run_dir / "tokens").iterdir()) == [
        f"step_{v:06d}_rank0.npz" for v in (1, 2, 3)
    ]
    assert sorted(p.name for p in (aside / "tokens").iterdir()) == [f"step_{v:06d}_rank0.npz" for v in (4, 5)]
    # The discarded steps' batch records go aside with them, step 6's too: no replay trains on them.
    assert sorted(p.name for p in (run_dir / "batches").iterdir()) == [
        f"step_{v:06d}_rank0.batch" for v in (1, 2, 3)
    ]
    assert sorted(p.name for p in (aside / "batches").iterdir()) == [
        f"step_{v:06d}_rank0.batch" for v in (4, 5, 6)
    ]
    assert sorted(p.name for p in (aside / "digests").iterdir()) == [f"step_{v:06d}.json" for v in (4, 5, 6)]
    assert len(list((run_dir / "digests").iterdir())) == 3
    [restart] = read_restarts(run_dir)
    assert restart == discarded.as_record()
    assert (
        "resumed from version 3; versions 4..5 discarded (8 rollouts trained into them)"
        in discarded.describe()
    )


def test_a_restart_from_the_start_discards_every_version_and_a_second_restart_adds_its_record(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    crashed_run(run_dir)
    first = discard_after(run_dir, 0, attempt=1, reason="a", sequences_per_batch=4)
    assert first.discarded_versions == [1, 2, 3, 4, 5]
    assert (run_dir / "metrics.jsonl").read_text() == ""
    second = discard_after(run_dir, 0, attempt=2, reason="b", sequences_per_batch=4)
    assert second.discarded_versions == [] and second.discarded_rollouts == 0
    assert "no version discarded" in second.describe()
    assert [r["attempt"] for r in read_restarts(run_dir)] == [1, 2]


def test_actors_that_outlived_the_restart_count_what_they_aborted_kept_and_hand_out_again(
    tmp_path: Path,
) -> None:
    """The engines' part of what was lost is what the surviving actors aborted (their answers), not the
    in-flight count of their last records; what they kept and hand out again is said."""
    run_dir = tmp_path / "run"
    crashed_run(run_dir)
    answers = [
        RebaseAnswer(0, 1, engine_version=5, kept_groups=0, kept_sequences=0, aborted_sequences=7,
                     regenerated_prompts=5, paused_at=1.0),
        RebaseAnswer(1, 1, engine_version=3, kept_groups=2, kept_sequences=8, aborted_sequences=1,
                     regenerated_prompts=2, paused_at=1.0),
    ]  # fmt: skip
    discarded = discard_after(
        run_dir, 3, attempt=1, reason="trainer0", sequences_per_batch=4, answers=answers
    )
    assert discarded.lost_in_flight == 3 + 8 + 7 + 1
    assert not discarded.actors_restarted
    assert (discarded.kept_in_actors, discarded.regenerated) == (8, 7)
    assert "the actors kept their engines, 8 sequences and 7 prompts handed out again" in discarded.describe()
    assert read_restarts(run_dir)[0]["regenerated"] == 7
    # Without answers every stage restarted: nothing kept by an actor.
    again = discard_after(run_dir, 3, attempt=2, reason="actor0", sequences_per_batch=4)
    assert again.actors_restarted and again.kept_in_actors == 0
