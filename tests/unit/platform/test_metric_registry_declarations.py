"""The metric registry: derivations against hand values, every alias resolving to a declared key, no
two declarations matching one name, and docs/metrics.md equal to the registry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.db import StepStats
from pipelinerl.platform.tracking.metric_docs import markdown_table
from pipelinerl.platform.tracking.metric_registry import PLACEHOLDERS, Metric
from pipelinerl.platform.tracking.mlflow_store import METRIC_NAME
from pipelinerl.tasks.base import LABELS

DOCS = Path(__file__).resolve().parents[3] / "docs" / "metrics.md"


def declared(name: str) -> Metric:
    metric = registry.declaration(name)
    assert metric is not None, f"{name!r} is not declared"
    return metric


def example(name: str, **parts: str) -> str:
    """A member of ``name``'s family: each placeholder filled with ``parts`` or its example."""
    return re.sub(r"\{(\w+)\}", lambda m: parts.get(m[1], PLACEHOLDERS[m[1]][1]), name)


# ----- derivations -----


def test_trainer_tokens_per_s_and_idle_fraction_by_hand():
    # 400 tokens, 1.5 s training, 0.5 s waiting, no broadcast: 400 / 2 s, 0.5 / 2 s waiting.
    assert registry.trainer_tokens_per_s(400, 1.5, 0.5, 0.0) == pytest.approx(200.0)
    assert registry.trainer_idle_fraction(1.5, 0.5, 0.0) == pytest.approx(0.25)
    # A 2 s broadcast is busy time: the cycle is 4 s, the trainer waited 0.5 s of it.
    assert registry.trainer_tokens_per_s(400, 1.5, 0.5, 2000.0) == pytest.approx(100.0)
    assert registry.trainer_idle_fraction(1.5, 0.5, 2000.0) == pytest.approx(0.125)
    assert registry.trainer_tokens_per_s(400, 0.0, 0.0, 0.0) is None, "no time, no rate"
    assert registry.trainer_idle_fraction(0.0, 0.0, 0.0) is None


def test_derive_reads_a_record_and_needs_its_inputs():
    record = {
        "trainer/tokens": 300,
        "trainer/step_s": 1.0,
        "trainer/wait_s": 0.25,
        "weights/broadcast_ms": 250,
    }
    assert registry.derive(registry.TRAINER_TOKENS_PER_S, record) == pytest.approx(200.0)
    assert registry.derive(registry.TRAINER_IDLE_FRACTION, record) == pytest.approx(0.166666666)
    without_broadcast = {k: v for k, v in record.items() if k != "weights/broadcast_ms"}
    assert registry.derive(registry.TRAINER_IDLE_FRACTION, without_broadcast) == pytest.approx(0.2)
    assert registry.derive(registry.TRAINER_TOKENS_PER_S, {"trainer/step_s": 1.0}) is None
    with pytest.raises(ValueError, match="not a derived statistic"):
        registry.derive(registry.LOSS, record)


def test_a_window_weighs_its_steps_by_their_seconds():
    steps = [
        {"trainer/tokens": 400, "trainer/step_s": 1.0, "trainer/wait_s": 1.0},
        {"trainer/tokens": 800, "trainer/step_s": 2.0, "trainer/wait_s": 0.0, "weights/broadcast_ms": 1000},
    ]
    # 1,200 tokens over 1 + 1 + 2 + 0 + 1 = 5 s, 1 s of it waiting (not the mean of 200 and 266.7).
    assert registry.derive_over(registry.TRAINER_TOKENS_PER_S, steps) == pytest.approx(240.0)
    assert registry.derive_over(registry.TRAINER_IDLE_FRACTION, steps) == pytest.approx(0.2)
    assert registry.derive_over(registry.TRAINER_TOKENS_PER_S, []) is None
    one = registry.derive_over(registry.TRAINER_TOKENS_PER_S, steps[1:])
    assert one == registry.derive(registry.TRAINER_TOKENS_PER_S, steps[1]), "a window of one step is the step"


def test_a_step_read_back_from_the_database_derives_what_was_logged():
    columns = {"tokens": 300, "step_s": 1.0, "wait_s": 0.25, "broadcast_ms": 250.0, "reward_mean": 0.5}
    record = registry.record_of_columns(columns)
    assert record[registry.TRAINER_TOKENS] == 300 and record[registry.WEIGHTS_BROADCAST_MS] == 250.0
    assert record[registry.REWARD_MEAN] == 0.5
    assert registry.derive(registry.TRAINER_TOKENS_PER_S, record) == pytest.approx(200.0)


# ----- declarations -----


def test_no_two_declarations_match_one_name():
    names = [metric.name for metric in registry.METRICS]
    assert len(names) == len(set(names)), "a name declared twice"
    for metric in registry.METRICS:
        for instance in {example(metric.name), example(metric.name, actor="0", k="1", label="no_answer")}:
            assert registry.declarations(instance) == [metric], instance


