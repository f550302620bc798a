"""The engine benchmark's record and table (``bench/engine_record.py``) from hand-made runs.

Runs are built with known tokens and wall times, so every ratio has a value worked out by hand;
no engine runs here.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipelinerl.bench.engine import EngineBenchRuns, EngineRuns
from pipelinerl.bench.engine_measure import GenerationStats
from pipelinerl.bench.engine_record import (
    paired_ratio,
    render_engine_table,
    summarize,
)
from pipelinerl.bench.engine_workload import EngineBenchSettings, Workload
from pipelinerl.bench.report import json_safe


def run(tokens_per_s: float, *, stalls_ms: tuple[float, ...] = (), phases: bool = False) -> GenerationStats:
    """10 s of generation at ``tokens_per_s`` (with updates stalling ``stalls_ms``; ``phases``: as
    vLLM reports them, a 10 ms wait for the step in progress and the stall receiving and loading)."""
    wall_s = 10.0
    tokens = int(tokens_per_s * wall_s)
    return GenerationStats(
        sequences=8,
        useful_tokens=tokens,
        raw_tokens=tokens,
        finished=8,
        wall_s=wall_s,
        cpu_s=wall_s,
        pauses_ms=[stall + 10 for stall in stalls_ms],
        stalls_ms=list(stalls_ms),
        phases_ms=[
            {"pause": 10.0, "load": stall, "label_resume": 0.0, "load_in_worker": stall - 1}
            for stall in stalls_ms
            if phases
        ],
    )


def bench_runs(*, engines: tuple[str, ...] = ("transformers", "vllm")) -> EngineBenchRuns:
    """Two repeats. transformers: 1,000 then 500 tokens/s (the load doubled in the second);
    vllm: 1,500 then 750, so 1.5x its neighbour both times; static: 800 then 400."""
    settings = EngineBenchSettings(engines=engines, repeats=2)
    workload = Workload(
        prompts=[[1, 2]] * 8, group_size=4, max_new_tokens=8, max_prompt_tokens=2, eos_token_id=0,
        pad_token_id=0, temperature=1.0,
    )  # fmt: skip
    transformers = EngineRuns(
        "transformers",
        continuous=[run(1000), run(500)],
        with_updates={"keep": [run(1000, stalls_ms=(1.0, 3.0)), run(500, stalls_ms=(2.0,))]},
    )
    vllm = EngineRuns(
        "vllm",
        version="0.32.0",
        continuous=[run(1500), run(750)],
        with_updates={
            "keep": [
                run(1350, stalls_ms=(80.0, 100.0), phases=True),
                run(675, stalls_ms=(90.0,), phases=True),
            ],
            "recompute": [
                run(1215, stalls_ms=(120.0,), phases=True),
                run(540, stalls_ms=(110.0,), phases=True),
            ],
        },
    )
    by_name = {"transformers": transformers, "vllm": vllm}
    return EngineBenchRuns(
        settings=settings,
        workload=workload,
        model_path=Path("/models/tiny"),
        parameters_per_update=1000,
        bytes_per_update=4000,
        static=[run(800), run(400)],
        engines=[by_name[name] for name in engines],
    )


def test_paired_ratio_is_the_median_of_neighbouring_ratios() -> None:
    numerators = [run(300), run(100), run(900)]
    denominators = [run(100), run(100), run(450)]
    assert paired_ratio(numerators, denominators, "useful_tokens_per_s") == pytest.approx(2.0)
    assert math.isnan(paired_ratio([run(1)], [run(0)], "useful_tokens_per_s")), "no rate, no ratio"


def test_the_top_level_holds_the_reference_engine_as_records_of_one_engine_did() -> None:
    result = summarize(bench_runs())
    headline, details = result["headline"], result["details"]
    reference = details["engines"]["transformers"]
    assert headline["continuous_tokens_per_s"] == pytest.approx(750)  # median of 1,000 and 500
    assert headline["continuous_over_static_ratio"] == pytest.approx(1.25)
    assert headline["static_useful_tokens_per_s"] == pytest.approx(600)
    for key in ("continuous_over_static_ratio", "update_pause_fraction", "continuous_sequences_per_s"):
        assert headline[key] == reference[key]
    assert details["continuous_runs"] == reference["continuous_runs"]
    assert details["updates"] == reference["updates"]
    assert result["targets"] == reference["targets"]
    assert result["targets"]["continuous_over_static_ratio"]["met"] is False  # 1.25 < 1.5
    # stalls 1 + 3 + 2 ms over 20 s of runs with updates
    assert headline["update_pause_fraction"] == pytest.approx(6e-3 / 20)
    assert result["targets"]["update_pause_fraction"]["met"] is True


def test_later_engines_are_compared_with_the_first_on_neighbouring_runs() -> None:
    engines = summarize(bench_runs())["details"]["engines"]
    assert "compared_with" not in engines["transformers"]
    assert engines["vllm"]["version"] == "0.32.0"
    compared = engines["vllm"]["compared_with"]
    assert compared["engine"] == "transformers"
    # 1.5x in each repeat although the load halved both rates in the second
    assert compared["continuous_tokens_per_s_ratio"] == pytest.approx(1.5)
    assert compared["tokens_per_s_with_updates_ratio"] == pytest.approx(1.35)
    assert engines["vllm"]["tokens_per_s_with_updates_over_without"] == pytest.approx(0.9)
    assert engines["vllm"]["update_stall_ms_median"] == pytest.approx(90)
    phases = {"pause": 10.0, "load": 90.0, "label_resume": 0.0, "load_in_worker": 89.0}
    assert engines["vllm"]["updates"]["phases_ms_median"] == phases
    assert engines["transformers"]["updates"]["phases_ms_median"] is None
    assert engines["transformers"]["updates"]["count"] == 3


def test_recomputing_the_kv_cache_is_reported_beside_keeping_it() -> None:
    engines = summarize(bench_runs())["details"]["engines"]
    assert "kv_cache_recompute" not in engines["transformers"]
    recompute = engines["vllm"]["kv_cache_recompute"]
    assert recompute["tokens_per_s_over_keep"] == pytest.approx((0.9 + 0.8) / 2)  # 1215/1350, 540/675
    assert recompute["update_stall_ms_median"] == pytest.approx(115)
    assert recompute["updates"]["count"] == 2
    assert len(recompute["update_runs"]) == 2


def test_no_update_in_the_runs_is_no_value_not_a_met_target() -> None:
    runs = bench_runs(engines=("transformers",))
    runs.engines[0].with_updates["keep"] = [run(1000), run(500)]
    result = summarize(runs)
    assert math.isnan(result["headline"]["update_pause_fraction"])
    assert result["targets"]["update_pause_fraction"]["met"] is None


def test_the_table_shows_the_engines_side_by_side() -> None:
    result = summarize(bench_runs())
    record = json_safe(
        {
            **result["headline"],
            **result["details"],
            "settings": {"in_flight": 32},
            "targets": result["targets"],
        }
    )
    lines = render_engine_table(record).splitlines()
    assert lines[0] == "| measure | transformers | vllm | target |"
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert rows["continuous batching, H = 32 (tokens/s)"][:2] == ["750", "1,125"]
    assert rows["continuous / static (useful tokens/s)"] == ["1.25 (not met)", "1.88 (met)", "≥ 1.5 |"]
    assert rows["static `generate`, batch 32: useful tokens/s"][:2] == ["600", "600"], "one baseline"
    assert rows["KV cache recomputed: tokens/s with updates / kept-cache updates"][:2] == ["—", "0.85"]
    assert rows["of the receive + reload: inside the worker (ms)"][:2] == ["—", "89"]


def test_rows_no_engine_has_are_left_out() -> None:
    result = summarize(bench_runs(engines=("transformers",)))
    record = json_safe({**result["headline"], **result["details"], "settings": {"in_flight": 32}})
    table = render_engine_table(record)
    assert table.splitlines()[0] == "| measure | transformers | target |"
    assert "KV cache recomputed" not in table and "update phases" not in table
    assert "over the transformers engine's" not in table
