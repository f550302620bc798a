"""The metric registry: every key a run writes or shows, declared once. Pure: no I/O.

Every key a stage writes into its records (``metrics.jsonl``, ``actor<k>.jsonl``,
``preprocessor.jsonl``, ``preprocessor.final.json``, ``eval.jsonl``), every name the tracker logs to
MLflow, every field of ``summary.json`` and every statistic the terminal view, the dashboard or the
bench shows is declared here, once, with its owner (the stage that computes it), its unit and what
it means. Code elsewhere names a metric through this module's constants (``TRAINER_TOKENS``,
``ACTOR_IDLE_FRACTION``, ...) or, for a family with variable parts, through its pattern
(``scores/{label}``, ``eval/{set}/pass_at_{k}``, ``actor/{actor}/idle_fraction``) and ``name_of``.
``docs/metrics.md`` is this table rendered (``metric_docs.markdown_table``); a unit test keeps the two equal.

**Namespaces.** Statistics are namespaced by what they measure (``rl/``, ``lag/``, ``completion/``,
``trainer/``, ``actor/``, ``preprocessor/``, ``queue/``, ``weights/``, ``throughput/``, ``eval/``,
``scores/``, ``samples/``, ``tokens/``, ``ledger/``, ``run/``, ``restart/``, ``summary/``). A few
bare keys remain on purpose: the bookkeeping fields every record carries (``policy_version``,
``time``, ``step``, ...; kind ``field``, never logged as metrics) and the fields of an eval round's
record and of ``summary.json``, which are records of their own (their MLflow names are namespaced:
``eval/<set>/...``, ``summary/<field>``).

**Actors are a label, not a prefix.** An actor record carries ``actor_id`` (the platform database
and the dashboard keep it as a field). MLflow has no labels, so the tracker logs each actor metric
twice: under its plain name, the value of all actors together (``ACTOR_AGGREGATES``: rates and
counts summed, fractions and pauses averaged over each actor's latest record), and once per actor
under ``actor/<k>/<name>`` (the name's own ``actor/`` namespace is not repeated:
``actor/1/idle_fraction``, ``actor/1/throughput/actor_tokens_per_s``; ``per_actor_name`` and
``actor_label`` convert). Runs logged before this carried actor 0's value under the plain name and
the other actors' under ``actor<k>:<name>``.

**Renamed keys stay readable.** ``RECORD_ALIASES`` (old key of a stage's record -> new key) and
``MLFLOW_ALIASES`` / ``MLFLOW_ALIAS_PATTERNS`` (old MLflow name -> new) say what each old name became.
Everything that reads the records or MLflow history of a run written before a rename goes through
``canonical_record`` / ``canonical_name`` (the dashboard's run files and MLflow reader, the tracker's
catch-up, the bench), and a reader asking MLflow for a history also asks for the old names
(``old_names``). So a run written before the rename still shows. A unit test checks that every
alias resolves to a declared key and that no two declarations can match one name.

**Derived statistics** name their inputs and the one pure function that computes them. Trainer
tokens/s and idle fraction are derived here only, for MLflow (per step), the dashboard (per step and
over its window), the terminal view and ``summary.json`` (over the run), from the same inputs:
``trainer/tokens``, ``trainer/step_s``, ``trainer/wait_s`` and ``weights/broadcast_ms``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from pipelinerl.platform.tracking.trainer_cycle import trainer_idle_fraction, trainer_tokens_per_s

Owner = Literal["trainer", "actor", "preprocessor", "eval", "launcher", "tracker", "record"]
# Where a key appears: a stage's record file, MLflow, summary.json.
Record = Literal["trainer", "actor", "preprocessor", "preprocessor_final", "eval", "summary"]
Kind = Literal["metric", "field"]
Aggregate = Literal["sum", "mean"]

# The variable parts of a family's name: what each may be, and an example (for tests and the docs).
PLACEHOLDERS: dict[str, tuple[str, str]] = {
    "set": (r"[A-Za-z0-9_-]+", "heldout"),  # an eval set (workers/evaluation.py's group ids)
    "label": (r"[a-z_]+", "correct"),  # a score label (tasks/base.py LABELS)
    "reason": (r"[a-z_]+", "stale"),  # why the preprocessor dropped a sample
    "k": (r"[1-9][0-9]*", "4"),  # pass@k
    "actor": (r"[0-9]+", "1"),  # an actor's id
    "side": (r"predicted|measured", "predicted"),  # a plan's figure as the simulator or the run gave it
    "figure": (r"[a-z_]+", "samples_per_s"),  # a figure the simulator predicts (plan/measured.py)
    "phase": (r"pause|receive|load|label_resume", "load"),  # an update pause's phase (update_phases.py)
}


@dataclass(frozen=True)
class Metric:
    """One declared key, or a family of keys (a ``name`` with ``{placeholders}``)."""

    name: str
    owner: Owner
    unit: str
    description: str
    kind: Kind = "metric"
    records: frozenset[Record] = frozenset()  # the records that carry it under this name
    mlflow: bool = False  # the tracker logs it to MLflow under this name
    stored: str | None = None  # "<table>.<column>" of the platform database that keeps it
    api: str | None = None  # the dashboard API's field for it (the column's name when stored)
    actors: Aggregate | None = None  # actor metrics: how the actors' values combine
    inputs: tuple[str, ...] = ()  # derived: the keys it is computed from
    derive: Callable[[Mapping[str, Any]], float | None] | None = field(default=None, compare=False)

    @property
    def is_pattern(self) -> bool:
        return "{" in self.name

    @property
    def column(self) -> str | None:
        return None if self.stored is None else self.stored.split(".")[1]


# ----- derivations (the formulas: trainer_cycle.py) -----


def _trainer_inputs(record: Mapping[str, Any]) -> tuple[float, float, float]:
    # A step after which no weights were published (conventional mode, within a round) has no broadcast.
    return (
        float(record[TRAINER_STEP_S]),
        float(record[TRAINER_WAIT_S]),
        float(record.get(WEIGHTS_BROADCAST_MS) or 0.0),
    )


def _tokens_per_s_of(record: Mapping[str, Any]) -> float | None:
    return trainer_tokens_per_s(float(record[TRAINER_TOKENS]), *_trainer_inputs(record))


def _idle_fraction_of(record: Mapping[str, Any]) -> float | None:
    return trainer_idle_fraction(*_trainer_inputs(record))


# ----- the names -----

# Record fields (bookkeeping, not metrics).
STEP, POLICY_VERSION, TIME, WALL_S = "step", "policy_version", "time", "wall_s"
TRAINED_AT_VERSION, ROLLOUTS, CHECKPOINT = "trained_at_version", "rollouts", "checkpoint"
TRAINED_GROUPS = "trained_groups"
ACTOR_ID, BATCH_INDEX, TRAINER_VERSION = "actor_id", "batch_index", "trainer_version"
# The trainer, one record per optimizer step (metrics.jsonl).
LOSS, REWARD_MEAN, CLIPPED_FRACTION = "rl/loss", "rl/reward_mean", "rl/clipped_fraction"
ESS, ESS_TRUNCATED, BEHAVIOUR_MISMATCH = "rl/ess", "rl/ess_truncated", "rl/behaviour_mismatch"
CLIPPED_LOW_FRACTION, CLIPPED_HIGH_FRACTION = "rl/clipped_low_fraction", "rl/clipped_high_fraction"
KL_MEAN, ENTROPY_MEAN = "rl/kl_mean", "rl/entropy_mean"
LAG_MEAN, LAG_P50, LAG_P90, LAG_MAX = "lag/mean", "lag/p50", "lag/p90", "lag/max"
LAG_HISTOGRAM, LAG_BY_POSITION = "lag/histogram", "lag/by_position"
LAG_POSITION_BUCKET_SIZE = "lag/position_bucket_size"
TRAINER_SAMPLES, TRAINER_TOKENS = "trainer/samples", "trainer/tokens"
SAMPLES_TRAINED, TOKENS_TRAINED = "samples/trained", "tokens/trained"
TRAINER_INFLIGHT_SEQUENCES, TRAINER_MICRO_BATCHES = "trainer/inflight_sequences", "trainer/micro_batches"
COMPLETION_LEN_MEAN, COMPLETION_LEN_P50 = "completion/len_mean", "completion/len_p50"
COMPLETION_LEN_P90, COMPLETION_LEN_MAX = "completion/len_p90", "completion/len_max"
TRAINER_STEP_S, TRAINER_WAIT_S = "trainer/step_s", "trainer/wait_s"
TRAINER_BATCH_RECORD_MS, TRAINER_BATCH_RECORD_BYTES = "trainer/batch_record_ms", "trainer/batch_record_bytes"
TRAINER_WEIGHTS_DIGEST_MS, TRAINER_GRAD_NORM = "trainer/weights_digest_ms", "trainer/grad_norm"
WEIGHTS_BROADCAST_MS = "weights/broadcast_ms"
TRAINER_MALFORMED, TRAINER_REJECTED = "trainer/malformed", "trainer/rejected"
TRAINER_UNAUTHENTICATED = "trainer/unauthenticated"
TRAINER_TOKENS_PER_S, TRAINER_IDLE_FRACTION = "throughput/trainer_tokens_per_s", "trainer/idle_fraction"
# Each actor, one record per loaded weight update (actor<k>.jsonl).
ACTOR_TOKENS_PER_S, ACTOR_IDLE_FRACTION = "throughput/actor_tokens_per_s", "actor/idle_fraction"
ACTOR_BUSY_TOKENS_PER_S = "throughput/actor_busy_tokens_per_s"
UPDATE_PAUSE_MS, ACTOR_IN_FLIGHT = "weights/update_pause_ms", "actor/in_flight"
UPDATE_PHASE_MS, WEIGHTS_RECEIVE_MS = "weights/update_phase_ms/{phase}", "weights/receive_ms"
ACTOR_TOKENS_GENERATED = "actor/tokens_generated"
ACTOR_MALFORMED, ACTOR_NOTICES_LOST = "actor/malformed", "actor/notices_lost"
ACTOR_WEIGHT_BUCKETS_REFUSED = "actor/weight_buckets_refused"
PER_ACTOR = "actor/{actor}/"  # the per-actor MLflow names: this prefix and the actor metric
# The preprocessor, one record per batch sent (preprocessor.jsonl), its counts at the end (.final.json).
QUEUE_ROLLOUTS, PREPROCESSOR_HELD_S = "queue/rollouts", "preprocessor/held_s"
PREPROCESSOR_BATCHES_BUILT = "preprocessor/batches_built"
SCORES, SAMPLES_DROPPED = "scores/{label}", "samples/dropped_{reason}"
PREPROCESSOR_REJECTED, PREPROCESSOR_MALFORMED = "preprocessor/rejected", "preprocessor/malformed"
PREPROCESSOR_PEER_DISCONNECTS = "preprocessor/peer_disconnects"
PREPROCESSOR_LOST, PREPROCESSOR_LOST_FROM_ACTORS = "preprocessor/lost", "preprocessor/lost_from_actors"
PREPROCESSOR_UNAUTHENTICATED = "preprocessor/unauthenticated"
PREPROCESSOR_RECEIVED = "preprocessor/received"
PREPROCESSOR_RECEIVED_FROM_ACTORS = "preprocessor/received_from_actors"
# An in-run evaluation round (eval.jsonl) and its MLflow names.
EVAL_SET, EVAL_PROBLEMS, EVAL_SAMPLES, EVAL_PASS_AT = "set", "problems", "samples", "pass@{k}"
EVAL_MEAN_REWARD, EVAL_MEAN_LENGTH, EVAL_LABELS = "mean_reward", "mean_length", "labels"
EVAL_MIXED_VERSION_FRACTION = "mixed_version_fraction"
EVAL_SET_PASS_AT, EVAL_SET_SCORES = "eval/{set}/pass_at_{k}", "eval/{set}/scores/{label}"
EVAL_SET_MEAN_REWARD, EVAL_SET_MEAN_LENGTH = "eval/{set}/mean_reward", "eval/{set}/mean_length"
EVAL_SUCCESS = "eval/success"
# The tracker's own.
LEDGER_DUPLICATES, RUN_RESTARTS = "ledger/duplicates", "run/restarts"
RESTART_DISCARDED_VERSIONS = "restart/discarded_versions"
RESTART_DISCARDED_ROLLOUTS, RESTART_LOST_IN_FLIGHT = "restart/discarded_rollouts", "restart/lost_in_flight"
RESTART_KEPT_IN_ACTORS, RESTART_REGENERATED = "restart/kept_in_actors", "restart/regenerated"
SUMMARY = "summary/{field}"  # a numeric field of summary.json, logged at the run's end
PLAN = "plan/{side}/{figure}"  # run.plan_profile: the simulator's prediction of the run, and what it measured

_TRAINER: frozenset[Record] = frozenset({"trainer"})
_ACTOR: frozenset[Record] = frozenset({"actor"})
_PRE: frozenset[Record] = frozenset({"preprocessor"})
_PRE_BOTH: frozenset[Record] = frozenset({"preprocessor", "preprocessor_final"})
_SUMMARY: frozenset[Record] = frozenset({"summary"})


def _field(name: str, owner: Owner, unit: str, description: str, records: Iterable[Record]) -> Metric:
    return Metric(name, owner, unit, description, kind="field", records=frozenset(records))


_ALL_STAGES: tuple[Record, ...] = ("trainer", "actor", "preprocessor", "preprocessor_final", "eval")
_FINAL: frozenset[Record] = frozenset({"preprocessor_final"})
# fmt: off
_STAGE_METRICS: tuple[Metric, ...] = (
    _field(STEP, "record", "version", "trainer: the policy version the step made; preprocessor: the "
           "optimizer step its batch feeds", ("trainer", "preprocessor")),
    _field(POLICY_VERSION, "record", "version", "the version the record is about (actor: the one loaded; "
           "eval: the one the round ran)", ("trainer", "actor", "eval")),
    _field(TIME, "record", "s", "Unix time the record was written", _ALL_STAGES),
    _field(WALL_S, "trainer", "s", "seconds since the trainer started", ("trainer",)),
    _field(TRAINED_AT_VERSION, "trainer", "version", "the trainer's version when it trained the step",
           ("trainer",)),
    _field(ROLLOUTS, "trainer", "ids", "(rollout id, oldest version that wrote it) of each trained "
           "sequence: the tracker fills the rollout ledger from them", ("trainer",)),
    _field(TRAINED_GROUPS, "trainer", "ids", "the groups the step trained a sequence of, every rank's: the "
           "tracker fills the prompt ledger's outcomes from them", ("trainer",)),
    _field(CHECKPOINT, "trainer", "path", "the checkpoint saved after the step", ("trainer",)),
    _field(ACTOR_ID, "actor", "id", "which actor wrote the record: a label, never part of a name",
           ("actor",)),
    _field(BATCH_INDEX, "preprocessor", "batches", "the batch's index in the run", ("preprocessor",)),
    _field(TRAINER_VERSION, "preprocessor", "version", "the trainer's version when the batch was sent",
           ("preprocessor",)),
    Metric(LOSS, "trainer", "loss", "the step's loss", records=_TRAINER, mlflow=True,
           stored="step_stats.loss"),
    Metric(REWARD_MEAN, "trainer", "reward", "mean reward of the step's samples", records=_TRAINER,
           mlflow=True, stored="step_stats.reward_mean"),
    Metric(ESS, "trainer", "fraction", "effective sample size / N of the raw importance weights",
           records=_TRAINER, mlflow=True, stored="step_stats.ess"),
    Metric(ESS_TRUNCATED, "trainer", "fraction", "ESS / N of the capped weights the loss uses",
           records=_TRAINER, mlflow=True),
    Metric(CLIPPED_FRACTION, "trainer", "fraction", "share of tokens whose weight the cap or clip "
           "changed", records=_TRAINER, mlflow=True),
    Metric(CLIPPED_LOW_FRACTION, "trainer", "fraction", "share of tokens whose weight hit the loss's "
           "lower bound (1 - rl.clip_low; 0 for truncated_is)", records=_TRAINER, mlflow=True),
    Metric(CLIPPED_HIGH_FRACTION, "trainer", "fraction", "share of tokens whose weight hit the loss's "
           "upper bound (1 + rl.clip_high, or truncated_is's cap rl.is_cap)", records=_TRAINER, mlflow=True),
    Metric(KL_MEAN, "trainer", "nats", "mean per-token KL estimate (rl.kl.estimator) of the policy to the "
           "frozen reference (only with rl.kl.coef > 0)", records=_TRAINER, mlflow=True),
    Metric(ENTROPY_MEAN, "trainer", "nats", "mean token entropy of the policy at the sampling temperature "
           "(only with rl.entropy_coef > 0)", records=_TRAINER, mlflow=True),
    Metric(BEHAVIOUR_MISMATCH, "trainer", "nats", "mean |trainer - actor log-prob| over lag-0 tokens "
           "(absent in a step without one)", records=_TRAINER, mlflow=True),
    Metric(LAG_MEAN, "trainer", "versions", "mean token lag (trainer version - sampling version)",
           records=_TRAINER, mlflow=True, stored="step_stats.lag_mean"),
    Metric(LAG_P50, "trainer", "versions", "median token lag", records=_TRAINER, mlflow=True,
           stored="step_stats.lag_p50"),
    Metric(LAG_P90, "trainer", "versions", "90th percentile token lag", records=_TRAINER, mlflow=True,
           stored="step_stats.lag_p90"),
    Metric(LAG_MAX, "trainer", "versions", "largest token lag", records=_TRAINER, mlflow=True,
           stored="step_stats.lag_max"),
    Metric(LAG_HISTOGRAM, "trainer", "tokens", "tokens by lag (entry k: lag k)", kind="field",
           records=_TRAINER, stored="lag_histograms.count"),
    Metric(LAG_BY_POSITION, "trainer", "versions", "mean lag by token-position bucket", kind="field",
           records=_TRAINER),
    Metric(LAG_POSITION_BUCKET_SIZE, "trainer", "tokens", "positions per lag/by_position bucket",
           kind="field", records=_TRAINER),
    Metric(TRAINER_SAMPLES, "trainer", "samples", "sequences trained in the step", records=_TRAINER,
           stored="step_stats.samples"),
    Metric(TRAINER_TOKENS, "trainer", "tokens", "completion tokens trained in the step",
           records=_TRAINER, stored="step_stats.tokens"),
    Metric(SAMPLES_TRAINED, "trainer", "samples", "sequences trained so far", records=_TRAINER,
           mlflow=True, stored="policy_versions.samples_trained"),
    Metric(TOKENS_TRAINED, "trainer", "tokens", "completion tokens trained so far", records=_TRAINER,
           mlflow=True, stored="policy_versions.tokens_trained"),
    Metric(TRAINER_INFLIGHT_SEQUENCES, "trainer", "sequences", "sequences of the step written by two "
           "or more policy versions", records=_TRAINER, api="multi_version_sequences"),
    Metric(TRAINER_MICRO_BATCHES, "trainer", "micro-batches", "micro-batches of the step",
           records=_TRAINER),
    Metric(COMPLETION_LEN_MEAN, "trainer", "tokens", "mean completion length of the step",
           records=_TRAINER, mlflow=True),
    Metric(COMPLETION_LEN_P50, "trainer", "tokens", "median completion length", records=_TRAINER,
           mlflow=True),
    Metric(COMPLETION_LEN_P90, "trainer", "tokens", "90th percentile completion length",
           records=_TRAINER, mlflow=True),
    Metric(COMPLETION_LEN_MAX, "trainer", "tokens", "longest completion", records=_TRAINER, mlflow=True),
    Metric(TRAINER_STEP_S, "trainer", "s", "seconds training the step", records=_TRAINER,
           stored="step_stats.step_s"),
    Metric(TRAINER_WAIT_S, "trainer", "s", "seconds waiting for the step's batch", records=_TRAINER,
           stored="step_stats.wait_s"),
    Metric(TRAINER_BATCH_RECORD_MS, "trainer", "ms", "writing the step's batch for replay (rank 0's; "
           "absent with trainer.record_batches=false)", records=_TRAINER, mlflow=True),
    Metric(TRAINER_BATCH_RECORD_BYTES, "trainer", "bytes", "size of rank 0's record of the step's batch "
           "(batches/step_<version>_rank0.batch)", records=_TRAINER, mlflow=True),
    Metric(TRAINER_WEIGHTS_DIGEST_MS, "trainer", "ms", "hashing the weights the step made "
           "(digests/step_<version>.json, what a replay is checked against; with trainer.record_batches)",
           records=_TRAINER, mlflow=True),
    Metric(TRAINER_GRAD_NORM, "trainer", "norm", "global gradient norm of the step, before clipping "
           "(trainer.grad_clip)", records=_TRAINER, mlflow=True),
    Metric(WEIGHTS_BROADCAST_MS, "trainer", "ms", "notice and broadcast of the weights after the step "
           "(absent when none were published)", records=_TRAINER, mlflow=True,
           stored="policy_versions.broadcast_ms"),
    Metric(TRAINER_MALFORMED, "trainer", "count", "damaged batch frames so far", records=_TRAINER,
           mlflow=True),
    Metric(TRAINER_UNAUTHENTICATED, "trainer", "count", "peers refused in the handshake by its notice and "
           "batch sockets so far", records=_TRAINER, mlflow=True),
    Metric(TRAINER_REJECTED, "trainer", "count", "sequences and batches refused so far",
           records=_TRAINER, mlflow=True),
    Metric(TRAINER_TOKENS_PER_S, "trainer", "tokens/s", "trainer/tokens / (step_s + broadcast + "
           "wait_s): trainer_tokens_per_s", mlflow=True, api="trainer_tokens_per_s",
           inputs=(TRAINER_TOKENS, TRAINER_STEP_S, TRAINER_WAIT_S, WEIGHTS_BROADCAST_MS),
           derive=_tokens_per_s_of),
    Metric(TRAINER_IDLE_FRACTION, "trainer", "fraction", "wait_s / (step_s + broadcast + wait_s): "
           "trainer_idle_fraction", mlflow=True, api="trainer_idle_fraction",
           inputs=(TRAINER_STEP_S, TRAINER_WAIT_S, WEIGHTS_BROADCAST_MS), derive=_idle_fraction_of),
    Metric(ACTOR_TOKENS_PER_S, "actor", "tokens/s", "tokens generated per second since the previous "
           "update", records=_ACTOR, mlflow=True, actors="sum"),
    Metric(ACTOR_BUSY_TOKENS_PER_S, "actor", "tokens/s", "tokens generated per second of the time since the "
           "previous update the actor was neither idle nor paused for an update (what a decode step "
           "costs: plan calibrate fits it)", records=_ACTOR, actors="sum"),
    Metric(ACTOR_IDLE_FRACTION, "actor", "fraction", "share of the time since the previous update "
           "with nothing to generate", records=_ACTOR, mlflow=True, actors="mean"),
    Metric(UPDATE_PAUSE_MS, "actor", "ms", "generation paused to load the update (the database keeps "
           "actor 0's)", records=_ACTOR, mlflow=True, actors="mean", stored="policy_versions.pause_ms"),
    Metric(UPDATE_PHASE_MS, "actor", "ms", "a phase of the update pause (pause: until the engine stopped; "
           "receive, when the tensors arrive inside the pause; load; label_resume): they add up to the "
           "pause (workers/update_phases.py)", records=_ACTOR, actors="mean"),
    Metric(WEIGHTS_RECEIVE_MS, "actor", "ms", "the update's tensors arriving and checked against the "
           "trainer's digests, inside the pause or before it", records=_ACTOR, mlflow=True, actors="mean"),
    Metric(ACTOR_IN_FLIGHT, "actor", "sequences", "sequences in the engine at the update",
           records=_ACTOR, actors="sum"),
    Metric(ACTOR_TOKENS_GENERATED, "actor", "tokens", "tokens generated so far", records=_ACTOR,
           actors="sum"),
    Metric(ACTOR_MALFORMED, "actor", "count", "damaged notice frames so far", records=_ACTOR,
           mlflow=True, actors="sum"),
    Metric(ACTOR_NOTICES_LOST, "actor", "count", "weight-update notices numbered but never received",
           records=_ACTOR, mlflow=True, actors="sum"),
    Metric(ACTOR_WEIGHT_BUCKETS_REFUSED, "actor", "count", "weight buckets refused so far: their bytes "
           "did not match the trainer's digest (the update was not loaded)", records=_ACTOR, mlflow=True,
           actors="sum"),
    Metric(QUEUE_ROLLOUTS, "preprocessor", "rollouts", "rollouts waiting to be batched",
           records=_PRE, mlflow=True),
    Metric(PREPROCESSOR_HELD_S, "preprocessor", "s", "seconds the batch was held back for the trainer",
           records=_PRE),
    Metric(PREPROCESSOR_BATCHES_BUILT, "preprocessor", "batches", "batches built so far",
           records=_PRE_BOTH),
    Metric(SCORES, "preprocessor", "count", "scored training rollouts by label so far", records=_PRE,
           mlflow=True),
    Metric(SAMPLES_DROPPED, "preprocessor", "count", "samples dropped so far, by reason (stale, "
           "zero_variance, incomplete_group)", records=_PRE_BOTH, mlflow=True),
    Metric(PREPROCESSOR_REJECTED, "preprocessor", "count", "messages with impossible values or "
           "replayed numbers so far", records=_PRE_BOTH, mlflow=True),
    Metric(PREPROCESSOR_MALFORMED, "preprocessor", "count", "damaged frames so far", records=_PRE_BOTH,
           mlflow=True),
    Metric(PREPROCESSOR_PEER_DISCONNECTS, "preprocessor", "count", "rollout peers that went away",
           records=_PRE_BOTH, mlflow=True),
    Metric(PREPROCESSOR_LOST, "preprocessor", "count", "rollouts numbered but never received",
           records=_PRE_BOTH, mlflow=True),
    Metric(PREPROCESSOR_LOST_FROM_ACTORS, "preprocessor", "count", "of those, from the run's actors",
           records=_PRE_BOTH, mlflow=True),
    Metric(PREPROCESSOR_UNAUTHENTICATED, "preprocessor", "count", "peers refused in the handshake",
           records=_PRE_BOTH, mlflow=True),
    Metric(PREPROCESSOR_RECEIVED, "preprocessor", "count", "rollouts received in all", records=_FINAL),
    Metric(PREPROCESSOR_RECEIVED_FROM_ACTORS, "preprocessor", "count", "of those, on the actors' own "
           "streams", records=_FINAL),
    _field(EVAL_SET, "eval", "name", "the eval set of the round", ("eval",)),
    _field(EVAL_PROBLEMS, "eval", "problems", "problems in the round", ("eval",)),
    _field(EVAL_SAMPLES, "eval", "samples", "samples per problem (k)", ("eval",)),
    _field(EVAL_PASS_AT, "eval", "fraction", "pass@k of the round (k = 1, and k if k > 1)", ("eval",)),
    _field(EVAL_MEAN_REWARD, "eval", "reward", "mean reward of the round", ("eval",)),
    _field(EVAL_MEAN_LENGTH, "eval", "tokens", "mean completion length of the round", ("eval",)),
    _field(EVAL_MIXED_VERSION_FRACTION, "eval", "fraction", "share of sequences written by more than "
           "one version", ("eval",)),
    _field(EVAL_LABELS, "eval", "count", "the round's samples by score label", ("eval",)),
    Metric(EVAL_SET_PASS_AT, "eval", "fraction", "pass@k of a round (MLflow refuses `@`)", mlflow=True),
    Metric(EVAL_SET_MEAN_REWARD, "eval", "reward", "mean reward of a round", mlflow=True),
    Metric(EVAL_SET_MEAN_LENGTH, "eval", "tokens", "mean completion length of a round", mlflow=True),
    Metric(EVAL_SET_SCORES, "eval", "count", "a round's samples by score label", mlflow=True),
    Metric(EVAL_SUCCESS, "launcher", "fraction", "greedy held-out success at the start and the end",
           mlflow=True),
    Metric(LEDGER_DUPLICATES, "tracker", "count", "rollouts the ledger saw trained twice", mlflow=True),
    Metric(RUN_RESTARTS, "tracker", "count", "times the stages were started again", mlflow=True),
    Metric(RESTART_DISCARDED_VERSIONS, "tracker", "versions", "versions a restart discarded",
           mlflow=True),
    Metric(RESTART_DISCARDED_ROLLOUTS, "tracker", "rollouts", "rollouts trained into them", mlflow=True),
    Metric(RESTART_LOST_IN_FLIGHT, "tracker", "rollouts", "rollouts in flight at the crash",
           mlflow=True),
    Metric(RESTART_KEPT_IN_ACTORS, "tracker", "sequences", "sequences actors that outlived a restart of the "
           "trainer role kept: every token by the resumed lineage", mlflow=True),
    Metric(RESTART_REGENERATED, "tracker", "prompts", "prompts a restart handed out again: neither trained "
           "into the checkpoint nor kept", mlflow=True),
    Metric(PLAN, "launcher", "as the figure", "with run.plan_profile, at the run's end: a figure of the run "
           "as the simulator predicted it (plan/measured.py) and as the run measured it", mlflow=True),
)

# summary.json's fields (launch/summary.py; the launcher adds the rest); numeric ones reach MLflow as
# summary/<field>. TOKENS_PER_S and TRAINER_WAIT_FRACTION are the trainer's derived statistics over the
# whole run (sums of their inputs over its steps).
S_MODE, S_STEPS, S_FINAL_POLICY_VERSION, S_RUN_ID = "mode", "steps", "final_policy_version", "run_id"
S_EVAL_SUCCESS_START, S_EVAL_SUCCESS_END = "eval_success_start", "eval_success_end"
S_EVAL_SAMPLES, S_EVAL_SUCCESS_GAIN, S_ESS_MEAN = "eval_samples", "eval_success_gain", "ess_mean"
S_ESS_MIN, S_LAG_MEAN, S_LAG_MAX, S_EVAL_IN_RUN = "ess_min", "lag_mean", "lag_max", "eval_in_run"
S_SAMPLES_TRAINED, S_TOKENS_TRAINED, S_TOKENS_PER_S = "samples_trained", "tokens_trained", "tokens_per_s"
S_REWARD_MEAN_FIRST, S_REWARD_MEAN_LAST = "reward_mean_first", "reward_mean_last"
S_INFLIGHT_SEQUENCES = "inflight_sequences"
S_TRAINER_WAIT_FRACTION, S_WALL_S, S_RUN_WALL_S = "trainer_wait_fraction", "wall_s", "run_wall_s"
S_PEAK_MEMORY_GIB, S_MODEL_PATH, S_PLACEMENT = "peak_memory_gib", "model_path", "placement"
S_START_POLICY_VERSION, S_RESTARTS, S_DISCARDED = "start_policy_version", "restarts", "discarded"
RECORD_FILES: dict[Record, str] = {  # the file of each record kind in a run directory
    "trainer": "metrics.jsonl", "actor": "actor<k>.jsonl", "preprocessor": "preprocessor.jsonl",
    "preprocessor_final": "preprocessor.final.json", "eval": "eval.jsonl", "summary": "summary.json",
}
# fmt: on
_SUMMARY_FIELDS: tuple[tuple[str, str, str, bool], ...] = (  # (field, unit, description, numeric)
    (S_MODE, "name", "run.mode", False),
    (S_STEPS, "steps", "optimizer steps this launch took", True),
    (S_FINAL_POLICY_VERSION, "version", "the last policy version", True),
    (S_EVAL_SUCCESS_START, "fraction", "held-out success before training (eval/success)", True),
    (S_EVAL_SUCCESS_END, "fraction", "held-out success of the final policy", True),
    (S_EVAL_SUCCESS_GAIN, "fraction", "end - start", True),
    (S_EVAL_SAMPLES, "problems", "held-out problems evaluated", True),
    (S_ESS_MEAN, "fraction", "mean of rl/ess over the steps", True),
    (S_ESS_MIN, "fraction", "smallest rl/ess", True),
    (S_LAG_MEAN, "versions", "lag/mean weighted by the steps' tokens", True),
    (S_LAG_MAX, "versions", "largest lag/max", True),
    (S_INFLIGHT_SEQUENCES, "sequences", "sum of trainer/inflight_sequences", True),
    (S_SAMPLES_TRAINED, "samples", "sum of trainer/samples", True),
    (S_TOKENS_TRAINED, "tokens", "sum of trainer/tokens", True),
    (S_REWARD_MEAN_FIRST, "reward", "rl/reward_mean of the first step", True),
    (S_REWARD_MEAN_LAST, "reward", "rl/reward_mean of the last step", True),
    (S_TRAINER_WAIT_FRACTION, "fraction", "trainer/idle_fraction over the run", True),
    (S_WALL_S, "s", "the trainer's wall time (wall_s of its last record)", True),
    (S_TOKENS_PER_S, "tokens/s", "throughput/trainer_tokens_per_s over the run", True),
    (S_RUN_ID, "id", "the run's id", False),
    (S_RUN_WALL_S, "s", "wall time of the whole launch", True),
    (S_PEAK_MEMORY_GIB, "GiB", "peak resident memory of all processes", True),
    (S_MODEL_PATH, "path", "the starting model", False),
    (S_START_POLICY_VERSION, "version", "the version the run started from", True),
    (S_RESTARTS, "count", "restarts of the stages", True),
    (S_DISCARDED, "records", "what each restart discarded (restarts.jsonl)", False),
    (S_PLACEMENT, "name", "cluster.placement", False),
    (S_EVAL_IN_RUN, "records", "the in-run evaluations' pass@1 by version and set", False),
)


def summary_name(summary_field: str) -> str:
    """The declared name of a field of summary.json (a numeric one's MLflow name too)."""
    return SUMMARY.format(field=summary_field)


_SUMMARY_METRICS = tuple(
    Metric(summary_name(name), "launcher", unit, text, "metric" if numeric else "field", _SUMMARY, numeric)
    for name, unit, text, numeric in _SUMMARY_FIELDS
)


# The per-actor MLflow family of each actor metric the tracker logs (its actor/ namespace not repeated).
_LOGGED_BY_ACTORS = tuple(m for m in _STAGE_METRICS if m.owner == "actor" and m.mlflow)
PER_ACTOR_FAMILIES = {m.name: PER_ACTOR + m.name.removeprefix("actor/") for m in _LOGGED_BY_ACTORS}
_PER_ACTOR_METRICS = tuple(
    Metric(PER_ACTOR_FAMILIES[m.name], "actor", m.unit, f"{m.description} (one actor)", mlflow=True)
    for m in _LOGGED_BY_ACTORS
)
METRICS: tuple[Metric, ...] = _STAGE_METRICS + _PER_ACTOR_METRICS + _SUMMARY_METRICS
ACTOR_AGGREGATES: dict[str, Aggregate] = {m.name: m.actors for m in METRICS if m.actors is not None}

# ----- lookups -----

_EXACT = {m.name: m for m in METRICS if not m.is_pattern}


@functools.cache
def pattern_regex(name: str) -> re.Pattern[str]:
    """The regular expression of a declared name (its placeholders as named groups)."""
    parts = re.split(r"\{(\w+)\}", name)
    text = "".join(
        re.escape(part) if index % 2 == 0 else f"(?P<{part}>{PLACEHOLDERS[part][0]})"
        for index, part in enumerate(parts)
    )
    return re.compile(f"^{text}$")


_PATTERNS = tuple((pattern_regex(m.name), m) for m in METRICS if m.is_pattern)
_PLAIN_NAMES = {family: plain for plain, family in PER_ACTOR_FAMILIES.items()}


def declarations(name: str) -> list[Metric]:
    """Every declaration that ``name`` is (one, for a declared name; a test keeps it so)."""
    found = [_EXACT[name]] if name in _EXACT else []
    return found + [metric for regex, metric in _PATTERNS if regex.match(name)]


def declaration(name: str) -> Metric | None:
    """The declaration of ``name`` (a key, or a member of a family), None if it is not declared."""
    found = declarations(name)
    return found[0] if found else None


def name_of(pattern: str, **parts: object) -> str:
    """A member of a declared family: ``name_of(SCORES, label="correct")`` is ``scores/correct``."""
    name = pattern.format(**parts)
    if declaration(name) is None:
        raise ValueError(f"{name!r} (from {pattern!r} with {parts}) is not a declared metric name")
    return name


def parts_of(pattern: str, name: str) -> dict[str, str] | None:
    """The variable parts of ``name`` as a member of ``pattern``'s family, None if it is not one."""
    match = pattern_regex(pattern).match(name)
    return match.groupdict() if match else None


def derive(name: str, record: Mapping[str, Any]) -> float | None:
    """The derived statistic ``name`` of a record that holds its inputs (None without them)."""
    metric = _EXACT[name]
    if metric.derive is None:
        raise ValueError(f"{name!r} is not a derived statistic")
    # The broadcast is absent after a step that published no weights; every other input is required.
    required = [key for key in metric.inputs if key != WEIGHTS_BROADCAST_MS]
    if any(record.get(key) is None for key in required):
        return None
    return metric.derive(record)


def derive_over(name: str, records: Iterable[Mapping[str, Any]]) -> float | None:
    """The derived statistic ``name`` over several records (a window, a whole run): of the sums of its
    inputs, so that the longer steps weigh more, as they do in wall time."""
    metric = _EXACT[name]
    sums = {key: 0.0 for key in metric.inputs}
    seen = False
    for record in records:
        seen = True
        for key in metric.inputs:
            sums[key] += float(record.get(key) or 0.0)
    return derive(name, sums) if seen else None


def stored_fields(table: str) -> dict[str, str]:
    """``{column: key}`` of what the platform database's ``table`` keeps, in declaration order."""
    return {m.stored.split(".")[1]: m.name for m in METRICS if m.stored and m.stored.startswith(table + ".")}


def column_of(name: str) -> str:
    """The platform database's column for the key ``name``."""
    if (column := _EXACT[name].column) is None:
        raise ValueError(f"{name!r} is not kept in the platform database")
    return column


def record_of_columns(columns: Mapping[str, Any]) -> dict[str, Any]:
    """A step's database columns (``step_stats``, ``policy_versions``) as a record keyed by the
    registry's names, from which ``derive`` computes what the tracker logged for that step."""
    return {m.name: columns[m.column] for m in METRICS if m.column is not None and m.column in columns}


def per_actor_name(name: str, actor_id: int) -> str:
    """The MLflow name of actor ``actor_id``'s value of the actor metric ``name``."""
    return name_of(PER_ACTOR_FAMILIES[name], actor=actor_id)


def actor_label(name: str) -> tuple[int, str] | None:
    """``(actor id, actor metric)`` of a per-actor MLflow name, None for any other name."""
    for regex, metric in _PATTERNS:
        if metric.name in _PLAIN_NAMES and (match := regex.match(name)):
            return int(match["actor"]), _PLAIN_NAMES[metric.name]
    return None


# ----- old names -----

# Keys of the trainer's records before they were namespaced.
RECORD_ALIASES: dict[Record, dict[str, str]] = {
    "trainer": {
        "samples": TRAINER_SAMPLES,
        "tokens": TRAINER_TOKENS,
        "completion_len_mean": COMPLETION_LEN_MEAN,
        "completion_len_p50": COMPLETION_LEN_P50,
        "completion_len_p90": COMPLETION_LEN_P90,
        "completion_len_max": COMPLETION_LEN_MAX,
        "inflight_sequences": TRAINER_INFLIGHT_SEQUENCES,
        "micro_batches": TRAINER_MICRO_BATCHES,
    },
}
# MLflow names logged before the renames.
MLFLOW_ALIASES: dict[str, str] = {
    old: new for old, new in RECORD_ALIASES["trainer"].items() if _EXACT[new].mlflow
}
# (old family, new family): the variable parts carry over. Tried only for undeclared names, so that
# eval/<set>/mean_reward (declared) is never taken for a label count.
MLFLOW_ALIAS_PATTERNS: tuple[tuple[str, str], ...] = (
    ("eval/{set}/{label}", EVAL_SET_SCORES),
    *(("actor{actor}:" + plain, family) for plain, family in PER_ACTOR_FAMILIES.items()),
)


def canonical_record(record: Mapping[str, Any], kind: Record) -> dict[str, Any]:
    """``record`` of a stage with its old keys renamed (a key under its new name wins)."""
    aliases = RECORD_ALIASES.get(kind, {})
    renamed = {aliases.get(key, key): value for key, value in record.items() if key in aliases}
    return {**renamed, **{key: value for key, value in record.items() if key not in aliases}}


def canonical_name(name: str) -> str:
    """The current name of an MLflow metric name, old or new (an unknown name as it is)."""
    if declaration(name) is not None:
        return name
    if name in MLFLOW_ALIASES:
        return MLFLOW_ALIASES[name]
    for old, new in MLFLOW_ALIAS_PATTERNS:
        if (parts := parts_of(old, name)) is not None:
            return new.format(**parts)
    return name


def canonical_metrics(metrics: Mapping[str, float]) -> dict[str, float]:
    """MLflow metrics of a run, keyed by current names (a value under its current name wins)."""
    renamed = {canonical_name(key): value for key, value in metrics.items() if canonical_name(key) != key}
    return {**renamed, **{key: value for key, value in metrics.items() if canonical_name(key) == key}}


def old_names(name: str) -> tuple[str, ...]:
    """The names ``name`` was logged under in MLflow before the renames (to read old histories)."""
    found = [old for old, new in MLFLOW_ALIASES.items() if new == name]
    for old, new in MLFLOW_ALIAS_PATTERNS:
        if (parts := parts_of(new, name)) is not None and set(parts) == set(re.findall(r"\{(\w+)\}", old)):
            found.append(old.format(**parts))
    labelled = actor_label(name)
    if labelled is not None and labelled[0] == 0:
        found.append(labelled[1])  # actor 0's values had no prefix
    return tuple(found)
