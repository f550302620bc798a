"""The ``transformers`` actor engine: continuous batching with in-flight weight updates.

Built on transformers' ``ContinuousBatchingManager``: a background loop keeps up to H requests in
flight; a finished request leaves and the actor submits a new prompt in its slot. Its ``pause()``
context parks the loop between two decode steps, keeping in-flight requests and their KV cache,
so weights can be changed in place there (paper §3: the cache computed under older weights is
kept).

Version stamping: inside the pause, for every request still being written we read how many tokens
it has generated so far; every later token belongs to the new version. A request may be

* in the scheduler (``active_requests`` / ``waiting_requests``): tokens so far are its generated
  tokens plus, after a "soft reset" (cache full, prefix re-queued as prompt), the generated
  tokens folded into its prompt;
* finished, its result not yet collected by ``poll``: no switch (all its tokens are older);
* not yet picked up by the loop: 0 tokens, so all of its tokens get the new version.

Invariants: weights change only inside ``pause()``; ``_lock`` serialises stamping against
``poll`` so a result is never finalised while a switch is being recorded.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import transformers

try:
    from transformers import ContinuousBatchingConfig, GenerationConfig, GenerationMixin, PreTrainedModel
    from transformers.generation.continuous_batching.requests import (
        GenerationOutput,
        RequestState,
        RequestStatus,
    )
except ImportError as error:  # an environment built for vLLM, whose release pins an older transformers
    raise ImportError(
        f"the transformers engine needs transformers>=5.20 (continuous batching with pause); this "
        f"environment has {transformers.__version__}: install the extra "
        f"`pip install 'pipelinerl[transformers-engine]'`, or set actor.engine=vllm"
    ) from error

from pipelinerl.workers.engines.protocol import CompletedSequence, VersionSwitches

logger = logging.getLogger(__name__)


def tokens_generated(state: RequestState) -> int:
    """Tokens a request has generated so far, counting those folded into its prompt by a soft reset."""
    folded = len(state.initial_tokens) - state._true_initial_tokens if state._true_initial_tokens else 0
    return len(state.generated_tokens) + folded


class TransformersEngine:
    """H sequences in flight on a transformers model; weights swap between two decode steps."""

    def __init__(
        self,
        model: PreTrainedModel,
        *,
        eos_token_id: int | Sequence[int],
        max_in_flight: int,
        max_new_tokens: int,
        max_prompt_tokens: int,
        temperature: float = 1.0,
        kv_block_size: int = 32,
        kv_cache_blocks: int = 0,
        seed: int | None = None,
        policy_version: int = 0,
    ) -> None:
        if not isinstance(model, GenerationMixin):  # continuous batching is a generation method
            raise TypeError(f"{type(model).__name__} cannot generate: give a causal language model")
        self.model = model
        # Every id that ends a sequence (a model may list several: Llama 3 instruct does).
        self.eos_token_ids = (eos_token_id,) if isinstance(eos_token_id, int) else tuple(eos_token_id)
        if not self.eos_token_ids:
            raise ValueError("eos_token_id: give at least one end-of-sequence id")
        self.max_in_flight = max_in_flight
        self.max_new_tokens = max_new_tokens
        self.policy_version = policy_version
        self.last_update_s: dict[str, float] = {}  # phases of the last update_weights, seconds
        blocks_per_sequence = math.ceil((max_prompt_tokens + max_new_tokens) / kv_block_size)
        # Room for H full sequences so no request is ever soft-reset (its prefix recomputed under
        # newer weights) or, worse, larger than the whole cache (which kills the manager).
        num_blocks = kv_cache_blocks or max_in_flight * blocks_per_sequence + 1
        if num_blocks < blocks_per_sequence:
            raise ValueError(
                f"actor.kv_cache_blocks={kv_cache_blocks} cannot hold one sequence of "
                f"{max_prompt_tokens + max_new_tokens} tokens; need at least {blocks_per_sequence}"
            )
        generation_config = GenerationConfig(
            do_sample=True,
            temperature=temperature,
            top_k=None,
            top_p=None,
            max_new_tokens=max_new_tokens,
            eos_token_id=list(self.eos_token_ids),
            pad_token_id=self.eos_token_ids[0],
        )
        cb_config = ContinuousBatchingConfig(
            page_size=kv_block_size,
            num_blocks=num_blocks,
            max_batch_tokens=max(256, max_in_flight * 4),
            max_requests_per_batch=max_in_flight,
            return_logprobs=True,
            # Block sharing would let a new prompt reuse KV blocks written by an older policy.
            allow_block_sharing=False,
            use_async_batching=False,
            use_cuda_graph=False,
            auto_switch_to_flash=False,
            seed=seed,
        )
        self._manager = model.init_continuous_batching(
            generation_config=generation_config, continuous_batching_config=cb_config
        )
        self._lock = threading.Lock()
        self._outstanding: dict[str, tuple[list[int], VersionSwitches]] = {}
        self._manager.start()

    @property
    def num_in_flight(self) -> int:
        return len(self._outstanding)

    def submit(self, request_id: str, prompt_token_ids: Sequence[int], greedy: bool = False) -> None:
        """Start writing a completion. ``greedy`` is refused: the continuous batch samples every request
        at the engine's temperature (the config says so before a run starts: eval.greedy)."""
        if greedy:
            raise ValueError("the transformers engine cannot decode a request greedily; use the vllm engine")
        prompt = list(prompt_token_ids)
        with self._lock:
            self._outstanding[request_id] = (prompt, VersionSwitches(self.policy_version))
        accepted = self._manager.add_request(
            prompt, request_id=request_id, max_new_tokens=self.max_new_tokens
        )
        if accepted is None:
            raise RuntimeError(f"the generation loop refused request {request_id}: {self._failure()}")

    def poll(self, timeout_s: float) -> list[CompletedSequence]:
        """Finished sequences: waits up to ``timeout_s`` for the first, then takes what else is ready."""
        output_queue = self._manager.output_router.output_queue
        with output_queue.not_empty:  # wait without taking: taking happens under the stamping lock
            if not output_queue.queue:
                output_queue.not_empty.wait(timeout_s)
        completed: list[CompletedSequence] = []
        with self._lock:
            while not output_queue.empty():
                result = output_queue.get_nowait()
                if result.request_id not in self._outstanding:  # aborted: its end is nobody's
                    continue
                if result.status == RequestStatus.FAILED:
                    raise RuntimeError(f"generation of {result.request_id} failed: {result.error}")
                if result.is_finished():
                    completed.append(self._complete(result))
        if not completed and self._outstanding and not self._manager.is_running():
            raise RuntimeError(f"the generation loop stopped with requests in flight: {self._failure()}")
        return completed

    def abort(self, request_ids: Sequence[str]) -> None:
        """Stop writing these requests and forget them: ``poll`` never returns them."""
        with self._lock:
            for request_id in request_ids:
                if self._outstanding.pop(request_id, None) is not None:
                    self._manager.cancel_request(request_id)

    def _complete(self, result: GenerationOutput) -> CompletedSequence:
        prompt, switches = self._outstanding.pop(result.request_id)
        tokens = list(result.generated_tokens)
        return CompletedSequence(
            request_id=result.request_id,
            prompt_token_ids=prompt,
            completion_token_ids=tokens,
            behaviour_logprobs=[float(value) for value in result.logprobs],
            token_versions=switches.versions(len(tokens)),
            finished=bool(tokens) and tokens[-1] in self.eos_token_ids,
        )

    def _failure(self) -> str:
        error = self._manager.background_thread_status.fatal_error
        return repr(error) if error is not None else "the loop is not running"

    @contextmanager
    def paused(self) -> Iterator[torch.nn.Module]:
        """Hold the generation loop between two decode steps; the model may be read or changed."""
        with self._manager.pause():
            yield self.model

    def update_weights(self, new_version: int, load: Callable[[torch.nn.Module], object]) -> float:
        """Between two decode steps: ``load(model)`` in place, then stamp every in-flight request."""
        started = time.perf_counter()
        with self._manager.pause(), self._lock:
            paused = time.perf_counter()
            counts = self._tokens_so_far()
            with torch.no_grad():
                load(self.model)
            loaded = time.perf_counter()
            for request_id, (_, switches) in self._outstanding.items():
                count = counts.get(request_id, 0)
                if count is not None:
                    switches.switches.append((count, new_version))
            self.policy_version = new_version
        ended = time.perf_counter()
        self.last_update_s = {
            "pause": paused - started,
            "load": loaded - paused,
            "label_resume": ended - loaded,
        }
        return ended - started

    def tokens_in_flight(self) -> dict[str, int]:
        """Tokens each request still being written has generated so far; call it from the ``load`` of
        ``update_weights`` (inside the pause, where nothing moves)."""
        return {request_id: count for request_id, count in self._tokens_so_far().items() if count is not None}

    def _tokens_so_far(self) -> dict[str, int | None]:
        """Per outstanding request: tokens generated before this pause, or None if it already finished."""
        processor = self._manager.batch_processor
        counts: dict[str, int | None] = {}
        if processor is not None:
            scheduler = processor.scheduler
            for states in (scheduler.active_requests, scheduler.waiting_requests):
                for request_id, state in states.items():
                    counts[request_id] = tokens_generated(state)
        output_queue = self._manager.output_router.output_queue
        with output_queue.mutex:
            for output in list(output_queue.queue):
                if output.is_finished():
                    counts[output.request_id] = None
        return counts

    def close(self) -> None:
        try:
            self._manager.stop(block=True, hard_stop=True, timeout=30)
        finally:
            self._manager.destroy()
