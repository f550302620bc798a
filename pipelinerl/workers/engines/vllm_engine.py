"""The ``vllm`` actor engine: vLLM's async engine (``AsyncLLM``) with in-flight weight updates.

vLLM's scheduler keeps up to H requests in flight (continuous batching); the actor submits a new
prompt whenever one finishes. The engine runs in its own processes (an engine core and one worker
per tensor-parallel shard); this module drives it from an asyncio loop on a background thread, so
the actor calls it synchronously like the transformers engine (``protocol.py``'s ``Engine``).

Behaviour log-probs: the engine is built with ``logprobs_mode="processed_logprobs"``, so the
log-prob vLLM returns for each sampled token is taken from the distribution the sampler actually
drew from, after temperature (and top-k/top-p, which the actor leaves off), renormalised; vLLM's
default, ``raw_logprobs``, would give the log-prob under the model's untempered softmax instead.

In-flight update (paper §3), one call of ``update_weights``:

1. ``pause_generation(mode="keep")``: the scheduler stops between two engine steps; in-flight
   requests stay queued with their KV cache (``kv_cache_on_update="keep"``, the paper's behaviour),
   or, with ``"recompute"``, the cache is cleared (``clear_cache=True``): every running request is
   preempted and its prefix is recomputed under the new weights when generation resumes;
2. ``load(workers)``: the worker extension (``vllm_extension.py``) receives the tensors over the
   weight group, the actor checks their digests against the trainer's (``checked_receive``), and
   the workers load them in one ``reload_weights`` call;
3. the version stamp (below); on releases that have it, ``update_weight_version(str(version))``
   too, which labels vLLM's own output (a cross-check only);
4. ``resume_generation()``.

Version stamps come from the engine's own record, as in the transformers engine, so that they hold
on every supported release (0.26 has no version labels, 0.27 no per-output ones): inside the pause,
the workers report how many output tokens each request in their batch has produced
(``tokens_in_flight``; preempted requests keep their state there); every later token of that
request belongs to the new version. A request absent from that record either has not been
scheduled yet (0 tokens: all of its tokens are the new version's) or has finished; a finished one
is marked when its final output reaches this process, and gets no switch. Weights change only
inside the pause and the record is read there, after the load, so nothing moves while it is read.
Where vLLM also labels its output (``CompletionOutput.weight_versions``, 0.32), each completion's
labels are compared with the stamps; a disagreement is logged and counted in
``stamp_disagreements`` (the engine tests require 0).

Prefix caching is off: with it, a new prompt that shares a prefix with an earlier one would reuse
KV blocks written by older weights.

Runs inside ``.venv-vllm`` (``make vllm-env``): imports only the base dependencies and vLLM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pipelinerl.workers.engines.protocol import CompletedSequence, VersionSwitches, WorkersReceipt
from pipelinerl.workers.engines.vllm_extension import EXTENSION

logger = logging.getLogger(__name__)

KvCacheOnUpdate = Literal["keep", "recompute"]
CudaGraphs = Literal["auto", "on", "off"]
T = TypeVar("T")

# vLLM's CPU attention kernels take KV-cache blocks in multiples of 32 tokens.
CPU_BLOCK_SIZE = 32
CPU_KV_CACHE_GIB = 1.0


def device_engine_args(
    *,
    on_cpu: bool,
    max_model_len: int,
    kv_cache_gib: float | None,
    gpu_memory_utilization: float,
    cuda_graphs: CudaGraphs,
) -> dict[str, Any]:
    """The engine arguments that differ between vLLM's CPU build and a GPU.

    CPU: KV-cache blocks of ``CPU_BLOCK_SIZE`` tokens, a cache of ``kv_cache_gib`` (1 GiB when empty), a
    token budget per step of at least one whole sequence, eager execution. GPU: vLLM's own block size
    and token budget, the cache sized by ``kv_cache_gib`` when given, else by ``gpu_memory_utilization``,
    and CUDA graphs unless ``cuda_graphs`` is "off".
    """
    if cuda_graphs not in ("auto", "on", "off"):
        raise ValueError(f"cuda_graphs={cuda_graphs!r}: expected 'auto', 'on' or 'off'")
    if on_cpu:
        if cuda_graphs == "on":
            raise ValueError("actor.cuda_graphs='on' needs a GPU: vLLM's CPU build runs eagerly")
        return {
            "block_size": CPU_BLOCK_SIZE,
            "max_num_batched_tokens": max(max_model_len, 2048),
            "kv_cache_memory_bytes": int((kv_cache_gib or CPU_KV_CACHE_GIB) * 2**30),
            "enforce_eager": True,
        }
    cache: dict[str, Any] = (
        {"kv_cache_memory_bytes": int(kv_cache_gib * 2**30)}
        if kv_cache_gib is not None
        else {"gpu_memory_utilization": gpu_memory_utilization}
    )
    return {**cache, "enforce_eager": cuda_graphs == "off"}


@dataclass(frozen=True)
class WeightGroupAddress:
    """Where the engine's workers join the trainer's weight group, and as which ranks."""

    host: str
    port: int
    first_rank: int  # this engine's workers take first_rank .. first_rank + tensor_parallel_size - 1
    world_size: int
    timeout_s: float = 300.0  # the backend and bucket size are the trainer's, read from the group's store


class WeightGroupBroken(RuntimeError):
    """A worker's receive failed in the weight group (the trainer died in the middle of a broadcast)."""


