"""The trainer stage: a DeepSpeed engine taking one optimizer step per train batch.

Loop (paper §3): take the next batch of B sequences from the preprocessor, compute the RL loss
(``rl/``) over its micro-batches, one optimizer step, policy version +1, then publish the new
weights (``weight_publisher``: a notice, the tensors over the weight group, their digests).
In ``conventional`` mode weights are published only every G steps (after a whole round).

The loss is the recipe ``rl.loss`` names (docs/recipes.md), with ``rl.kl.coef`` > 0 a KL term to a
frozen reference model (the starting weights, loaded beside the policy, outside DeepSpeed's optimizer)
and with ``rl.entropy_coef`` > 0 an entropy bonus.

Every step appends one JSON record to ``metrics.jsonl`` (loss, reward, ESS, clipped fractions, KL and
entropy when on, lag statistics, the behaviour mismatch of its lag-0 tokens, tokens, samples, step and
wait time) and its per-token data
to ``tokens/step_<version>_rank<r>.npz``, from which the statistics can be recomputed. Every
``trainer.checkpoint_every`` versions, and at the end (``final/``), the policy is saved in Hugging
Face format with its version and the optimizer state (``platform/checkpoint.py``);
``run.resume_from`` continues from such a checkpoint. With ``trainer.record_batches`` each step also
keeps its batch (``batches/``) and the digests of the weights it made (``digests/``), and draws its random
numbers from ``step_seed(run.seed, version)``: ``pipelinerl replay`` trains the step again from them
(``workers/replay.py``, with this class's ``train_step``) and checks it to the bit.

Run: ``python -m pipelinerl.workers.trainer --run-dir runs/<id>`` (the launcher does, one process per
rank placed as torchrun places its workers: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``…;
``torchrun --nproc-per-node N -m pipelinerl.workers.trainer --run-dir runs/<id>`` places it alike).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zmq
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipelinerl.platform.batch_records import batch_record_path, trained_subset, write_batch_record
from pipelinerl.platform.checkpoint import (
    OPTIMIZER_DIR,
    CheckpointInfo,
    TrainedSoFar,
    checkpoint_dir,
    read_info,
    read_trained,
    write_info,
    write_trained,
)
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.dtypes import policy_dtype
from pipelinerl.platform.jsonl import append_record
from pipelinerl.platform.prompt_records import REJECTED_BY_TRAINER, trainer_dropped_path
from pipelinerl.platform.rebase import read_rebase
from pipelinerl.platform.step_digests import (
    StepDigests,
    parameter_digests,
    step_digests_path,
    write_step_digests,
)
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.transport import Receiver, run_keys
from pipelinerl.platform.wire import Shutdown, TrainBatch, impossible_values
from pipelinerl.workers.deepspeed_import import import_deepspeed
from pipelinerl.workers.deepspeed_setup import (
    deepspeed_config,
    enable_activation_checkpointing,
    init_distributed,
    leave_distributed,
)
from pipelinerl.workers.engines.lm_head import float32_lm_head
from pipelinerl.workers.policy_step import concat_records, micro_batch_loss
from pipelinerl.workers.recipe_terms import load_reference_model, reference_model_path
from pipelinerl.workers.step_statistics import RankStep, step_statistics, version_span
from pipelinerl.workers.weight_publisher import WeightPublisher

logger = logging.getLogger("pipelinerl.trainer")

BATCH_WAIT_S = 1.0  # how long one receive waits before the loop checks its deadline again


# Where a model config states how many positions it was built for (Llama/Qwen, GPT-2); a sequence beyond
# it indexes past a learned position table (a crash) or past the trained rotary range.
POSITION_LIMIT_KEYS = ("max_position_embeddings", "n_positions")


def model_positions(model_config: Any) -> int | None:
    """The longest sequence ``model_config`` states it takes, or None when it states none."""
    for key in POSITION_LIMIT_KEYS:
        value = getattr(model_config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def step_seed(seed: int, policy_version: int) -> int:
    """The torch seed of the step that trains ``policy_version`` into the next (``run.seed`` and the
    version alone, so a step drawn again in a replay draws the same)."""
    return (seed * 1_000_003 + policy_version) % 2**63


def publishes_after(config: PipelineConfig, policy_version: int) -> bool:
    """Whether the weights of ``policy_version`` go to the actors (conventional: once per round)."""
    if config.run.mode == "conventional":
        return policy_version % config.run.steps_per_round == 0
    return True


class Trainer:
    def __init__(
        self, config: PipelineConfig, run_dir: Path, rank: int, model_path: Path, device: str = "cpu"
    ) -> None:
        deepspeed = import_deepspeed()

        self.config = config
        self.run_dir = run_dir
        self.rank = rank
        self.model_path = model_path
        self.device = device
        self.publisher: WeightPublisher | None = None  # open_transport's, on rank 0
        torch.manual_seed(config.run.seed)
        dtype = policy_dtype(config.model.dtype)
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
        if config.model.lm_head_fp32:
            float32_lm_head(model)
        if config.trainer.activation_checkpointing:
            enable_activation_checkpointing(model)
        if device == "cuda":  # one GPU per rank (the launcher shows each rank the node's trainer GPUs)
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        else:
            # DeepSpeed's CPU shared-memory collective op serves only its inference all-reduce (tensor
            # parallel inference), never training; building it costs about a minute of g++ in every new
            # environment (its build is keyed by the interpreter's paths), so CPU ranks go without it
            # and use gloo's collectives, as they do for everything else.
            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        init_distributed(deepspeed, config, rank, "nccl" if device == "cuda" else "gloo")
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=model.parameters(),
            config=deepspeed_config(config, bf16=dtype == torch.bfloat16),
        )
        self.deepspeed = deepspeed
        # The KL term's frozen reference (rl.kl.coef > 0): the starting weights, outside the optimizer.
        self.reference_model = (
            load_reference_model(config, reference_model_path(config, model_path), self.engine.device)
            if config.rl.kl.coef > 0
            else None
        )
        self.policy_version = 0
        self.samples_trained = 0
        self.tokens_trained = 0
        # What this rank trained into the policy (saved with each checkpoint), and the rollout ids
        # no batch may bring again: after a resume, every rank's ids of the checkpointed policy.
        self.trained = TrainedSoFar()
        self.consumed: set[str] = set()
        if config.run.resume_from is not None:
            self._resume(config.run.resume_from)
        # Sequences refused at this boundary (wire.impossible_values) and other messages than batches;
        # each refused sequence also by its prompt, for `pipelinerl runs audit` (platform/prompt_records).
        self.rejected = 0
        self.refusals = trainer_dropped_path(run_dir, rank)  # written on the first refusal only
        self.vocab_size = int(self.engine.module.get_input_embeddings().num_embeddings)
        self.max_sequence_tokens = model_positions(self.engine.module.config)
        self.max_completion_tokens = config.actor.max_new_tokens
        # What each step keeps for a replay: its batch, and the digests of the weights it made.
        self.record_batches = self.record_digests = config.trainer.record_batches
        (run_dir / "tokens").mkdir(exist_ok=True)

    def open_transport(self) -> None:
        """The batch socket and, on rank 0, the weight publisher (``run``; a replay has neither)."""
        config, device = self.config, self.device
        self.zmq_context = zmq.Context()
        transport = config.transport
        keys = run_keys(self.run_dir)  # every run authenticates its peers, on loopback too
        # Each rank connects to the inbox the preprocessor binds for it.
        self.batches = Receiver(
            self.zmq_context,
            transport.trainer_inbox(self.rank),
            "pull",
            bind=False,
            high_water_mark=1,
            keys=keys,
            max_message_bytes=transport.max_message_bytes,
            # A lost batch would leave this rank and the preprocessor waiting for each other: fail fast.
            on_gap="fail",
        )
        # Rank 0 alone talks to the actors.
        self.publisher = WeightPublisher(self.zmq_context, config, keys, device) if self.rank == 0 else None

    def _resume(self, directory: Path) -> None:
        info = read_info(directory)
        self.policy_version = info.policy_version
        self.samples_trained = info.samples_trained
        self.tokens_trained = info.tokens_trained
        trained = read_trained(directory)
        self.consumed.update(trained.rollout_ids)
        self.trained = TrainedSoFar(
            rollout_ids=list(trained.rollout_ids),
            prompt_positions=trained.prompt_positions,
            trained_positions=trained.trained_positions,
        )
        if (directory / OPTIMIZER_DIR).is_dir():
            self.engine.load_checkpoint(
                str(directory / OPTIMIZER_DIR), tag="state", load_module_only=False, load_module_strict=True
            )
        logger.info(
            "resumed from %s at policy version %d (%d rollouts trained into it refused if they come again)",
            directory,
            self.policy_version,
            len(self.consumed),
        )

    def save_checkpoint(self, directory: Path) -> None:
        """The policy (Hugging Face format, rank 0), its metadata and the optimizer state (all ranks)."""
        params = [param for _, param in self._parameters()]
        with self.deepspeed.zero.GatheredParameters(params, enabled=self.config.trainer.zero_stage == 3):
            if self.rank == 0:
                directory.mkdir(parents=True, exist_ok=True)
                self.engine.module.save_pretrained(directory)
                AutoTokenizer.from_pretrained(self.model_path).save_pretrained(directory)
        directory.mkdir(parents=True, exist_ok=True)
        write_trained(directory, self.rank, self.trained)  # before the collective save: all ranks' in
        self.engine.save_checkpoint(str(directory / OPTIMIZER_DIR), tag="state")
        if self.rank == 0:
            info = CheckpointInfo(
                run_id=self.run_dir.name,
                policy_version=self.policy_version,
                samples_trained=self.samples_trained,
                tokens_trained=self.tokens_trained,
                created_at=time.time(),
            )
            write_info(directory, info)  # last: its presence means the checkpoint is complete

    def run(self) -> None:
        config = self.config
        self.open_transport()
        if (rebase := read_rebase(self.run_dir)) is not None and rebase.version == self.policy_version:
            # The actors outlived the restart of this role (platform/rebase.py): they take the resumed
            # lineage's weights as an ordinary update before they admit prompts again.
            logger.info(
                "publishing the weights of version %d to the actors that outlived the restart", rebase.version
            )
            self._publish()
        started = time.time()
        metrics_path = self.run_dir / "metrics.jsonl"
        with metrics_path.open("a") as metrics_file:
            while self.policy_version < config.run.max_steps:
                if time.time() - started > config.run.max_wall_s:
                    logger.warning("max_wall_s=%s reached; stopping early", config.run.max_wall_s)
                    break
                wait_started = time.perf_counter()
                batch = self._next_batch(started)
                if batch is None:
                    break
                wait_s = time.perf_counter() - wait_started
                record = self.train_step(batch)
                record[registry.TRAINER_WAIT_S] = wait_s
                record[registry.TRAINER_REJECTED] = self.rejected + self.batches.rejected_count  # + replays
                record[registry.TRAINER_MALFORMED] = self.batches.malformed_count
                record[registry.TRAINER_UNAUTHENTICATED] = self.batches.unauthenticated_count + (
                    self.publisher.unauthenticated_count if self.publisher is not None else 0
                )
                record[registry.TIME] = time.time()
                record[registry.WALL_S] = time.time() - started
                if publishes_after(config, self.policy_version):
                    record[registry.WEIGHTS_BROADCAST_MS] = 1000 * self._publish()
                every = config.trainer.checkpoint_every
                if every and self.policy_version % every == 0 and self.policy_version < config.run.max_steps:
                    directory = checkpoint_dir(self.run_dir, self.policy_version)
                    self.save_checkpoint(directory)
                    record[registry.CHECKPOINT] = str(directory)
                if self.rank == 0:
                    metrics_file.write(json.dumps(record) + "\n")
                    metrics_file.flush()
        self._finish()

    def _next_batch(self, started: float) -> TrainBatch | None:
        while time.time() - started < self.config.run.max_wall_s:
            message = self.batches.recv(timeout_s=BATCH_WAIT_S)
            if isinstance(message, TrainBatch):
                batch = self.admissible(message)
                if batch.sequences or torch.distributed.get_world_size() > 1:
                    return batch  # ranks step together, one cannot skip alone (docs/reliability.md)
                logger.warning("batch %d: no sequence left to train; skipped", batch.batch_index)
                continue
            if isinstance(message, Shutdown):
                logger.info("shutdown requested: %s", message.reason)
                return None
            if message is not None:
                self.rejected += 1
                logger.warning("rejected an unexpected %s on the batch socket", type(message).__name__)
        return None

    def admissible(self, batch: TrainBatch) -> TrainBatch:
        """``batch`` without the sequences this trainer cannot train (counted in ``rejected``): token ids
        outside its vocabulary, tokens from a policy newer than its own, non-finite numbers. Such a
        sequence would fail the embedding lookup or turn the loss, and then the weights, into NaN."""
        kept = []
        for sequence in batch.sequences:
            reason = impossible_values(
                sequence,
                newest_version=self.policy_version,
                vocab_size=self.vocab_size,
                max_completion_tokens=self.max_completion_tokens,
                max_sequence_tokens=self.max_sequence_tokens,
            )
            if reason is None:
                kept.append(sequence)
                continue
            self.rejected += 1
            append_record(
                self.refusals,
                {
                    "group_id": sequence.group_id,
                    "rollout_id": sequence.rollout_id[:64],
                    "reason": REJECTED_BY_TRAINER,
                    "detail": reason,
                    "policy_version": self.policy_version + 1,  # the version its step makes
                    "rank": self.rank,
                    registry.TIME: time.time(),
                },
            )
            logger.warning(
                "batch %d: rejected sequence %r (%d so far): %s",
                batch.batch_index,
                sequence.rollout_id[:64],
                self.rejected,
                reason,
            )
        return trained_subset(batch, kept)

    def train_step(self, batch: TrainBatch) -> dict[str, Any]:
        config = self.config
        step_started = time.perf_counter()
        # Dropout and any sampling in the step draw from (seed, version) alone: a replay draws the same.
        torch.manual_seed(step_seed(config.run.seed, self.policy_version))
        fresh = [seq for seq in batch.sequences if seq.rollout_id not in self.consumed]
        if len(fresh) < len(batch.sequences):
            self.rejected += len(batch.sequences) - len(fresh)
            logger.warning(
                "batch %d: refused %d rollouts already trained into this policy",
                batch.batch_index,
                len(batch.sequences) - len(fresh),
            )
        self.consumed.update(seq.rollout_id for seq in fresh)
        for seq in fresh:
            self.trained.add(seq.rollout_id, seq.group_id)
        trained = trained_subset(batch, fresh)  # the batch as this step trains it (and records it)
        micro_batches = [[trained.sequences[i] for i in indices] for indices in trained.micro_batches]
        rl = config.rl
        records, losses, results = [], [], []
        self.engine.train()
        for sequences in micro_batches:
            result = micro_batch_loss(
                self.engine,
                sequences,
                num_sequences=len(fresh),
                loss_name=rl.loss,
                is_cap=rl.is_cap,
                ppo_clip_epsilon=rl.ppo_clip_epsilon,
                temperature=config.actor.temperature,
                device=self.engine.device,
                clip_low=rl.clip_low,
                clip_high=rl.clip_high,
                normalisation=rl.loss_normalisation,
                num_tokens=sum(len(seq.completion_token_ids) for seq in fresh),
                max_new_tokens=config.actor.max_new_tokens,
                kl_coef=rl.kl.coef,
                kl_estimator=rl.kl.estimator,
                reference_model=self.reference_model,
                entropy_coef=rl.entropy_coef,
            )
            self.engine.backward(result.loss)
            records.append(result.tokens)
            losses.append(float(result.loss.detach()))
            results.append(
                (
                    result.num_tokens,
                    result.clipped_fraction,
                    result.clipped_low_fraction,
                    result.clipped_high_fraction,
                    result.kl_mean,
                    result.entropy_mean,
                )
            )
        self.engine.step()
        grad_norm = self.engine.get_global_grad_norm()
        trained_at = self.policy_version
        self.policy_version += 1
        local = concat_records(records)
        np.savez_compressed(
            self.run_dir / "tokens" / f"step_{self.policy_version:06d}_rank{self.rank}.npz",
            trained_at_version=np.int64(trained_at),
            **{name: getattr(local, name) for name in local.__dataclass_fields__},
        )
        batch_record: dict[str, float] = {}
        if self.record_batches:
            recording = time.perf_counter()
            path = batch_record_path(self.run_dir, self.policy_version, self.rank)
            size = write_batch_record(path, trained)
            batch_record = {
                registry.TRAINER_BATCH_RECORD_MS: (time.perf_counter() - recording) * 1000.0,
                registry.TRAINER_BATCH_RECORD_BYTES: size,
            }
        if self.record_digests:
            batch_record[registry.TRAINER_WEIGHTS_DIGEST_MS] = self._record_digests()
        if grad_norm is not None:
            batch_record[registry.TRAINER_GRAD_NORM] = float(grad_norm)
        # Statistics over the whole step: every rank's tokens and sequences.
        part = RankStep(
            tokens=local,
            rewards=[seq.reward for seq in fresh],
            version_spans=[version_span(seq.token_versions) for seq in fresh],
            lengths=[len(seq.completion_token_ids) for seq in fresh],
            loss=float(np.sum(losses)),
            rollouts=[(seq.rollout_id, int(np.min(seq.token_versions, initial=trained_at))) for seq in fresh],
            results=results,
            groups=sorted({seq.group_id for seq in fresh}),
        )
        is_cap = rl.is_cap if rl.loss == "truncated_is" else None
        statistics = step_statistics(self._gather(part), trained_at, is_cap, rl.kl.coef, rl.entropy_coef)
        self.samples_trained += statistics[registry.TRAINER_SAMPLES]
        self.tokens_trained += statistics[registry.TRAINER_TOKENS]
        record: dict[str, Any] = {
            registry.STEP: self.policy_version,
            registry.POLICY_VERSION: self.policy_version,
            registry.TRAINED_AT_VERSION: trained_at,
            **statistics,
            registry.SAMPLES_TRAINED: self.samples_trained,
            registry.TOKENS_TRAINED: self.tokens_trained,
            registry.TRAINER_STEP_S: time.perf_counter() - step_started,
            registry.TRAINER_MICRO_BATCHES: len(micro_batches),
            **batch_record,  # this rank's: writing the step's batch for replay, and its size
        }
        return record

    def _gather(self, part: Any) -> list[Any]:
        """Every rank's ``part`` (one item when training on a single rank)."""
        dist = torch.distributed
        if dist.get_world_size() == 1:
            return [part]
        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, part)
        return gathered

    def _record_digests(self) -> float:
        """Rank 0 writes the digests of the weights this step made (``platform/step_digests``); every
        rank enters ZeRO-3's gather (a collective). Returns the milliseconds it took."""
        named = self._parameters()
        started = time.perf_counter()
        zero3 = self.config.trainer.zero_stage == 3
        with self.deepspeed.zero.GatheredParameters([param for _, param in named], enabled=zero3):
            if self.rank == 0:
                digests = StepDigests(self.policy_version, parameter_digests(named))
                write_step_digests(step_digests_path(self.run_dir, self.policy_version), digests)
        return (time.perf_counter() - started) * 1000.0

    def apply_learning_rate(self) -> None:
        """Set the optimizer's learning rate from this config (a resumed optimizer state brings the
        saved one): ``trainer.learning_rate``, or the warm-up schedule's value at its resumed step."""
        scheduler = self.engine.lr_scheduler
        rates = scheduler.get_lr() if scheduler is not None else None
        for i, group in enumerate(self.engine.optimizer.param_groups):
            group["lr"] = rates[i] if rates is not None else self.config.trainer.learning_rate

    def _parameters(self) -> list[tuple[str, Any]]:
        return list(self.engine.module.named_parameters(remove_duplicate=True))

    def _publish(self) -> float:
        """The current weights to every actor (``WeightPublisher``); returns seconds taken. Every rank
        enters the ZeRO-3 gather (a collective); only rank 0 publishes."""
        named = self._parameters()
        started = time.perf_counter()
        zero3 = self.config.trainer.zero_stage == 3
        with self.deepspeed.zero.GatheredParameters([param for _, param in named], enabled=zero3):
            if self.publisher is None:
                return 0.0
            self.publisher.publish(named, self.policy_version, self.samples_trained)
        return time.perf_counter() - started

    def _finish(self) -> None:
        # A complete Hugging Face directory: the policy and the tokenizer it was trained with.
        self.save_checkpoint(self.run_dir / "final")
        # The marker before the Shutdown it announces: a stage may exit the moment Shutdown reaches
        # it, and the launcher takes a clean exit before any marker for a stage that died.
        (self.run_dir / f"trainer{self.rank}.done").write_text(
            json.dumps({"policy_version": self.policy_version})
        )
        if self.publisher is not None:
            self.publisher.shutdown(f"trainer finished at version {self.policy_version}")
        self.batches.close()
        leave_distributed()


