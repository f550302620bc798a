"""The actor stage: generation with H sequences in flight and weights that change in flight.

Loop (paper §3): push finished sequences downstream as rollouts; refill up to H in-flight
sequences with the next prompts (G samples each); weight updates arrive meanwhile. A receiver
thread takes each ``WeightUpdate`` notice, receives the tensors over the weight group into
staging buffers (generation goes on), and then, by mode:

* ``pipeline``: loads them at once, between two decode steps, keeping in-flight sequences;
* ``conventional``: the round's G·B samples were generated with frozen weights and the actor is
  waiting; the weights load before the next round;
* ``async``: the actor keeps its weights until it is ``run.async_drain_lag`` versions behind, then
  stops admitting prompts, lets in-flight sequences finish, and loads the newest weights: every
  sequence is written by one version.

How many groups to admit, when a drain starts and ends, when a round is over: ``admission.py``
(pure, unit-tested); the loops here only call it.

Engines (``actor.engine``): ``transformers`` runs in this process, which is then the weight-group
member and stages the tensors itself. ``vllm`` runs in vLLM's own processes, whose workers are the
group members (``vllm_extension.py``): in pipeline and conventional modes they receive and load an
update inside one pause; in async mode they receive it into staging buffers at once (generation
stalls meanwhile) and load it when the actor drains. The vllm engine needs an interpreter with vLLM
(``actor.python``, ``make vllm-env``).

Prompts are the task's problems rendered as the model expects (``tasks/prompting.py``: the chat
template, every end-of-sequence id); a finished completion is cut right after the task's first stop
string. With ``eval.every``, actor 0 also writes the held-out set through the same engine every
``eval.every`` versions and sends it downstream as ``split="eval"`` (``workers/evaluation.py``).

Each weight update the actor loads appends a record to ``actor<k>.jsonl`` in the run directory:
the update pause, tokens/s and the idle fraction since the previous update (time blocked on a full
rollout queue, waiting for weights, or with nothing in flight).

Every bucket of an update is checked against the digest the trainer sends after its broadcast
(``checked_receive``) before any tensor of it is loaded. An update with a bucket that does not match
is refused whole (half an update loaded is a model no version describes): the actor keeps its
weights and version, counts the refused buckets (``actor/weight_buckets_refused``, in a record of
its own) and logs a warning naming them; the next update that verifies replaces every tensor. A
conventional round waiting for the refused version goes on with the weights it has.

When a trainer rank or the preprocessor dies and the launcher restarts only them
(``run.actors_survive_restart``, ``platform/rebase.py``), the actor outlives the restart: the weights
thread sees the launcher's notice, the main thread pauses (keeps the whole train groups every token of
which the resumed lineage sampled, aborts the rest, takes up the checkpoint's prompt stream, answers),
the weights thread joins the restarted trainer's weight group, and the checkpoint's weights, loaded as
an ordinary update (older than the engine's), end the pause (``pause_for_rebase``, ``rebase_weights``;
the two threads' exchange is ``workers/rebase_handshake.py``).

Threads, and who owns what:

* **main** (``run``: ``run_pipeline`` or ``run_conventional``): the generation loop. It alone submits
  to and polls the engine, so ``engine.num_in_flight`` changes only here; it owns ``pending``,
  the ``outbox`` with the rollout socket (``workers/outbox.py``: a train group goes whole), the prompt
  stream (positions with their problems), ``eval_schedule``, ``tokens_generated`` and the idle clock
  (``idle_s``, ``idle_started``). In async mode it also loads the staged weights after a drain
  (``apply_staged``, under ``staged.lock``).
* **weights** (``receive_weights``, ``workers/actor_weights.py``): the notice socket and, with
  transformers, the weight group. It stages each update (``staged``, under ``staged.lock``) and, in
  pipeline and conventional modes, loads it at once, still under ``staged.lock`` (so a newer update
  is never staged in the middle of a load); then it notifies ``weights_ready``. If it fails it sets
  ``weights_error``, then ``stop``.
* **the engine's own** (transformers' generation loop, or vLLM's asyncio loop): inside the engine,
  whose lock orders a version switch against ``submit`` and ``poll``.

Shared between main and weights:

* ``staged``: under ``staged.lock``. The main thread of an async run reads ``staged.version``
  without it to decide on a drain: a read one update stale only delays the drain by one turn.
* ``engine.policy_version``: written inside ``update_weights`` by the one thread that loads in the
  run's mode (weights thread; main thread in async mode); read by the main thread (eval schedule,
  round start, ``wait_for_version``).
* ``weights_ready`` (a condition): the main thread of a conventional run waits on it for the next
  round's weights; the weights thread notifies it after every update, and ``stop`` (``StopFlag``)
  on setting, so a stop wakes the waiter.
* ``handshake`` (``RebaseHandshake``): the weights thread asks for a pause and waits for the main
  thread's answer; the thread that loads the resumed lineage's weights ends the pause.
* ``stop``: set by either thread (a ``Shutdown`` notice, a failed weights thread, the end of ``run``).
* ``pauses_s``, ``_last_report`` and the ``actor<k>.jsonl`` writer: written by ``loaded`` and
  ``report``, on the thread that loads (one per mode); ``pauses_s`` is read by the main thread
  for its closing log line, after it has stopped the weights thread and joined it (5 s at most).
* ``tokens_generated``, ``idle_s`` and ``idle_started``: written by the main thread and read by
  ``report`` without a lock (on the weights thread, except in async mode). The values are
  cumulative, so a report that reads them in the middle of a change is made up by the next one.

Run: ``python -m pipelinerl.workers.actor --run-dir runs/<id> --actor-id 0`` (the launcher does).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import zmq
from transformers import AutoTokenizer

from pipelinerl.platform.checkpoint import prompt_position, starting_version, train_group_id
from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.dtypes import policy_dtype_name
from pipelinerl.platform.jsonl import JsonlWriter
from pipelinerl.platform.numbering import actor_sender
from pipelinerl.platform.prompt_records import handed_out_path
from pipelinerl.platform.rebase import Rebase, RebaseAnswer, kept_groups, write_answer
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.transport import Sender, run_keys
from pipelinerl.platform.weights import WeightGroup, saved_tensor_shapes
from pipelinerl.platform.wire import Message, Rollout
from pipelinerl.tasks import build_task
from pipelinerl.tasks.base import Problem
from pipelinerl.tasks.eval_sets import build_eval_sets
from pipelinerl.tasks.prompting import cut_at_stop, encode_problem, eos_token_ids, prompt_format
from pipelinerl.workers.actor_engines import transformers_engine, vllm_engine
from pipelinerl.workers.actor_weights import WeightsThread
from pipelinerl.workers.admission import (
    continuous_admission,
    conventional_round,
    runs_rounds,
    wait_over,
)
from pipelinerl.workers.engines.protocol import (
    CompletedSequence,
    Engine,
    WeightHolder,
    WorkersEngine,
)
from pipelinerl.workers.evaluation import EvalSchedule, eval_group_id
from pipelinerl.workers.outbox import Outbox
from pipelinerl.workers.prompt_stream import actor_prompts, stream_after_rebase
from pipelinerl.workers.rebase_handshake import RebaseHandshake
from pipelinerl.workers.staged_weights import StagedWeights
from pipelinerl.workers.stop_flag import StopFlag

if TYPE_CHECKING:
    from pipelinerl.platform.curve_keys import CurveKeys

logger = logging.getLogger("pipelinerl.actor")


@dataclass(frozen=True)
class PendingSample:
    problem: Problem
    group_id: str
    group_size: int
    split: str = "train"


def rollout_sender(context: Any, config: PipelineConfig, actor_id: int, keys: CurveKeys) -> Sender:
    """The rollout PUSH actor ``actor_id`` connects to the preprocessor: the run's keys, and the sender
    name (``numbering.actor_sender``) under which the preprocessor pins its streams."""
    transport = config.transport
    return Sender(
        context,
        transport.address("rollouts"),
        "push",
        bind=False,
        high_water_mark=transport.queue_size,
        keys=keys,
        kernel_buffer_bytes=transport.socket_buffer_kib * 1024,
        max_message_bytes=transport.max_message_bytes,
        name=actor_sender(actor_id),
    )


class Actor(WeightsThread):
    def __init__(self, config: PipelineConfig, run_dir: Path, actor_id: int, model_path: Path) -> None:
        self.config = config
        self.actor_id = actor_id
        self.run_id = run_dir.name
        torch.manual_seed(config.run.seed * 1000 + actor_id)
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        task = build_task(config.task)
        self.stop_strings = tuple(task.stop_strings)
        self.eos_token_ids = eos_token_ids(self.tokenizer, model_path)
        problems = task.problems("train", config.task.train_problems, config.run.seed)
        self.problems = problems
        self.prompts = actor_prompts(config, problems, actor_id)  # a resumed run's too
        self.furthest_position = -1  # the furthest stream position handed out by this process
        prompt = prompt_format(self.tokenizer, config.model.chat_template, config.model.system_prompt)
        self.encode = lambda problem: encode_problem(self.tokenizer, problem, prompt)
        # In-run evaluation (eval.every) is actor 0's: the eval sets through this engine.
        self.eval_sets: dict[str, list[Problem]] = {}
        self.eval_schedule = EvalSchedule(0, 0)
        if config.eval.every and actor_id == 0:
            self.eval_sets = {name: s.problems for name, s in build_eval_sets(config, task).items()}
            self.eval_schedule = EvalSchedule(config.eval.every, starting_version(config.run.resume_from))
        eval_problems = [problem for set_problems in self.eval_sets.values() for problem in set_problems]
        max_prompt_tokens = max(len(self.encode(p)) for p in [*problems, *eval_problems])
        transport = config.transport
        # The transformers engine's weight-group member is this process; the vllm engine's, its workers.
        self.weight_group: WeightGroup | None = None
        self.workers_engine: WorkersEngine | None = None  # vllm: the engine, as its workers' side
        self.engine: Engine[WeightHolder]
        if config.actor.engine == "vllm":
            self.engine = self.workers_engine = vllm_engine(
                config, actor_id, self.eos_token_ids, model_path, max_prompt_tokens
            )
        else:
            self.engine = transformers_engine(
                config, actor_id, self.eos_token_ids, model_path, max_prompt_tokens
            )
            self.weight_group = WeightGroup.join(
                transport.host,
                transport.port("weight_group"),
                config.actor_first_weight_rank(actor_id),
                config.weight_group_size(),
            )
        # What a weight update may hold: this model's tensors (each notice is checked against them).
        self.saved_shapes = saved_tensor_shapes(model_path)
        self.weights_error: BaseException | None = None  # what stopped the weights thread, if anything
        logger.info(
            "actor %d: %s engine, %s weights, %d sequences in flight at most",
            actor_id,
            config.actor.engine,
            policy_dtype_name(config.model.dtype),
            config.actor.max_in_flight,
        )
        self.context = zmq.Context()
        self.run_dir = run_dir
        self.keys = run_keys(run_dir)  # every run authenticates its peers, on loopback too
        self.outbox = Outbox(lambda: rollout_sender(self.context, config, actor_id, self.keys))
        self.notices = self.notice_receiver()
        self.pending: dict[str, PendingSample] = {}  # every sequence in the engine
        self.staged = StagedWeights()
        self.weights_ready = threading.Condition()
        self.stop = StopFlag(self.weights_ready)
        self.pauses_s: list[float] = []
        self.received_s = 0.0  # the staged update's receiving seconds, taken before its pause
        self.tokens_generated = 0
        self.idle_s = 0.0  # finished idle periods; one may be under way (idle_started)
        self.idle_started: float | None = None
        self.metrics = JsonlWriter(run_dir / f"actor{actor_id}.jsonl")
        # Every train group handed out, with this attempt's start (platform/prompt_records: runs audit).
        self.handed_out = JsonlWriter(handed_out_path(run_dir, actor_id))
        self.started_at = time.time()
        self._last_report = (time.monotonic(), 0, 0.0)  # (when, tokens, idle seconds)
        self._report_lock = threading.Lock()  # async mode: the main thread loads, the weights thread refuses
        self.buckets_refused = 0  # weight buckets whose bytes did not match the trainer's digest
        self.next_notice: Message | None = None  # came while the weights thread waited for digests
        self.refused_version = -1  # the newest update refused (a conventional round does not wait for it)
        # Outliving a restart of the trainer role (platform/rebase.py), between the two threads.
        self.handshake = RebaseHandshake(run_dir, config.run.actors_survive_restart)

    # ----- outliving a restart of the trainer role (platform/rebase.py): the main thread's part -----

    def pause_for_rebase(self, rebase: Rebase) -> None:
        """The main thread's part: keep the train groups still valid in the resumed lineage, abort the
        rest, forget what waited for the dead preprocessor, take up the prompt stream of
        ``rebase.version``'s checkpoint, answer the launcher; then, admitting nothing, let the kept
        sequences finish until the lineage's weights are loaded."""
        paused_at = time.time()
        in_flight = {rid: (s.group_id, s.group_size, s.split) for rid, s in self.pending.items()}
        in_flight.update({r.rollout_id: (r.group_id, r.group_size, r.split) for r in self.outbox.held()})
        keep = (
            kept_groups(in_flight, self.engine.policy_version, rebase.version)
            if not runs_rounds(self.config.run.mode)  # a round starts whole at the resumed version
            else set()
        )
        aborted = [request_id for request_id, (group_id, _, _) in in_flight.items() if group_id not in keep]
        self.engine.abort([request_id for request_id in aborted if request_id in self.pending])
        for request_id in aborted:
            self.pending.pop(request_id, None)
        self.outbox.keep_only(keep)
        # What waited in the rollout socket was for the dead preprocessor: dropped with the socket.
        self.outbox.reopen()
        kept_positions = {where[1] for group in keep if (where := prompt_position(group)) is not None}
        checkpoint = Path(rebase.checkpoint) if rebase.checkpoint else None
        self.prompts, regenerated = stream_after_rebase(
            self.config, self.problems, self.actor_id, checkpoint, kept_positions, self.furthest_position
        )
        self.started_at = paused_at  # the resumed lineage's hand-outs; the kept groups are its own
        for group in sorted(keep):
            where = prompt_position(group)
            position = where[1] if where is not None else -1
            self.handed_out.write(
                {"position": position, "group_id": group, "started_at": self.started_at, "kept": True}
            )
        self.refused_version = -1  # a refusal of the discarded lineage's says nothing of the resumed one
        if self.eval_sets:
            self.eval_schedule = EvalSchedule(self.config.eval.every, rebase.version)
        self.metrics.close()  # the launcher sets this attempt's records of discarded versions aside
        answer = RebaseAnswer(
            actor_id=self.actor_id,
            attempt=rebase.attempt,
            engine_version=self.engine.policy_version,
            kept_groups=len(keep),
            kept_sequences=len(self.pending) + len(self.outbox),
            aborted_sequences=len(aborted),
            regenerated_prompts=regenerated,
            paused_at=paused_at,
        )
        write_answer(self.run_dir, answer)
        logger.info(
            "paused for the restart from version %d: kept %d groups (%d sequences), aborted %d sequences, "
            "%d prompts to hand out again",
            rebase.version,
            answer.kept_groups,
            answer.kept_sequences,
            answer.aborted_sequences,
            regenerated,
        )
        self.handshake.answered()
        while not self.handshake.resumed() and not self.stop.is_set():
            self.timed_push(timeout_s=0.05)  # the kept sequences finish and wait for the new preprocessor

    def report(self, pause_s: float | None, phases: dict[str, float] | None = None) -> None:
        """One record per loaded update: its pause, and tokens/s and idle time since the last one. A
        refused update (``pause_s`` None) gets one too, without a pause: its count is on record even
        when no update loads after it."""
        with self._report_lock:
            now, tokens, idle = time.monotonic(), self.tokens_generated, self.idle_s
            started = self.idle_started
            if started is not None:
                idle += now - started
            then, tokens_then, idle_then = self._last_report
            self._last_report = (now, tokens, idle)
            elapsed = max(now - then, 1e-9)
            busy = max(elapsed - (idle - idle_then) - (pause_s or 0.0), 1e-9)  # decoding, prefilling
            pause = {} if pause_s is None else {registry.UPDATE_PAUSE_MS: 1000 * pause_s}
            pause.update(phases or {})
            self.metrics.write(
                {
                    registry.ACTOR_ID: self.actor_id,
                    registry.POLICY_VERSION: self.engine.policy_version,
                    registry.TIME: time.time(),
                    **pause,
                    registry.ACTOR_TOKENS_PER_S: (tokens - tokens_then) / elapsed,
                    registry.ACTOR_BUSY_TOKENS_PER_S: (tokens - tokens_then) / busy,
                    registry.ACTOR_IDLE_FRACTION: min(1.0, (idle - idle_then) / elapsed),
                    registry.ACTOR_IN_FLIGHT: self.engine.num_in_flight,
                    registry.ACTOR_TOKENS_GENERATED: tokens,
                    registry.ACTOR_MALFORMED: self.notices.malformed_count,
                    registry.ACTOR_NOTICES_LOST: self.notices.lost_count,
                    registry.ACTOR_WEIGHT_BUCKETS_REFUSED: self.buckets_refused,
                }
            )

    @contextlib.contextmanager
    def idle(self) -> Iterator[None]:
        """Count the time inside as idle (an update report in the middle sees it too)."""
        started = self.idle_started = time.monotonic()
        try:
            yield
        finally:
            self.idle_started = None
            self.idle_s += time.monotonic() - started

    # ----- generation -----

    def submit_group(self) -> None:
        position, problem = next(self.prompts)
        self.furthest_position = max(self.furthest_position, position)
        group_id = train_group_id(self.actor_id, position, uuid.uuid4().hex[:16])
        self.handed_out.write({"position": position, "group_id": group_id, "started_at": self.started_at})
        prompt_ids = self.encode(problem)
        for _ in range(self.config.rl.group_size):
            request_id = uuid.uuid4().hex
            self.pending[request_id] = PendingSample(problem, group_id, self.config.rl.group_size)
            self.engine.submit(request_id, prompt_ids)

    def cut_at_stop_string(self, sequence: CompletedSequence) -> CompletedSequence:
        """The sequence ended right after the task's first stop string (then finished), else as it is.

        The engines stop only on end-of-sequence ids; a stop string is applied here, after the fact:
        the tokens after it are dropped with their log-probs and versions, which leaves the kept
        tokens' behaviour log-probs exactly as sampled."""
        keep = cut_at_stop(sequence.completion_token_ids, self.decode, self.stop_strings)
        if keep is None:
            return sequence
        return replace(
            sequence,
            completion_token_ids=sequence.completion_token_ids[:keep],
            behaviour_logprobs=sequence.behaviour_logprobs[:keep],
            token_versions=sequence.token_versions[:keep],
            finished=True,
        )

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of one sequence's tokens, special tokens left out."""
        text = self.tokenizer.decode(list(token_ids), skip_special_tokens=True)
        if not isinstance(text, str):  # a batch of sequences decodes to a list; one sequence never does
            raise TypeError(f"decoding one sequence gave {type(text).__name__}, not its text")
        return text

    def submit_eval_if_due(self) -> None:
        """Submit every eval set (k samples a problem) when an eval round is due at this version."""
        version = self.engine.policy_version
        if not self.eval_schedule.due(version):
            return
        samples, greedy = self.config.eval.samples, self.config.eval.greedy
        for set_name, problems in self.eval_sets.items():
            group_id = eval_group_id(set_name, version)
            size = len(problems) * samples
            logger.info("eval round %s: %d problems x %d samples", group_id, len(problems), samples)
            for problem in problems:
                prompt_ids = self.encode(problem)
                for _ in range(samples):
                    request_id = uuid.uuid4().hex
                    self.pending[request_id] = PendingSample(problem, group_id, size, split="eval")
                    self.engine.submit(request_id, prompt_ids, greedy=greedy)

    def push_finished(self, timeout_s: float) -> int:
        """Send what the engine finished (``Outbox``: a train group whole), after what an earlier call
        could not send; returns how many sequences the engine gave."""
        if not self.outbox.flush(self.gives_up_sending, self.idle):
            return 0
        finished = self.engine.poll(timeout_s)
        for sequence in finished:
            self.outbox.put(self.rollout_of(sequence))
        self.outbox.flush(self.gives_up_sending, self.idle)
        return len(finished)

    def gives_up_sending(self) -> bool:
        return self.stop.is_set() or self.handshake.request is not None

    def rollout_of(self, sequence: CompletedSequence) -> Rollout:
        sample = self.pending.pop(sequence.request_id)
        sequence = self.cut_at_stop_string(sequence)
        self.tokens_generated += len(sequence.completion_token_ids)
        return Rollout(
            rollout_id=sequence.request_id,
            run_id=self.run_id,
            group_id=sample.group_id,
            group_size=sample.group_size,
            problem_id=sample.problem.problem_id,
            split=sample.split,
            actor_id=self.actor_id,
            prompt_token_ids=np.asarray(sequence.prompt_token_ids, dtype=np.int32),
            completion_token_ids=np.asarray(sequence.completion_token_ids, dtype=np.int32),
            behaviour_logprobs=np.asarray(sequence.behaviour_logprobs, dtype=np.float32),
            token_versions=np.asarray(sequence.token_versions, dtype=np.int32),
            finished=sequence.finished,
            completion_text=self.decode(sequence.completion_token_ids),
            created_at=time.time(),
        )

    def run_pipeline(self) -> None:
        """Keep H in flight; pipeline mode loads weights from the receiver thread, async here."""
        admission = continuous_admission(self.config)
        while not self.stop.is_set():
            if (rebase := self.handshake.request) is not None:
                self.pause_for_rebase(rebase)
                admission = continuous_admission(self.config)
                continue
            if admission.load_now(self.staged.version, self.engine.policy_version, self.engine.num_in_flight):
                self.apply_staged()
            if admission.eval_may_start():
                self.submit_eval_if_due()
            for _ in range(admission.groups_to_admit(self.engine.num_in_flight)):
                self.submit_group()
            self.timed_push(timeout_s=0.05)

    def timed_push(self, timeout_s: float) -> None:
        """``push_finished``, counting the wait as idle when nothing was in flight."""
        if self.engine.num_in_flight:
            self.push_finished(timeout_s)
            return
        with self.idle():
            self.push_finished(timeout_s)

    def run_conventional(self) -> None:
        """Rounds: G·B samples with frozen weights, then wait for the weights after G trainer steps."""
        while not self.stop.is_set():
            if (rebase := self.handshake.request) is not None:
                self.pause_for_rebase(rebase)  # the round is given up: the next starts at the lineage's
                continue
            this_round = conventional_round(self.config, start_version=self.engine.policy_version)
            self.submit_eval_if_due()  # with the round's frozen weights
            while this_round.generating(self.engine.num_in_flight, self.stop.is_set()):
                if self.handshake.request is not None:
                    break
                for _ in range(this_round.groups_to_admit(self.engine.num_in_flight)):
                    self.submit_group()
                self.timed_push(timeout_s=0.05)
            else:  # the round was not given up for a rebase
                self.wait_for_version(this_round.next_version)

    def wait_for_version(self, version: int) -> None:
        """Block until the engine runs ``version``, that version's update was refused (the round goes
        on with the weights the actor has), or the run stops."""
        with self.idle(), self.weights_ready:
            while self.handshake.request is None and not wait_over(
                max(self.engine.policy_version, self.refused_version), version, self.stop.is_set()
            ):
                self.weights_ready.wait(timeout=0.5)  # a rebase is asked for without a notify

    def run(self) -> None:
        receiver = threading.Thread(target=self.receive_weights, name="weights", daemon=True)
        receiver.start()
        try:
            if runs_rounds(self.config.run.mode):
                self.run_conventional()
            else:
                self.run_pipeline()
        finally:
            self.stop.set()
            receiver.join(timeout=5)
            self.engine.close()
            self.outbox.close()
            self.notices.close()
            self.metrics.close()
            pauses = np.array(self.pauses_s or [0.0]) * 1000
            logger.info(
                "actor %d: %d tokens, %d updates, pause median %.1f ms p99 %.1f ms",
                self.actor_id,
                self.tokens_generated,
                len(self.pauses_s),
                float(np.median(pauses)),
                float(np.percentile(pauses, 99)),
            )
        if self.weights_error is not None:
            raise SystemExit(f"actor {self.actor_id}: {self.weights_error}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--actor-id", type=int, default=0)
    parser.add_argument("--model-path", type=Path, required=True)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s actor{args.actor_id} %(levelname)s %(message)s"
    )
    config = PipelineConfig.model_validate_json((args.run_dir / "config.json").read_text())
    torch.set_num_threads(config.actor.torch_threads)
    Actor(config, args.run_dir, args.actor_id, args.model_path).run()


if __name__ == "__main__":
    main()