class VLLMWorkers:
    """What ``update_weights``' ``load`` receives: the engine's workers, reached by collective RPC.

    Each method runs on every worker (one per tensor-parallel shard) and returns the slowest's seconds.
    """

    def __init__(self, engine: VLLMEngine) -> None:
        self._engine = engine

    def receive(self, names: list[str], shapes: list[list[int]], dtypes: list[str]) -> WorkersReceipt:
        """Every worker receives one update whole into a pending slot and hashes every bucket
        (``vllm_extension.pipelinerl_receive``); nothing is staged before ``keep_received``."""
        answers = self._engine.rpc("pipelinerl_receive", names, shapes, dtypes)
        if broken := [answer["broken"] for answer in answers if "broken" in answer]:
            raise WeightGroupBroken(f"the weight group broke during the update: {broken[0]}")
        return WorkersReceipt(
            seconds=max(answer["seconds"] for answer in answers),
            digests=[[bytes.fromhex(digest) for digest in answer["digests"]] for answer in answers],
        )

    def keep_received(self, keep: bool) -> None:
        """Stage the update just received (its digests matched the trainer's) or drop it."""
        self._engine.rpc("pipelinerl_keep_received", keep)

    def tokens_in_flight(self) -> dict[str, tuple[int, int]]:
        """``request id -> (output tokens so far, last token)`` in the engine's batch (first worker's
        record; call while paused). vLLM may suffix the ids it was given."""
        first, *_ = self._engine.rpc("pipelinerl_tokens_in_flight")
        return {request_id: (count, last) for request_id, (count, last) in first.items()}

    def load_received(self) -> float:
        """Load the update received and kept earlier (one ``reload_weights`` call per worker)."""
        return max(self._engine.rpc("pipelinerl_load_received"))


