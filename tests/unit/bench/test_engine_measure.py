"""``run_continuous`` with in-flight updates on the real transformers engine: when they land."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from pipelinerl.bench.engine_factories import ENGINES
from pipelinerl.bench.engine_measure import GenerationStats, WeightUpdates, run_continuous
from pipelinerl.bench.engine_workload import EngineBenchSettings, build_workload


def test_the_first_update_lands_once_sequences_are_in_flight_however_long_the_interval(
    random_model_dir: Path,
) -> None:
    """An interval far longer than the run still gives one update, applied while the workload was
    being generated (the engine's version moved, every sequence finished): a fast engine cannot
    finish a run with updates before the first one, which would measure nothing."""
    settings = EngineBenchSettings.quick(update_interval_s=3600.0)
    workload = build_workload(AutoTokenizer.from_pretrained(random_model_dir), settings)
    engine, sender = ENGINES["transformers"](random_model_dir, workload, settings)
    try:
        updates = WeightUpdates(AutoModelForCausalLM.from_pretrained(random_model_dir), seed=0)
        stats: GenerationStats = run_continuous(
            engine,
            workload,
            settings.in_flight,
            updates=updates,
            sender=sender,
            update_interval_s=settings.update_interval_s,
        )
        assert len(stats.pauses_ms) == len(stats.stalls_ms) == 1
        assert engine.policy_version == 1  # type: ignore[attr-defined]
        assert stats.sequences == workload.num_sequences
        assert 0 < stats.stalls_ms[0] <= stats.pauses_ms[0]
    finally:
        engine.close()
