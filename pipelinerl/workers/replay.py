"""A replay rank: the trainer's own step code on the batches a run recorded, instead of on live ones.

One process per trainer rank of the recorded run, placed as the launcher places trainer ranks
(``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``: ``launch/rank_env``). It builds the same
DeepSpeed engine as the trainer (``workers/trainer.Trainer``, without its sockets), resumed from the
replay's checkpoint, and for each version ``first + 1 .. last`` reads its rank's record of that step
(``batches/step_<version>_rank<r>.batch``) from the recorded run and trains it with ``train_step``:
the same code, the same per-step seed, the same micro-batches. Rank 0 writes each step's metrics to
the replay's ``metrics.jsonl``; the weights' digests go to its ``digests/``, the per-token data to its
``tokens/``, where ``launch/replay`` compares them with the record.

A what-if replay (``rl.max_lag`` among its changes) drops a recorded sequence whose oldest token is
more than ``rl.max_lag`` versions behind the step, as the preprocessor would have.

Run: ``python -m pipelinerl.workers.replay --source RUN --out OUT --model-path M --first F --last L``
(``pipelinerl replay`` does, after checking everything it can before any process starts).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

import numpy as np
import torch

from pipelinerl.platform.batch_records import batch_record_path, read_batch_record, trained_subset
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.wire import TrainBatch
from pipelinerl.workers.deepspeed_setup import leave_distributed
from pipelinerl.workers.trainer import Trainer, placed_rank

logger = logging.getLogger("pipelinerl.replay")

SKIPPED = "replay/skipped"  # a what-if step with no sequence left to train (single rank)


def within_max_lag(batch: TrainBatch, trained_at: int, max_lag: int | None) -> TrainBatch:
    """``batch`` without its sequences whose oldest token is more than ``max_lag`` versions older than
    ``trained_at`` (the preprocessor's rule for ``rl.max_lag``); ``batch`` itself when none goes."""
    if max_lag is None:
        return batch
    kept = [
        sequence
        for sequence in batch.sequences
        if trained_at - int(np.min(sequence.token_versions, initial=trained_at)) <= max_lag
    ]
    return trained_subset(batch, kept)


def replay(trainer: Trainer, source: Path, first: int, last: int) -> None:
    """Train versions ``first + 1 .. last`` on ``source``'s recorded batches; rank 0 records each step."""
    config = trainer.config
    if trainer.policy_version != first:
        raise SystemExit(f"the replay resumed at version {trainer.policy_version}, not {first}")
    trainer.apply_learning_rate()  # the replay's trainer.learning_rate over the checkpoint's
    world = torch.distributed.get_world_size()
    started = time.time()
    with (trainer.run_dir / "metrics.jsonl").open("a") as metrics:
        for version in range(first + 1, last + 1):
            batch = read_batch_record(batch_record_path(source, version, trainer.rank))
            batch = within_max_lag(batch, trainer.policy_version, config.rl.max_lag)
            if batch.sequences or world > 1:
                record = trainer.train_step(batch)
                record[registry.TIME] = time.time()
                record[registry.WALL_S] = time.time() - started
            else:
                trainer.policy_version += 1
                record = {
                    registry.STEP: version,
                    registry.POLICY_VERSION: version,
                    registry.TIME: time.time(),
                    SKIPPED: 1,
                }
                logger.warning("version %d: no recorded sequence within rl.max_lag; step skipped", version)
            if trainer.rank == 0:
                metrics.write(json.dumps(record) + "\n")
                metrics.flush()
            logger.info("replayed version %d (%d sequences)", version, len(batch.sequences))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, required=True, help="the recorded run's directory")
    parser.add_argument("--out", type=Path, required=True, help="the replay's directory (its config.json)")
    parser.add_argument("--model-path", type=Path, required=True)
    parser.add_argument("--first", type=int, required=True, help="the version the replay resumes at")
    parser.add_argument("--last", type=int, required=True, help="the last version it trains")
    parser.add_argument("--rank", type=int, help="this rank; default: RANK")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    config = PipelineConfig.model_validate_json((args.out / "config.json").read_text())
    rank = placed_rank(args.rank, os.environ, config.trainer.num_processes)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s replay{rank} %(levelname)s %(message)s")
    torch.set_num_threads(config.trainer.torch_threads)
    os.environ.setdefault("DS_ACCELERATOR", args.device)
    trainer = Trainer(config, args.out, rank, args.model_path, device=args.device)
    trainer.record_batches = False  # the source keeps the batches; the replay keeps what it made of them
    trainer.record_digests = True
    replay(trainer, args.source, args.first, args.last)
    leave_distributed()
    (args.out / f"replay{rank}.done").write_text(json.dumps({"policy_version": trainer.policy_version}))


if __name__ == "__main__":
    main()