class VLLMEngine:
    """H sequences in flight on vLLM; weights swap between two engine steps."""

    def __init__(
        self,
        model_path: Path | str,
        *,
        eos_token_id: int | Sequence[int],
        max_in_flight: int,
        max_new_tokens: int,
        max_prompt_tokens: int,
        temperature: float = 1.0,
        seed: int | None = None,
        policy_version: int = 0,
        kv_cache_on_update: KvCacheOnUpdate = "keep",
        weight_group: WeightGroupAddress | None = None,
        dtype: str = "float32",
        kv_cache_gib: float | None = None,
        gpu_memory_utilization: float = 0.9,
        cuda_graphs: CudaGraphs = "auto",
        lm_head_fp32: bool = False,
        tensor_parallel_size: int = 1,
        cpu_threads: int | None = None,
    ) -> None:
        from vllm import SamplingParams
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.sampling_params import RequestOutputKind

        if kv_cache_on_update not in ("keep", "recompute"):
            raise ValueError(f"kv_cache_on_update={kv_cache_on_update!r}: expected 'keep' or 'recompute'")
        # Every id that ends a sequence (a model may list several: Llama 3 instruct does).
        self.eos_token_ids = (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)
        if not self.eos_token_ids:
            raise ValueError("eos_token_id: give at least one end-of-sequence id")
        self.max_new_tokens = max_new_tokens
        self.policy_version = policy_version
        self.kv_cache_on_update: KvCacheOnUpdate = kv_cache_on_update
        sampling: dict[str, Any] = dict(
            n=1,
            top_p=1.0,
            top_k=0,
            max_tokens=max_new_tokens,
            stop_token_ids=list(self.eos_token_ids),
            logprobs=0,  # the sampled token's log-prob only
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        self._sampling = SamplingParams(temperature=temperature, **sampling)
        self._greedy_sampling = SamplingParams(temperature=0.0, **sampling)  # evaluation (eval.greedy)
        max_model_len = max_prompt_tokens + max_new_tokens
        engine_args = AsyncEngineArgs(
            model=str(model_path),
            skip_tokenizer_init=True,  # the actor tokenizes; vLLM sees token ids only
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_in_flight,
            enable_prefix_caching=False,  # old-weights KV blocks must not serve new prompts
            tensor_parallel_size=tensor_parallel_size,
            logprobs_mode="processed_logprobs",  # behaviour log-probs after temperature
            worker_extension_cls=EXTENSION,
            disable_log_stats=True,
            # vLLM's switch for an fp32 head (model.lm_head_fp32, lm_head.py); a no-op with float32 weights.
            hf_overrides={"head_dtype": "float32"} if lm_head_fp32 else {},
            **device_engine_args(
                on_cpu=current_platform.is_cpu(),
                max_model_len=max_model_len,
                kv_cache_gib=kv_cache_gib,
                gpu_memory_utilization=gpu_memory_utilization,
                cuda_graphs=cuda_graphs,
            ),
        )
        self._results: queue.Queue[CompletedSequence | BaseException] = queue.Queue()
        # Per request still outstanding: the versions that wrote it (stamped in update_weights).
        # _stamps_lock orders stamping (actor or weights thread) against a completion (loop thread).
        self._outstanding: dict[str, VersionSwitches] = {}
        self._finished: set[str] = set()
        self._stamps_lock = threading.Lock()
        self.stamp_disagreements = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-engine", daemon=True)
        self._thread.start()
        started = time.perf_counter()
        try:
            self._engine = self._call(self._create(engine_args, cpu_threads))
            self._labels = hasattr(self._engine, "update_weight_version")  # 0.27 and newer
            if self._labels:
                self._call(self._engine.update_weight_version(str(policy_version)))
            self._weight_group = weight_group
            if weight_group is not None:
                self.rpc(
                    "pipelinerl_join_weight_group",
                    weight_group.host,
                    weight_group.port,
                    weight_group.first_rank,
                    weight_group.world_size,
                    weight_group.timeout_s,
                )
        except BaseException:
            self._stop_loop()
            raise
        self.startup_s = time.perf_counter() - started
        self.last_update_s: dict[str, float] = {}  # phases of the last update_weights, seconds
        self.workers = VLLMWorkers(self)

    @staticmethod
    async def _create(engine_args: Any, cpu_threads: int | None) -> Any:
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        # The KV cache is sized by kv_cache_memory_bytes; vLLM's CPU platform lets this legacy
        # variable override it, so a stray value from the environment must not.
        os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        if cpu_threads is not None and current_platform.is_cpu():
            # vLLM on CPU pins one OpenMP thread to every core by default; the actor shares the
            # machine with the trainer, so its workers run cpu_threads threads, unpinned.
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
            os.environ["OMP_NUM_THREADS"] = str(cpu_threads)
        return AsyncLLM.from_engine_args(engine_args)

    def _call(self, coroutine: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    def rpc(self, method: str, *args: Any) -> list[Any]:
        """Call a worker-extension method on every worker; returns their results in rank order."""
        return self._call(self._engine.collective_rpc(method, args=args))

    # ----- generation -----

    @property
    def num_in_flight(self) -> int:
        return len(self._outstanding)

    def submit(self, request_id: str, prompt_token_ids: Sequence[int], greedy: bool = False) -> None:
        """Start writing a completion; ``greedy``: at temperature 0 (evaluation) instead of the engine's."""
        prompt = list(prompt_token_ids)
        sampling = self._greedy_sampling if greedy else self._sampling
        with self._stamps_lock:
            self._outstanding[request_id] = VersionSwitches(self.policy_version)
        self._loop.call_soon_threadsafe(self._start_request, request_id, prompt, sampling)

    def _start_request(self, request_id: str, prompt: list[int], sampling: Any) -> None:
        task = self._loop.create_task(self._generate(request_id, prompt, sampling), name=request_id)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _generate(self, request_id: str, prompt: list[int], sampling: Any) -> None:
        try:
            final = None
            async for output in self._engine.generate(
                {"prompt_token_ids": prompt}, sampling, request_id=request_id
            ):
                final = output
            if final is None or not final.finished:
                raise RuntimeError(f"vLLM returned no final output for request {request_id}")
            with self._stamps_lock:
                switches = self._outstanding.get(request_id)
                if switches is None:  # aborted as it finished
                    return
                self._finished.add(request_id)
            self._results.put(self._complete(request_id, prompt, final.outputs[0], switches))
        except asyncio.CancelledError:
            raise
        except BaseException as error:  # handed to the actor thread by poll
            self._results.put(RuntimeError(f"generation of {request_id} failed: {error!r}"))

    def _complete(
        self, request_id: str, prompt: list[int], completion: Any, switches: VersionSwitches
    ) -> CompletedSequence:
        tokens = list(completion.token_ids)
        if completion.logprobs is None or len(completion.logprobs) != len(tokens):
            raise RuntimeError(f"request {request_id}: vLLM returned no log-prob for some tokens")
        logprobs = [
            float(position[token].logprob)
            for position, token in zip(completion.logprobs, tokens, strict=True)
        ]
        stamped = switches.versions(len(tokens))
        labels = getattr(completion, "weight_versions", None)  # vLLM 0.32 and newer
        labelled = token_versions(labels, len(tokens), request_id) if labels is not None else stamped
        if labelled != stamped:
            self.stamp_disagreements += 1
            logger.warning(
                "request %s: stamped versions %s disagree with vLLM's labels %s",
                request_id,
                version_runs(stamped),
                version_runs(labelled),
            )
        return CompletedSequence(
            request_id=request_id,
            prompt_token_ids=prompt,
            completion_token_ids=tokens,
            behaviour_logprobs=logprobs,
            token_versions=stamped,
            finished=bool(tokens) and tokens[-1] in self.eos_token_ids,
        )

    def poll(self, timeout_s: float) -> list[CompletedSequence]:
        """Finished sequences: waits up to ``timeout_s`` for the first, then takes what else is ready."""
        items: list[CompletedSequence | BaseException] = []
        try:
            items.append(self._results.get(timeout=timeout_s))
            while True:
                items.append(self._results.get_nowait())
        except queue.Empty:
            pass
        completed = []
        for item in items:
            if isinstance(item, BaseException):
                raise item
            with self._stamps_lock:
                known = self._outstanding.pop(item.request_id, None) is not None
                self._finished.discard(item.request_id)
            if known:  # else aborted after it finished
                completed.append(item)
        if not completed and self._outstanding and self._engine.errored:
            raise RuntimeError(f"the vLLM engine died with {len(self._outstanding)} requests in flight")
        return completed

    def abort(self, request_ids: Sequence[str]) -> None:
        """Stop writing these requests and forget them: ``poll`` never returns them (cancelling a
        request's ``generate`` aborts it in vLLM)."""
        aborted = set(request_ids)
        with self._stamps_lock:
            for request_id in aborted:
                self._outstanding.pop(request_id, None)
                self._finished.discard(request_id)

        def cancel() -> None:
            for task in list(self._tasks):
                if task.get_name() in aborted:
                    task.cancel()

        self._loop.call_soon_threadsafe(cancel)

    def rejoin_weight_group(self) -> None:
        """Every worker joins the weight group again (a restarted trainer leads a new one); blocks until
        the trainer has formed it."""
        group = self._weight_group
        if group is None:
            raise RuntimeError("this engine was started without a weight group")
        self.rpc(
            "pipelinerl_join_weight_group",
            group.host,
            group.port,
            group.first_rank,
            group.world_size,
            group.timeout_s,
        )

    # ----- weights -----

    @contextmanager
    def paused(self) -> Iterator[VLLMWorkers]:
        """Hold generation between two engine steps (cache kept or cleared per ``kv_cache_on_update``)."""
        clear_cache = self.kv_cache_on_update == "recompute"
        self._call(self._engine.pause_generation(mode="keep", clear_cache=clear_cache))
        try:
            yield self.workers
        finally:
            self._call(self._engine.resume_generation())

    def update_weights(self, new_version: int, load: Callable[[VLLMWorkers], Any]) -> float:
        """Between two engine steps: ``load(workers)``, label later tokens ``new_version``, resume.

        Returns the pause in seconds (from asking for it to generation resumed). Every request in
        flight stays in flight.
        """
        started = time.perf_counter()
        with self.paused() as workers:
            paused = time.perf_counter()
            load(workers)
            loaded = time.perf_counter()
            self._stamp(new_version, workers.tokens_in_flight())
            if self._labels:
                self._call(self._engine.update_weight_version(str(new_version)))
        ended = time.perf_counter()
        self.last_update_s = {
            "pause": paused - started,
            "load": loaded - paused,
            "label_resume": ended - loaded,  # stamping the versions, then resuming
        }
        return ended - started

    def _stamp(self, new_version: int, in_flight: dict[str, tuple[int, int]]) -> None:
        """Every outstanding request's later tokens belong to ``new_version`` (module docstring), and so
        do those of every request submitted from now on.

        The engine's version changes under the same lock as the stamps: ``submit`` (another thread,
        during the pause) records a request either before them (and gets its switch here) or after
        them (and starts at ``new_version``). Changed after the lock, a request submitted in between
        would be stamped the old version for tokens the new weights write."""
        produced = {_given_id(request, self._outstanding): count for request, (count, _) in in_flight.items()}
        with self._stamps_lock:
            for request_id, switches in self._outstanding.items():
                if request_id in produced:
                    switches.switches.append((produced[request_id], new_version))
                elif request_id not in self._finished:  # not scheduled yet: none of its tokens exist
                    switches.switches.append((0, new_version))
            self.policy_version = new_version

    # ----- lifecycle -----

    def close(self) -> None:
        try:
            self._call(self._shutdown(), timeout_s=60)
        finally:
            self._stop_loop()

    async def _shutdown(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._engine.shutdown()

    def _stop_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


def _given_id(internal: str, given: dict[str, Any]) -> str:
    """The request id the actor gave for vLLM's internal one (0.32 appends ``-<8 characters>``)."""
    return internal if internal in given else internal.rsplit("-", 1)[0]


def version_runs(versions: Sequence[int]) -> list[tuple[int, int]]:
    """``(version, tokens)`` runs of a stamp list, for messages."""
    runs: list[tuple[int, int]] = []
    for version in versions:
        if runs and runs[-1][0] == version:
            runs[-1] = (version, runs[-1][1] + 1)
        else:
            runs.append((version, 1))
    return runs


def token_versions(spans: Sequence[Any] | None, num_tokens: int, request_id: str = "") -> list[int]:
    """Per-token policy versions from vLLM's weight-version labels (``[start, end)`` and a label),
    where the release has them (the cross-check of the stamps)."""
    if num_tokens == 0:
        return []
    if not spans:
        raise RuntimeError(f"request {request_id}: vLLM reported no weight version for its tokens")
    versions: list[int] = []
    for span in spans:
        if span.start != len(versions):
            raise RuntimeError(
                f"request {request_id}: weight-version spans leave a gap at token {span.start}"
            )
        versions.extend([int(span.version)] * (span.end - span.start))
    if len(versions) != num_tokens:
        raise RuntimeError(
            f"request {request_id}: weight-version spans cover {len(versions)} of {num_tokens} tokens"
        )
    return versions
