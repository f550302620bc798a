"""``pipelinerl bench plan``: how long the run simulator takes on the paper's scale (issue 27's target:
a 128-GPU, 1,000-step simulation in under 10 s on the 2-core machine).

The cases are the PipelineRL paper's setting (Qwen2.5-7B on H100, the shipped ``h100-7b`` profile,
B=1,024, 8 samples a prompt, H=64, up to 8,192 new tokens, G=32 for the conventional mode) on 48 actor
GPUs (the paper's split of 128) and on 128 actor GPUs, in pipeline and conventional mode. Each is timed
in CPU seconds of ``simulate()`` alone (``time.process_time``: the workload built and the lengths
object made beforehand; the draws are part of the simulation), so a busy machine slows the wall clock,
not the figure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

from pipelinerl.bench.report import format_value, markdown_table
from pipelinerl.plan import paper
from pipelinerl.plan.cluster import Cluster, engines_on, scaled_costs
from pipelinerl.plan.from_config import workload_from_config
from pipelinerl.plan.lengths import LogLogisticLengths
from pipelinerl.plan.profile import resolve_profile
from pipelinerl.plan.simulate import simulate
from pipelinerl.platform.config import load_config

CASES = (("48 actor GPUs", paper.CLUSTER), ("128 actor GPUs", Cluster(128, 128, "H100")))
MODES = ("pipeline", "conventional")


@dataclass(frozen=True)
class PlanSpeedSettings:
    steps: int = 1000
    repeats: int = 1
    profile: str = paper.PROFILE

    @classmethod
    def quick(cls) -> PlanSpeedSettings:
        return cls(steps=20)


def run_plan_speed_bench(settings: PlanSpeedSettings, progress: Any) -> dict[str, Any]:
    """Every case in every mode, ``repeats`` times: the fastest CPU time of each."""
    profile = resolve_profile(settings.profile)
    assert profile.hardware is not None
    config = load_config(None, [*paper.SETTINGS, f"run.max_steps={settings.steps}"])
    lengths = LogLogisticLengths.from_median_p90(*paper.LENGTHS, config.actor.max_new_tokens)
    rows: list[dict[str, Any]] = []
    task = progress.add_task("simulating", total=len(CASES) * len(MODES) * settings.repeats)
    for name, cluster in CASES:
        costs = scaled_costs(profile.cost_model(), profile.hardware, cluster)
        engines = engines_on(profile.hardware, cluster)
        for mode in MODES:
            workload = replace(
                workload_from_config(config, lengths, paper.PROMPT_TOKENS, mode), engines=engines
            )
            times, samples = [], 0
            for _ in range(settings.repeats):
                started = time.process_time()
                run = simulate(workload, costs, seed=0)
                times.append(time.process_time() - started)
                samples = run.samples
                progress.advance(task)
            rows.append(
                {"case": name, "mode": mode, "engines": engines, "cpu_s": min(times), "samples": samples}
            )
    slowest_128 = max(row["cpu_s"] for row in rows if row["case"] == "128 actor GPUs")
    return {
        "headline": {"cpu_s_128_gpus": slowest_128, "steps": settings.steps},
        "details": {"rows": rows},
        "notes": [
            "CPU seconds of simulate() alone, the fastest of the repeats; the h100-7b profile, lengths "
            "loglogistic:1000,3000 cut at 8,192, prompts of 200 tokens",
        ],
    }


def render_plan_speed_table(record: dict[str, Any]) -> str:
    rows = [
        [row["case"], row["mode"], str(row["engines"]), format_value(row["cpu_s"]), f"{row['samples']:,}"]
        for row in record["rows"]
    ]
    table = markdown_table(["case", "mode", "engines", "CPU s", "samples simulated"], rows)
    return f"simulator speed, {record['steps']} steps\n\n{table}"
