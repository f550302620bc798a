"""Warm-start end to end on the CPU: a loadable Hugging Face directory, cached by its settings."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from filelock import FileLock
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipelinerl.launch.warmstart import (
    METADATA_FILE,
    WarmStartSettings,
    _accumulate_step_loss,
    _examples,
    _training_batches,
    build_tiny_model,
    ensure_warm_start,
    evaluate_success,
    warm_start_dir,
    warm_start_lock,
)
from pipelinerl.tasks import get_task
from pipelinerl.tasks.tokenizer import build_tokenizer, encode_prompt

# Few steps and a small held-out sample keep this test to seconds; the model stays untrained.
FAST = {
    "max_steps": 6,
    "eval_problems": 8,
    "check_every": 3,
    "check_problems": 16,
    "max_new_tokens": 8,
    "batch_size": 16,
}


def test_warm_start_builds_a_loadable_directory_and_reuses_it(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    first = ensure_warm_start(cache_dir, task_name="arithmetic", seed=0, **FAST)

    assert first.parent == cache_dir
    metadata = json.loads((first / METADATA_FILE).read_text())
    assert metadata["sft_steps"] == FAST["max_steps"]
    assert metadata["eval_sample_size"] == FAST["eval_problems"]
    assert 0.0 <= metadata["eval_success"] <= 1.0
    assert metadata["train_seconds"] > 0
    assert metadata["settings"]["seed"] == 0

    tokenizer = AutoTokenizer.from_pretrained(first)
    model = AutoModelForCausalLM.from_pretrained(first)
    assert next(model.parameters()).dtype == torch.float32
    problem = get_task("arithmetic").problems("eval", 1, seed=0)[0]
    prompt = torch.tensor([encode_prompt(tokenizer, problem.prompt)])
    output = model.generate(
        input_ids=prompt, max_new_tokens=4, do_sample=False, pad_token_id=tokenizer.pad_token_id
    )
    assert output.shape[1] > prompt.shape[1]

    # The second call finds the complete directory and trains nothing.
    stamp = (first / METADATA_FILE).stat().st_mtime_ns
    second = ensure_warm_start(cache_dir, task_name="arithmetic", seed=0, **FAST)
    assert second == first
    assert (first / METADATA_FILE).stat().st_mtime_ns == stamp
    # No staging directory is left behind (only the lock file that serialises training).
    assert [path.name for path in cache_dir.iterdir() if path.suffix != ".lock"] == [first.name]

    # Other settings live in another directory.
    other = ensure_warm_start(cache_dir, task_name="arithmetic", seed=1, **FAST)
    assert other != first


def test_an_incomplete_directory_is_not_reused(tmp_path: Path) -> None:
    cache_dir = tmp_path / "cache"
    first = ensure_warm_start(cache_dir, **FAST)
    (first / METADATA_FILE).unlink()
    # A directory without its metadata file counts as absent and is rebuilt.
    again = ensure_warm_start(cache_dir, **FAST)
    assert again == first
    assert (again / METADATA_FILE).is_file()


def test_evaluate_success_scores_greedy_generations() -> None:
    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer)
    task = get_task("arithmetic")
    problems = task.problems("eval", 5, seed=0)
    # An untrained model never writes a correct answer; the helper restores training mode.
    model.train()
    assert evaluate_success(model, tokenizer, task, problems, max_new_tokens=8, batch_size=2) == 0.0
    assert model.training


def test_micro_batches_give_the_whole_batch_gradient() -> None:
    tokenizer = build_tokenizer()
    task = get_task("arithmetic")
    examples = _examples(task, tokenizer, task.problems("train", 32, seed=0))
    torch.manual_seed(0)
    model = build_tiny_model(tokenizer)
    results = []
    for micro_batches in (1, 4):
        settings = replace(WarmStartSettings(), batch_size=32, micro_batches=micro_batches)
        (step,) = _training_batches(examples, settings, tokenizer.pad_token_id)
        assert len(step) == micro_batches
        model.zero_grad()
        loss = _accumulate_step_loss(model, step)
        results.append((loss, torch.cat([parameter.grad.flatten() for parameter in model.parameters()])))
    (whole_loss, whole_grad), (split_loss, split_grad) = results
    assert abs(whole_loss - split_loss) < 1e-5
    torch.testing.assert_close(split_grad, whole_grad, atol=1e-6, rtol=1e-4)


def test_concurrent_processes_train_one_warm_start_and_share_it(tmp_path: Path) -> None:
    """Two processes asking for the same warm start at once (parallel test workers, two `make run`s):
    one trains it, the other waits on the cache's lock and reuses the result.

    The interleaving is arranged, not hoped for: the test holds the warm start's lock until both
    processes have said they are waiting for it, then lets them go.
    """
    script = (
        "import json, sys\n"
        "from rich.console import Console\n"
        "from pipelinerl.launch.warmstart import ensure_warm_start\n"
        f"path = ensure_warm_start(sys.argv[1], console=Console(), **{FAST!r})\n"
        "print('RESULT', path)\n"
    )
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    target = warm_start_dir(cache_dir, WarmStartSettings(**FAST))
    logs = [tmp_path / f"process{index}.log" for index in range(2)]
    with FileLock(warm_start_lock(target)):
        processes = [
            subprocess.Popen(
                [sys.executable, "-u", "-c", script, str(cache_dir)],
                stdout=log.open("w"),
                stderr=subprocess.STDOUT,
                text=True,
            )
            for log in logs
        ]
        try:
            deadline = time.monotonic() + 120
            while not all("waiting for it" in log.read_text() for log in logs):
                said = [log.read_text() for log in logs]
                assert all(process.poll() is None for process in processes), f"one exited early: {said}"
                assert time.monotonic() < deadline, f"not both processes waited for the lock: {said}"
                time.sleep(0.1)
        except BaseException:
            for process in processes:
                process.kill()
            raise
    for process in processes:
        process.wait(timeout=300)
    outputs = [log.read_text() for log in logs]
    assert [process.returncode for process in processes] == [0, 0], outputs
    lines = [line for out in outputs for line in out.splitlines()]
    results = {line.removeprefix("RESULT ") for line in lines if line.startswith("RESULT ")}
    assert results == {str(target)}, outputs
    trained = [out for out in outputs if "saved to" in out]
    reused = [out for out in outputs if "warm-start: reusing" in out]
    assert len(trained) == 1 and len(reused) == 1, "one process trained, the other reused its result"
    assert [p.name for p in cache_dir.iterdir() if p.suffix != ".lock"] == [target.name]
