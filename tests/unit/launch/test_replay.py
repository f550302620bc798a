"""A replay's plan and check (``launch/replay.py``, ``launch/replay_check.py``) on run directories
written here: what a replay needs is checked before any process starts, and a replay that differs
from its record is reported at its first step and value, tensor or token that differs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pipelinerl.launch.replay import WHAT_IF_KEYS, ReplayError, plan_replay
from pipelinerl.launch.replay_check import arrays_difference, check_replay, values_agree
from pipelinerl.platform.batch_records import batch_record_path
from pipelinerl.platform.checkpoint import (
    CheckpointInfo,
    RunStart,
    checkpoint_dir,
    policy_at_or_before,
    write_info,
    write_start,
)
from pipelinerl.platform.config import load_config
from pipelinerl.platform.step_digests import (
    StepDigests,
    parameter_digests,
    step_digests_path,
    write_step_digests,
)

VERSIONS = range(1, 7)


def model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def step_record(version: int, loss: float) -> dict[str, float]:
    return {
        "policy_version": version,
        "step": version,
        "rl/loss": loss,
        "rl/ess": 0.9,
        "trainer/grad_norm": 2.0,
    }


def write_run(run_dir: Path, ranks: int = 1, checkpoints: tuple[int, ...] = (3,)) -> Path:
    """A run directory holding what a replay reads: config, start, metrics, checkpoints, per-step files."""
    config = load_config(None, [f"trainer.num_processes={ranks}", "run.max_steps=6"])
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(config.model_dump_json())
    write_start(run_dir, RunStart(model_path=model_dir(run_dir.parent / "start-model"), policy_version=0))
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps(step_record(v, -v / 10)) + "\n" for v in VERSIONS)
    )
    for version in checkpoints:
        directory = model_dir(checkpoint_dir(run_dir, version))
        write_info(directory, CheckpointInfo(run_id="r", policy_version=version, samples_trained=0,
                                             tokens_trained=0, created_at=0.0))  # fmt: skip
    for version in VERSIONS:
        for rank in range(ranks):
            path = batch_record_path(run_dir, version, rank)
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(b"batch")
            tokens = run_dir / "tokens" / f"step_{version:06d}_rank{rank}.npz"
            tokens.parent.mkdir(exist_ok=True)
            logprobs = -np.arange(1, 5, dtype=np.float32) / (version + rank)
            np.savez(tokens, trainer_logprobs=logprobs, ratio=np.exp(logprobs))
        write_step_digests(step_digests_path(run_dir, version), StepDigests(version, digests(version)))
    return run_dir


def digests(version: int, bump: float = 0.0) -> dict[str, str]:
    return parameter_digests(
        [("a", torch.full((2, 2), float(version))), ("b", torch.tensor([version + bump]))]
    )


def test_the_replay_resumes_at_the_checkpoint_at_or_before_from(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", checkpoints=(3, 5))
    assert policy_at_or_before(run_dir, 2)[1:] == (0, False)  # before the first checkpoint: the start
    assert policy_at_or_before(run_dir, 4) == (checkpoint_dir(run_dir, 3), 3, True)
    plan = plan_replay(run_dir, 4, None, [])
    assert (plan.first, plan.last, list(plan.versions)) == (3, 6, [4, 5, 6])
    assert plan.config.run.resume_from == checkpoint_dir(run_dir, 3) and not plan.what_if
    # The KL reference stays the run's starting model when the replay resumes later.
    assert plan.config.model.path == tmp_path / "start-model"
    whole = plan_replay(run_dir, None, None, [])
    assert (whole.first, whole.last, whole.config.run.resume_from) == (0, 6, None)
    what_if = plan_replay(run_dir, 0, 2, ["rl.loss=cispo", "trainer.learning_rate=1e-3"])
    assert (
        what_if.what_if and what_if.config.rl.loss == "cispo" and what_if.config.trainer.learning_rate == 1e-3
    )


@pytest.mark.parametrize(
    ("first", "last", "sets", "message"),
    [
        (6, None, [], "--from 6 --to 6: the run recorded versions 1..6"),
        (0, 9, [], "--to 9"),
        (-1, None, [], "--from -1"),
        (None, None, ["model.path=/elsewhere"], "cannot change 'model.path'"),
        (None, None, ["rl.batch_size=8"], "cannot change 'rl.batch_size'"),
        (None, None, ["rl.loss=nonsense"], "rl.loss"),
        (None, None, ["rl.is_cap=-1"], "rl.is_cap"),
    ],
)
def test_a_replay_that_cannot_be_made_is_refused_naming_why(
    tmp_path: Path, first: int | None, last: int | None, sets: list[str], message: str
) -> None:
    run_dir = write_run(tmp_path / "run")
    with pytest.raises(ReplayError, match=message.replace("(", r"\(")):
        plan_replay(run_dir, first, last, sets)


def test_missing_records_are_named_before_any_process_starts(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", ranks=2)
    batch_record_path(run_dir, 5, 1).unlink()
    with pytest.raises(ReplayError, match="step_000005_rank1.batch"):
        plan_replay(run_dir, 4, None, [])
    plan_replay(run_dir, 0, 4, [])  # the steps before it replay
    step_digests_path(run_dir, 2).unlink()
    with pytest.raises(ReplayError, match="step_000002.json"):
        plan_replay(run_dir, 0, 4, [])
    (run_dir / "start.json").unlink()
    with pytest.raises(ReplayError, match="start.json"):
        plan_replay(run_dir, None, None, [])
    with pytest.raises(ReplayError, match="not a run directory"):
        plan_replay(tmp_path / "nowhere", None, None, [])
    (run_dir / "metrics.jsonl").write_text("")
    with pytest.raises(ReplayError, match="no optimizer step"):
        plan_replay(run_dir, None, None, [])


def test_a_replay_out_directory_must_be_new(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("")
    with pytest.raises(ReplayError, match="not empty"):
        plan_replay(run_dir, None, None, [], tmp_path / "out")


def test_only_what_a_replay_can_change_is_a_what_if() -> None:
    assert "rl.loss" in WHAT_IF_KEYS and "rl.max_lag" in WHAT_IF_KEYS
    assert not {"rl.batch_size", "rl.group_size", "model.path", "trainer.num_processes"} & WHAT_IF_KEYS


def test_values_and_arrays_agree_to_the_bit_or_within_the_tolerance() -> None:
    assert values_agree(1.0, 1.0, 0.0) and not values_agree(1.0, np.nextafter(1.0, 2.0), 0.0)
    assert values_agree(float("nan"), float("nan"), 0.0)
    assert values_agree(100.0, 100.0 + 1e-5, 1e-6) and not values_agree(100.0, 100.01, 1e-6)
    a = np.array([1.0, 2.0, 3.0], dtype=np.float32)
    assert arrays_difference("x", a, a.copy(), 0.0) is None
    b = a.copy()
    b[1] = np.nextafter(b[1], np.float32(3.0))
    assert "x[1]" in (arrays_difference("x", a, b, 0.0) or "") and arrays_difference("x", a, b, 1e-6) is None
    assert "shape" in (arrays_difference("x", a, a[:2], 0.0) or "")


def copy_as_replay(run_dir: Path, out: Path) -> None:
    """A replay directory holding exactly the record: metrics, tokens and digests."""
    out.mkdir()
    (out / "metrics.jsonl").write_text((run_dir / "metrics.jsonl").read_text())
    for folder in ("tokens", "digests"):
        (out / folder).mkdir()
        for path in (run_dir / folder).iterdir():
            (out / folder / path.name).write_bytes(path.read_bytes())


def test_a_replay_equal_to_its_record_agrees_and_the_first_difference_is_named(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", ranks=2)
    out = tmp_path / "replay"
    copy_as_replay(run_dir, out)
    report = check_replay(run_dir, out, range(1, 7), ranks=2)
    assert report.first_divergence is None and [s.version for s in report.steps] == list(VERSIONS)
    assert report.steps[0].recorded == report.steps[0].replayed == {
        "rl/loss": -0.1, "rl/ess": 0.9, "trainer/grad_norm": 2.0
    }  # fmt: skip

    # A weight tensor of step 5 differs (and everything after it would): named at step 5.
    write_step_digests(step_digests_path(out, 5), StepDigests(5, digests(5, bump=1e-3)))
    divergence = check_replay(run_dir, out, range(1, 7), ranks=2).first_divergence
    assert (
        divergence is not None
        and divergence.version == 5
        and "tensor 'b' differs" in str(divergence.difference)
    )

    # The loss of step 4 differs in its last bit: named there, before the weights of step 5.
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lines[3]["rl/loss"] = float(np.nextafter(lines[3]["rl/loss"], 0.0))
    (out / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    divergence = check_replay(run_dir, out, range(1, 7), ranks=2).first_divergence
    assert divergence is not None and divergence.version == 4 and "rl/loss is" in str(divergence.difference)
    assert check_replay(run_dir, out, range(1, 7), ranks=2, tolerance=1e-9).first_divergence.version == 5

    # A token log-prob of rank 1 at step 2: named with its rank and index.
    tokens = out / "tokens" / "step_000002_rank1.npz"
    logprobs = np.load(tokens)["trainer_logprobs"].copy()
    logprobs[3] += 0.5
    np.savez(tokens, trainer_logprobs=logprobs, ratio=np.exp(logprobs))
    divergence = check_replay(run_dir, out, range(1, 7), ranks=2).first_divergence
    assert divergence is not None and divergence.version == 2
    assert str(divergence.difference).startswith("rank 1: trainer_logprobs[3]")

    # A what-if replay is reported, never checked.
    assert check_replay(run_dir, out, range(1, 7), ranks=2, what_if=True).first_divergence is None
    # A step the replay never recorded (it stopped after step 2) ends the report there.
    (out / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines[:2]))
    report = check_replay(run_dir, out, range(3, 7), ranks=2)
    assert [step.version for step in report.steps] == [3]
    assert "no step for version 3" in str(report.steps[0].difference)