def test_every_score_label_and_drop_reason_is_one_declared_name():
    for label in LABELS:
        for family in (registry.SCORES, registry.EVAL_SET_SCORES):
            name = registry.name_of(family, set="heldout", label=label)
            assert [m.name for m in registry.declarations(name)] == [family]
    for reason in ("stale", "zero_variance", "incomplete_group"):
        assert registry.declaration(registry.name_of(registry.SAMPLES_DROPPED, reason=reason)) is not None
    with pytest.raises(ValueError, match="not a declared metric name"):
        registry.name_of(registry.SCORES, label="Not A Label")


def test_every_name_constant_of_the_registry_is_declared():
    templates = {registry.PER_ACTOR, registry.SUMMARY}
    constants = {
        value
        for key, value in vars(registry).items()
        if key.isupper() and isinstance(value, str) and value not in templates
    }
    assert len(constants) > 90
    names = {metric.name for metric in registry.METRICS}
    for name in constants:
        assert {name, registry.summary_name(name)} & names, f"{name!r} is a constant but not declared"
    for metric in registry.METRICS:
        assert metric.unit and metric.description, metric.name
        assert metric.records or metric.mlflow, f"{metric.name}: declared, but nowhere written"


def test_every_mlflow_name_is_one_mlflow_accepts():
    for metric in registry.METRICS:
        if metric.mlflow:
            assert METRIC_NAME.match(example(metric.name)), metric.name


def test_the_database_columns_are_declared_once_each():
    columns = {c.name for c in StepStats.__table__.columns} - {"run_id", "version", "created_at"}
    assert set(registry.stored_fields("step_stats")) == columns
    assert registry.column_of(registry.WEIGHTS_BROADCAST_MS) == "broadcast_ms"
    with pytest.raises(ValueError, match="not kept in the platform database"):
        registry.column_of(registry.ESS_TRUNCATED)


# ----- actors -----


@pytest.mark.parametrize("name", sorted(registry.PER_ACTOR_FAMILIES))
def test_an_actor_label_round_trips(name: str):
    assert declared(name).actors is not None, "the plain name is all actors, so it says how they combine"
    per_actor = registry.per_actor_name(name, 3)
    assert per_actor.startswith("actor/3/") and "actor/3/actor/" not in per_actor
    assert registry.actor_label(per_actor) == (3, name)
    assert registry.actor_label(name) is None, "the plain name is all actors, not one"


# ----- old names -----


def test_every_alias_resolves_to_a_declared_key_and_no_old_name_is_declared():
    for old, new in registry.RECORD_ALIASES["trainer"].items():
        assert "trainer" not in getattr(registry.declaration(old), "records", ()), f"{old} is written still"
        assert "trainer" in declared(new).records
    for old, new in registry.MLFLOW_ALIASES.items():
        assert registry.declaration(old) is None and declared(new).mlflow
        assert registry.canonical_name(old) == new and old in registry.old_names(new)
    for old_family, new_family in registry.MLFLOW_ALIAS_PATTERNS:
        old, new = example(old_family), example(new_family)
        assert registry.declaration(old) is None, old
        assert registry.canonical_name(old) == new and declared(new).mlflow
        assert old in registry.old_names(new)


def test_names_of_a_run_written_before_the_renames_are_read_under_the_new_ones():
    old_record = {
        "policy_version": 3,
        "samples": 16,
        "tokens": 700,
        "completion_len_max": 90,
        "trainer/tokens": 1,
    }
    assert registry.canonical_record(old_record, "trainer") == {
        "policy_version": 3,
        "trainer/samples": 16,
        "trainer/tokens": 1,  # the new name wins over its alias
        "completion/len_max": 90,
    }
    eval_record = {"samples": 4, "set": "heldout"}
    assert registry.canonical_record(eval_record, "eval") == eval_record, "the eval round's samples stay"
    old_mlflow = {
        "throughput/actor_tokens_per_s": 300.0,
        "actor1:throughput/actor_tokens_per_s": 500.0,
        "actor1:actor/idle_fraction": 0.5,
        "completion_len_p90": 40.0,
        "eval/heldout/correct": 3.0,
        "eval/heldout/mean_reward": 0.4,
    }
    assert registry.canonical_metrics(old_mlflow) == {
        "throughput/actor_tokens_per_s": 300.0,
        "actor/1/throughput/actor_tokens_per_s": 500.0,
        "actor/1/idle_fraction": 0.5,
        "completion/len_p90": 40.0,
        "eval/heldout/scores/correct": 3.0,
        "eval/heldout/mean_reward": 0.4,
    }
    assert registry.old_names("actor/0/idle_fraction") == (
        "actor0:actor/idle_fraction",
        "actor/idle_fraction",
    )
    assert registry.canonical_name("something/else") == "something/else"


def test_docs_metrics_md_is_the_registry():
    rendered = markdown_table()
    assert rendered in DOCS.read_text(), (
        "docs/metrics.md is behind the registry; paste in the output of: .venv/bin/python -c "
        '"from pipelinerl.platform.tracking.metric_docs import markdown_table; print(markdown_table())"'
    )