def placed_rank(flag: int | None, environ: Mapping[str, str], num_processes: int) -> int:
    """This process's rank: ``--rank``, else ``RANK`` as the launcher or torchrun set it (0 alone).
    The job torchrun or the launcher placed it in must be the one the config describes."""
    world = int(environ.get("WORLD_SIZE", num_processes))
    if world != num_processes:
        raise SystemExit(
            f"WORLD_SIZE={world} but trainer.num_processes={num_processes}: start as many ranks as the "
            "config trains with"
        )
    placed = environ.get("RANK")
    if flag is not None and placed is not None and int(placed) != flag:
        raise SystemExit(f"--rank {flag} disagrees with RANK={placed} from the launcher")
    rank = flag if flag is not None else int(placed or 0)
    if not 0 <= rank < num_processes:
        raise SystemExit(
            f"rank {rank} is outside 0..{num_processes - 1} (trainer.num_processes={num_processes})"
        )
    return rank


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--rank", type=int, help="this rank; default: RANK, as torchrun sets it")
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="trainer.device, resolved")
    args = parser.parse_args(argv)
    config = PipelineConfig.model_validate_json((args.run_dir / "config.json").read_text())
    rank = placed_rank(args.rank, os.environ, config.trainer.num_processes)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s trainer{rank} %(levelname)s %(message)s")
    torch.set_num_threads(config.trainer.torch_threads)
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    Trainer(config, args.run_dir, rank, args.model_path, device=args.device).run()


if __name__ == "__main__":
    main()
