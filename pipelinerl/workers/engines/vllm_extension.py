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
* An update is received whole and hashed before any of it is loaded (``WeightGroup.receive_update``):
  streamed into ``reload_weights``, the buckets before an altered one would already be in the model,
  which would then hold neither version. The worker answers its digests; the actor, which holds the
  authenticated channel the trainer's digests come over, compares them and tells the worker to keep
  the update (staged, loaded by ``pipelinerl_load_received``) or to drop it (``checked_receive``).
  The price is one update's worth of receive buffers while it loads (streaming held one bucket).
* Method names carry a ``pipelinerl_`` prefix: vLLM refuses an extension whose names already exist
  on the worker (``update_weights``, ``reload_weights``, ... are taken).

Runs inside ``.venv-vllm``: imports only torch, vLLM and ``pipelinerl.platform.weights`` (torch).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from pipelinerl.platform.weights import ReceivedUpdate, WeightGroup

EXTENSION = "pipelinerl.workers.engines.vllm_extension.WeightGroupExtension"


class WeightGroupExtension:
    """Methods added to every vLLM worker; ``self`` is the worker (``reload_weights``, ``device``)."""

    _pipelinerl_group: Any = None
    _pipelinerl_pending: tuple[list[str], ReceivedUpdate] | None = None
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

    def pipelinerl_receive(
        self, names: list[str], shapes: list[list[int]], dtypes: list[str]
    ) -> dict[str, Any]:
        """Receive one update whole, every bucket hashed, into a pending slot; answers the seconds it
        took and the hex digest of every bucket. Nothing is staged or loaded until
        ``pipelinerl_keep_received(True)``; what an earlier update staged stays until then."""
        if self._pipelinerl_group is None:
            raise RuntimeError("this worker has not joined a weight group (pipelinerl_join_weight_group)")
        started = time.perf_counter()
        try:
            update = self._pipelinerl_group.receive_update(shapes, dtypes)
        except RuntimeError as error:  # gloo: the trainer died in the middle of the broadcast
            # Answered, not raised: a worker that raises fails vLLM's engine core with it, and the actor
            # may outlive the trainer's restart (it joins the new group, pipelinerl_join_weight_group).
            self._pipelinerl_group = None
            return {"broken": str(error)}
        self._pipelinerl_pending = (names, update)
        return {
            "seconds": time.perf_counter() - started,
            "digests": [digest.hex() for digest in update.digests],
        }

    def pipelinerl_keep_received(self, keep: bool) -> None:
        """Stage the pending update (its digests matched the trainer's) or drop it (they did not)."""
        if self._pipelinerl_pending is None:
            raise RuntimeError("no received weights are pending: call pipelinerl_receive first")
        (names, update), self._pipelinerl_pending = self._pipelinerl_pending, None
        if keep:
            self._pipelinerl_staged = list(zip(names, update.tensors(), strict=True))

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
