"""The actor's weights thread: weight-update notices, the tensors received over the weight group
(checked bucket by bucket against the trainer's digests), loaded in flight or staged until the actor
drains, and the thread's part in outliving a restart of the trainer role.

``WeightsThread`` is a part of ``workers/actor.py``'s ``Actor`` (a mixin, as vLLM's model runner takes
its LoRA and KV-connector parts): the attributes declared below are the actor's, set in its
``__init__``, and who owns which is said in ``actor.py``'s docstring. The thread runs
``receive_weights``; the main thread calls ``apply_staged`` after an async drain.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelinerl.platform.jsonl import JsonlWriter
from pipelinerl.platform.transport import Receiver
from pipelinerl.platform.weights import BucketsRefused, WeightGroup, weight_update_problem
from pipelinerl.platform.wire import Message, Shutdown, WeightUpdate
from pipelinerl.workers.admission import loads_on_receipt
from pipelinerl.workers.checked_receive import announced_digests, receive_checked
from pipelinerl.workers.update_phases import update_phases

if TYPE_CHECKING:
    import zmq

    from pipelinerl.platform.config import PipelineConfig
    from pipelinerl.platform.curve_keys import CurveKeys
    from pipelinerl.platform.rebase import Rebase
    from pipelinerl.workers.engines.protocol import Engine, EngineWorkers, WeightHolder, WorkersEngine
    from pipelinerl.workers.rebase_handshake import RebaseHandshake
    from pipelinerl.workers.staged_weights import StagedWeights
    from pipelinerl.workers.stop_flag import StopFlag

logger = logging.getLogger("pipelinerl.actor")


class WeightUpdateRefused(RuntimeError):
    """A weight-update notice this actor's model cannot take (wrong names, shapes or dtype)."""


