"""vLLM worker extension: receives the policy's weights over the weight group and loads them in place.

vLLM mixes this class into each of its worker processes (``AsyncEngineArgs(worker_extension_cls=
EXTENSION)``); the actor calls its methods with ``AsyncLLM.collective_rpc`` while generation is
paused (``vllm_engine.py``). The worker, not the actor process, is the member of the weight group,
so tensors go from trainer rank 0 straight into the process that holds the model.

Invariants, each learnt the hard way on vLLM 0.32 (``ENVIRONMENT.md``):

* Weights are loaded with the worker's ``reload_weights(weights_iterator=..., is_checkpoint_format=
  True)`` in **one call per update**: vLLM fuses checkpoint tensors (q/k/v, gate/up) and, on CPU,
  repacks linear weights after loading; loading one tensor per call silently corrupts fused layers,
  and ``model.load_weights`` alone skips the repacking.
* A tied LM head is repacked after every reload. On CPU, vLLM keeps a packed copy of the LM head's
  weight for its GEMM; with tied embeddings the head receives no checkpoint tensor of its own, so
  the reload leaves that copy stale: the body ran the new weights and the logits the old embedding
  (log-probs off by about 1 on the test models, no error).
* Tensors arrive through the process group, never as ``collective_rpc`` arguments (those are
  serialised into lists).
* An update whose notice carries digests is received whole and checked before any of it is loaded
  (``WeightGroup.receive``): streamed into ``reload_weights``, the buckets before a refused one would
  already be in the model, which would then hold neither version. The price is one update's worth of
  receive buffers while it loads (streaming holds one bucket); updates without digests (tests,
  benchmarks) still stream. A refused update loads nothing and is answered, not raised: an exception
  crosses ``collective_rpc`` as text, so each call returns ``received``'s mapping (seconds, refused
  buckets, reason) and the actor's side raises ``BucketsRefused`` from it (``vllm_engine``).
* Method names carry a ``pipelinerl_`` prefix: vLLM refuses an extension whose names already exist
  on the worker (``update_weights``, ``reload_weights``, ... are taken).

Runs inside ``.venv-vllm``: imports only torch, vLLM and ``pipelinerl.platform.weights`` (torch).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from pipelinerl.platform.weights import BucketsRefused, WeightGroup

EXTENSION = "pipelinerl.workers.engines.vllm_extension.WeightGroupExtension"


class WeightGroupExtension:
    """Methods added to every vLLM worker; ``self`` is the worker (``reload_weights``, ``device``)."""

    _pipelinerl_group: Any = None
    _pipelinerl_staged: list[tuple[str, torch.Tensor]] | None = None

    def pipelinerl_join_weight_group(
        self, host: str, port: int, first_rank: int, world_size: int, timeout_s: float
    ) -> int:
        """Join the trainer's weight group on the terms (backend, bucket size) the trainer published;
        returns this worker's group rank.

        A tensor-parallel engine has one worker per shard; each joins as ``first_rank + tp_rank`` and
        receives the full tensors (``reload_weights`` shards them), so an engine of TP size t takes t
        ranks of the group.
        """
        from vllm.distributed import get_tensor_model_parallel_rank  # noqa: PLC0415 (optional: vLLM, present in its workers)

        rank = first_rank + get_tensor_model_parallel_rank()
        device = self.device  # type: ignore[attr-defined]
        self._pipelinerl_group = WeightGroup.join(
            host, port, rank, world_size, timeout_s=timeout_s, device=device
        )
        return rank

    def pipelinerl_receive_and_load(
        self,
        names: list[str],
        shapes: list[list[int]],
        dtypes: list[str],
        digests: list[bytes] | None = None,
    ) -> dict[str, Any]:
        """Receive every tensor of one update and load them all in one ``reload_weights`` call.

        With ``digests``, the update is received and checked whole first (``pipelinerl_receive``) and
        loaded only if no bucket was refused. Without, each bucket is received as the loader asks for
        its first tensor (streaming: one bucket of receive buffer at a time). Returns ``received``'s
        mapping, its seconds the whole call's.
        """
        started = time.perf_counter()
        if digests is not None:
            answer = self.pipelinerl_receive(names, shapes, dtypes, digests)
            if not answer["refused"]:
                self.pipelinerl_load_received()
            return received(time.perf_counter() - started, answer["refused"], answer["reason"])
        self.reload_weights(  # type: ignore[attr-defined]
            weights_iterator=self._pipelinerl_receive(names, shapes, dtypes, None),
            is_checkpoint_format=True,
        )
        self.pipelinerl_refresh_tied_lm_head()
        return received(time.perf_counter() - started)

    def pipelinerl_receive(
        self,
        names: list[str],
        shapes: list[list[int]],
        dtypes: list[str],
        digests: list[bytes] | None = None,
    ) -> dict[str, Any]:
        """Receive one update into staging buffers (loaded later by ``pipelinerl_load_received``);
        an update with a refused bucket stages nothing (what an earlier update staged stays)."""
        started = time.perf_counter()
        try:
            self._pipelinerl_staged = list(self._pipelinerl_receive(names, shapes, dtypes, digests))
        except BucketsRefused as refused:
            return received(time.perf_counter() - started, refused.buckets, refused.reason)
        return received(time.perf_counter() - started)

    def pipelinerl_load_received(self) -> float:
        """Load the staged update in one ``reload_weights`` call and free the staging buffers."""
        if self._pipelinerl_staged is None:
            raise RuntimeError("no received weights are staged: call pipelinerl_receive first")
        started = time.perf_counter()
        staged, self._pipelinerl_staged = self._pipelinerl_staged, None
        self.reload_weights(weights_iterator=iter(staged), is_checkpoint_format=True)  # type: ignore[attr-defined]
        self.pipelinerl_refresh_tied_lm_head()
        return time.perf_counter() - started

    def pipelinerl_tokens_in_flight(self) -> dict[str, list[int]]:
        """``request id -> [output tokens so far, last output token]`` for every request in this
        worker's batch, as the worker itself recorded them; read while generation is paused.

        A request that finished at the last step stays listed until the next one (its last token is
        then the stop token, or it has the maximum count); with asynchronous scheduling (off on CPU)
        the newest token is a placeholder, -1.
        """
        requests = self.model_runner.requests  # type: ignore[attr-defined]
        return {
            request_id: [len(tokens := state.output_token_ids), tokens[-1] if tokens else -1]
            for request_id, state in requests.items()
        }

    def pipelinerl_refresh_tied_lm_head(self) -> bool:
        """Re-derive a tied LM head's kernel state from the (reloaded) embedding; True if there was one.

        ``process_weights_after_loading`` of the head's method repacks the CPU GEMM weight from the
        shared parameter; on GPU it leaves the head as it is.
        """
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        lm_head = getattr(model, "lm_head", None)
        config = getattr(model, "config", None)
        if lm_head is None or not getattr(config, "tie_word_embeddings", False):
            return False
        method = getattr(lm_head, "quant_method", None)
        if method is None:
            return False
        method.process_weights_after_loading(lm_head)
        return True

    def _pipelinerl_receive(
        self, names: list[str], shapes: list[list[int]], dtypes: list[str], digests: list[bytes] | None
    ) -> Iterator[tuple[str, torch.Tensor]]:
        if self._pipelinerl_group is None:
            raise RuntimeError("this worker has not joined a weight group (pipelinerl_join_weight_group)")
        yield from zip(names, self._pipelinerl_group.receive(shapes, dtypes, digests), strict=True)


def received(seconds: float, refused: list[int] | None = None, reason: str = "") -> dict[str, Any]:
    """What a worker answers for an update it received: the seconds it took and the buckets it
    refused (none: the update is staged or loaded), with why (``WeightGroup.receive``)."""
    return {"seconds": seconds, "refused": list(refused or []), "reason": reason}