class WeightsThread:
    """The weights thread's methods of the actor (see the module's docstring)."""

    config: PipelineConfig
    actor_id: int
    run_dir: Path
    context: zmq.Context[Any]
    keys: CurveKeys
    engine: Engine[WeightHolder]
    weight_group: WeightGroup | None
    workers_engine: WorkersEngine | None
    saved_shapes: dict[str, list[int]]
    notices: Receiver
    next_notice: Message | None
    staged: StagedWeights
    weights_ready: threading.Condition
    stop: StopFlag
    weights_error: BaseException | None
    handshake: RebaseHandshake
    metrics: JsonlWriter
    pauses_s: list[float]
    received_s: float
    buckets_refused: int
    refused_version: int

    if TYPE_CHECKING:  # the actor's record of each update (workers/actor.py)

        def report(self, pause_s: float | None, phases: dict[str, float] | None = None) -> None: ...

    def notice_receiver(self) -> Receiver:
        transport = self.config.transport
        return Receiver(
            self.context,
            transport.address("weights"),
            "sub",
            bind=False,
            keys=self.keys,
            max_message_bytes=transport.max_message_bytes,
        )

    # ----- weights: receiver thread -----

    def receive_weights(self) -> None:
        """The weights thread. Whatever stops it (a refused notice, a broken weight group the launcher
        will not restart) stops the actor too, which then exits with that error: an actor left on old
        weights would stall the trainer's next broadcast, with nothing said. A weight group broken by
        the trainer's death, where the actors outlive its restart, waits for the launcher's notice."""
        try:
            self._receive_weights()
        except BaseException as error:
            logger.error("weights thread stopped: %s", error)
            self.weights_error = error
            self.stop.set()

    def _receive_weights(self) -> None:
        broken: BaseException | None = None  # the weight group's failure while waiting for a rebase
        while not self.stop.is_set():
            if (rebase := self.handshake.new()) is not None:
                self.rebase_weights(rebase)
                broken = None
                continue
            if broken is not None:  # nothing to receive from until the launcher restarts the trainer
                time.sleep(0.2)
                continue
            try:
                self._receive_notice()
            except WeightUpdateRefused:
                raise
            except RuntimeError as error:  # gloo: the trainer died in the middle of a broadcast
                if not self.config.run.actors_survive_restart:
                    raise
                logger.warning("weight group broken (%s): waiting for the trainer's restart", error)
                broken = error

    def _receive_notice(self) -> None:
        """Take one notice (waiting 0.2 s at most) and act on it."""
        notice, self.next_notice = self.next_notice or self.notices.recv(timeout_s=0.2), None
        if isinstance(notice, Shutdown):
            logger.info("shutdown: %s", notice.reason)
            self.stop.set()
        elif isinstance(notice, WeightUpdate):
            problem = weight_update_problem(
                notice.parameter_names,
                notice.parameter_shapes,
                notice.parameter_dtypes,
                saved_shapes=self.saved_shapes,
            )
            if problem is not None:
                raise WeightUpdateRefused(f"weight update v{notice.policy_version} refused: {problem}")
            if self.weight_group is not None:
                self.receive_into_staging(self.weight_group, notice)
            elif self.workers_engine is not None:
                self.receive_into_engine(self.workers_engine, notice)

    def announced(self, notice: WeightUpdate) -> list[bytes] | None:
        """The trainer's digests of ``notice``'s update, which follow its broadcast on the notice
        socket; a notice that comes before them is handled next (``next_notice``)."""
        digests, self.next_notice = announced_digests(self.notices, notice.policy_version)
        return digests

    def receive_into_staging(self, weight_group: WeightGroup, notice: WeightUpdate) -> None:
        """transformers: this process receives the tensors from the weight group into ``staged``, every
        bucket checked against the trainer's digests; an update with a bucket refused stages nothing."""
        began = time.perf_counter()
        received = weight_group.receive_update(notice.parameter_shapes, notice.parameter_dtypes)
        try:
            received.check(self.announced(notice))
        except BucketsRefused as refused:
            self.refuse(notice, refused)
            return
        with self.staged.lock:
            self.received_s = time.perf_counter() - began
            self.staged.version = notice.policy_version
            self.staged.names = list(notice.parameter_names)
            self.staged.tensors = list(received.tensors())
        if loads_on_receipt(self.config.run.mode) or self.handshake.ends_pause(notice.policy_version):
            self.apply_staged()
        with self.weights_ready:
            self.weights_ready.notify_all()

    def apply_staged(self) -> None:
        with self.staged.lock:
            version = self.staged.version
            # Newer weights only, except the resumed lineage's first (older than what the engine runs).
            if version <= self.engine.policy_version and not self.handshake.ends_pause(version):
                return
            pause = self.engine.update_weights(version, self.staged.load_into)
            received_s = self.received_s
        self.loaded(pause, update_phases(self.engine.last_update_s, received_s, received_in_pause=False))

    def receive_into_engine(self, engine: WorkersEngine, notice: WeightUpdate) -> None:
        """vllm: the engine's workers take the tensors from the weight group themselves; every bucket
        is checked against the trainer's digests, and an update with one refused is neither staged
        nor loaded (``checked_receive``)."""
        update = (list(notice.parameter_names), notice.parameter_shapes, notice.parameter_dtypes)

        received_s = 0.0

        def receive(workers: EngineWorkers) -> float:
            """Seconds from asking the workers to the update kept (the digests compared)."""
            nonlocal received_s
            began = time.perf_counter()
            receive_checked(workers, *update, announced=lambda: self.announced(notice))
            received_s = time.perf_counter() - began
            return received_s

        try:
            if not loads_on_receipt(self.config.run.mode):  # staged in the workers, loaded on draining
                # Receiving replaces the workers' staged tensors: it must not interleave with a load of
                # the previous ones (apply_staged, under the same lock), or that load would take these
                # tensors under the older version's label and leave nothing staged for this version.
                with self.staged.lock:
                    receive(engine.workers)
                    self.received_s = received_s
                    self.staged.version = notice.policy_version
                    self.staged.in_engine = True
                logger.info(
                    "weights v%d received into the engine's workers (loaded when the actor drains)",
                    notice.policy_version,
                )
                if self.handshake.ends_pause(notice.policy_version):
                    self.apply_staged()
            else:
                with self.staged.lock:
                    pause = engine.update_weights(
                        notice.policy_version, lambda workers: (receive(workers), workers.load_received())
                    )
                    self.staged.version = notice.policy_version
                phases = update_phases(engine.last_update_s, received_s, received_in_pause=True)
                self.loaded(pause, phases)
        except BucketsRefused as refused:
            self.refuse(notice, refused)
            return
        with self.weights_ready:
            self.weights_ready.notify_all()

    def refuse(self, notice: WeightUpdate, refused: BucketsRefused) -> None:
        """An update whose buckets ``refused`` did not match the trainer's digests: none of it was staged or
        loaded. Count, warn, record, and wake a conventional round waiting for it."""
        self.buckets_refused += len(refused.buckets)
        self.refused_version = max(self.refused_version, notice.policy_version)
        for bucket in refused.buckets:
            logger.warning(
                "weights v%d: bucket %d refused (%s)", notice.policy_version, bucket, refused.reason
            )
        logger.warning(
            "weights v%d not applied: %d of its buckets refused; the actor keeps weights v%d",
            notice.policy_version,
            len(refused.buckets),
            self.engine.policy_version,
        )
        self.report(None)
        with self.weights_ready:
            self.weights_ready.notify_all()

    def loaded(self, pause: float, phases: dict[str, float]) -> None:
        self.pauses_s.append(pause)
        self.report(pause, phases)
        logger.info(
            "weights v%d loaded in flight (pause %.1f ms, %d in flight)",
            self.engine.policy_version,
            1000 * pause,
            self.engine.num_in_flight,
        )
        self.handshake.loaded(self.engine.policy_version)  # the resumed lineage's weights end a pause

    def rebase_weights(self, rebase: Rebase) -> None:
        """The weights thread's part: have the main thread pause and answer, then drop the dead
        trainer's notices, join the new trainer's weight group (this waits until the launcher has
        started it) and take its first update, the lineage's weights at ``rebase.version``."""
        logger.info(
            "the trainer role restarts (attempt %d) from version %d: pausing", rebase.attempt, rebase.version
        )
        if not self.handshake.ask(rebase, self.stop.is_set):
            return
        self.notices.close()
        self.notices, self.next_notice = self.notice_receiver(), None
        transport = self.config.transport
        if self.workers_engine is not None:
            self.workers_engine.rejoin_weight_group()
        else:
            self.weight_group = WeightGroup.join(
                transport.host,
                transport.port("weight_group"),
                self.config.actor_first_weight_rank(self.actor_id),
                self.config.weight_group_size(),
            )
        # The new trainer leads the group only after the launcher has cut this actor's records.
        self.metrics = JsonlWriter(self.run_dir / f"actor{self.actor_id}.jsonl")
        logger.info("joined the restarted trainer's weight group; waiting for weights v%d", rebase.version)
