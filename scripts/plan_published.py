"""The simulator against published scale results, and its sensitivity in the paper's setting
(docs/plan.md, issue 27). Prints markdown tables and writes docs/benchmarks/plan_sensitivity.png.

    .venv/bin/python scripts/plan_published.py [--steps 128] [--figure docs/benchmarks/plan_sensitivity.png]

Every prediction runs on a shipped profile (pipelinerl/plan/profiles, built by scripts/gpu_profiles.py
from published component costs), never on the result it is compared with.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from pipelinerl.plan import paper  # noqa: E402
from pipelinerl.plan.cluster import Cluster  # noqa: E402
from pipelinerl.plan.lengths import LogLogisticLengths  # noqa: E402
from pipelinerl.plan.predict import predict  # noqa: E402
from pipelinerl.plan.profile import CostProfile, resolve_profile  # noqa: E402
from pipelinerl.plan.simulate import SimulatedRun  # noqa: E402
from pipelinerl.platform.config import PipelineConfig, load_config  # noqa: E402

PAPER_SETTINGS = paper.SETTINGS
PAPER_CLUSTER = paper.CLUSTER
PAPER_LENGTHS = paper.LENGTHS
PROMPT_TOKENS = paper.PROMPT_TOKENS


@dataclass
class Case:
    name: str
    published: str
    settings: list[str]
    profile: str
    cluster: Cluster
    modes: tuple[str, str]  # (the faster one published, its baseline)
    lengths: tuple[float, float] = PAPER_LENGTHS
    # Profile figures the published case gives itself, per mode (its own measured costs).
    figures: dict[str, dict[str, float]] = field(default_factory=dict)


CASES = [
    Case(
        "PipelineRL paper: 128 H100, 7B, PipelineRL vs conventional G=32",
        "~2x samples/s (arXiv 2509.19128, Fig. 5c; the baseline extrapolated from a 4-node run)",
        PAPER_SETTINGS,
        "h100-7b",
        PAPER_CLUSTER,
        ("pipeline", "colocated"),
    ),
    Case(
        "verl fully_async_policy, 32 GPUs (H20; the H100 7B profile): Qwen2.5-Math-7B, DAPO, 28K tokens, "
        "512 prompts x 16 a generation, 16 optimizer steps of 32 prompts on it; async 16:16 vs colocated",
        "2.68x per step (790.10 s -> 294.77 s; volcengine/verl recipe/fully_async_policy/README.md)",
        [
            "rl.batch_size=512",
            "rl.group_size=16",
            "actor.max_in_flight=256",
            "actor.max_new_tokens=28672",
            "run.steps_per_round=16",
            "transport.queue_size=2048",
            "trainer.zero_stage=3",  # verl's FSDP shards everything, as ZeRO-3 does
        ],  # fmt: skip
        "h100-7b",
        Cluster(16, 16, "H100"),
        ("pipeline", "colocated"),
        lengths=(3000.0, 9000.0),  # DAPO on math: responses of a few thousand tokens, a tail to the 28K cut
    ),
    Case(
        "NeMo-RL in-flight updates: Llama-8B (the 7B profile), 4K tokens; async on 4 train + 1 generation "
        "node against sync on 4",
        "2.56x tokens/s per GPU (NVIDIA-NeMo/RL PR #1381: 478 vs 187; step 60 s -> 21 s)",
        [
            "rl.batch_size=2048",
            "rl.group_size=16",
            "actor.max_in_flight=256",
            "actor.max_new_tokens=4096",
            "run.steps_per_round=1",
            "transport.queue_size=2048",
            "trainer.zero_stage=3",  # NeMo-RL's DTensor (FSDP2) policy shards everything, as ZeRO-3 does
        ],  # fmt: skip
        "h100-7b",
        Cluster(8, 32, "H100"),
        ("pipeline", "colocated"),
        lengths=(800.0, 2000.0),  # NeMo-RL's Llama3.1-8B 4K runs: ~1,060-1,129 mean (performance-summary.md)
    ),
    Case(
        "marin #8936: Qwen3-0.6B (the 0.5B profile) on H100, an unconditional 5 s wait before each pause; "
        "async against sync, each mode with its own published update costs",
        "async 0.88x: 68 s slower over 20 updates of a 493 s run (marin-community/marin #8936, #8955)",
        [
            "rl.batch_size=64",
            "rl.group_size=8",
            "actor.max_in_flight=64",
            "actor.max_new_tokens=1024",
            "run.steps_per_round=1",
            "transport.queue_size=64",
            "run.async_drain_lag=1",
        ],  # fmt: skip
        "h100-0.5b",
        Cluster(1, 1, "H100"),
        ("async", "colocated"),
        lengths=(150.0, 300.0),
        # Over 20 updates (#8936): weight sync 147.40 s async (100.55 s of it the pause) and 48.79 s sync;
        # the 493 s of core time less 35.87 s of generation and the sync: ~20.4 s of training a step.
        figures={
            "async": {"transfer_s": 147.40 / 20, "update_pause_s": 100.55 / 20, "train_base_s": 20.4},
            "colocated": {"transfer_s": 48.79 / 20, "train_base_s": 20.4},
        },
    ),
]


def profile_with(base: str | CostProfile, figures: dict[str, float]) -> CostProfile:
    profile = resolve_profile(base) if isinstance(base, str) else base.model_copy(deep=True)
    if "transfer_s" in figures:  # the case's own transfer, not the link's for the config's buckets
        profile.transfer = None
    for figure, value in figures.items():
        profile.figures[figure] = profile.figures[figure].model_copy(
            update={"value": value, "source": "the published case's own figure"}
        )
    return profile


def run_case(
    settings: list[str], profile: CostProfile, cluster: Cluster, modes: tuple[str, ...], steps: int,
    lengths: tuple[float, float], extra: list[str] | None = None,
    figures: dict[str, dict[str, float]] | None = None,
) -> dict[str, SimulatedRun]:  # fmt: skip
    """Each mode predicted on ``profile``, with the mode's own ``figures`` where the case gives them."""
    config: PipelineConfig = load_config(None, [*settings, f"run.max_steps={steps}", *(extra or [])])
    drawn = LogLogisticLengths.from_median_p90(*lengths, config.actor.max_new_tokens)
    runs: dict[str, SimulatedRun] = {}
    for mode in modes:
        own = profile_with(profile, (figures or {}).get(mode, {}))
        runs |= predict(config, own, drawn, [mode], PROMPT_TOKENS, cluster)
    return runs


def ratio(runs: dict[str, SimulatedRun], modes: tuple[str, str]) -> float:
    return runs[modes[0]].samples_per_s / runs[modes[1]].samples_per_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument("--figure", type=Path, default=Path("docs/benchmarks/plan_sensitivity.png"))
    args = parser.parse_args()
    steps = args.steps

    print("| published case | published | predicted |")
    print("|---|---|---|")
    for case in CASES:
        print(f"  {case.name} ...", file=sys.stderr, flush=True)
        runs = run_case(
            case.settings,
            resolve_profile(case.profile),
            case.cluster,
            case.modes,
            steps,
            case.lengths,
            figures=case.figures,
        )
        fast, base = case.modes
        print(
            f"| {case.name} | {case.published} | {fast} / {base}: {ratio(runs, case.modes):.2f}x samples/s "
            f"({runs[fast].samples_per_s:,.1f} vs {runs[base].samples_per_s:,.1f}; trainer idle "
            f"{runs[fast].trainer_idle:.2f} / {runs[base].trainer_idle:.2f}) |"
        )

    paper = resolve_profile("h100-7b")
    modes = ("pipeline", "colocated")
    median, p90 = PAPER_LENGTHS
    figure = Figure(figsize=(11, 8), layout="constrained")
    (tail, split), (pause, lag) = figure.subplots(2, 2)

    print("\n| max / median length | pipeline / colocated G=32 |\n|---|---|")
    cuts = [1500, 2000, 4000, 8192, 16384]
    speedups = []
    for cut in cuts:
        runs = run_case(PAPER_SETTINGS, paper, PAPER_CLUSTER, modes, steps, (median, p90), [
            f"actor.max_new_tokens={cut}"])  # fmt: skip
        speedups.append(ratio(runs, modes))
        print(f"| {cut / median:.1f} | {speedups[-1]:.2f}x |")
    tail.plot([cut / median for cut in cuts], speedups, "o-")
    tail.set(xscale="log", xlabel="length tail: max / median", ylabel="pipeline / colocated G=32 (samples/s)")
    tail.set_xticks([cut / median for cut in cuts], [f"{cut / median:.1f}" for cut in cuts])
    tail.minorticks_off()

    print(
        "\n| actor GPUs of 128 | pipeline samples/s | colocated G=32 | speed-up | trainer idle |\n"
        "|---|---|---|---|---|"
    )
    splits = list(range(16, 113, 16))
    speeds, idles, base_speed = [], [], 0.0
    for actor_gpus in splits:
        runs = run_case(
            PAPER_SETTINGS, paper, PAPER_CLUSTER.with_actor_gpus(actor_gpus), modes, steps, PAPER_LENGTHS
        )
        speeds.append(runs["pipeline"].samples_per_s)
        idles.append(runs["pipeline"].trainer_idle)
        base_speed = runs["colocated"].samples_per_s
        print(
            f"| {actor_gpus} | {speeds[-1]:,.1f} | {base_speed:,.1f} | {speeds[-1] / base_speed:.2f}x "
            f"| {idles[-1]:.2f} |"
        )
    split.plot(splits, [speed / base_speed for speed in speeds], "o-", label="pipeline / colocated")
    split.plot(splits, idles, "s--", label="pipeline: trainer idle")
    split.axvline(48, color="grey", linestyle=":", label="the paper's 48")
    split.set(xlabel="actor GPUs (of 128; the rest train)", ylabel="ratio / share")
    split.legend(fontsize="small")

    print("\n| update pause (s) | pipeline / colocated G=32 | actors paused |\n|---|---|---|")
    pauses = [0.05, 0.55, 2.0, 5.0, 10.0]
    speedups = []
    for seconds in pauses:
        runs = run_case(PAPER_SETTINGS, profile_with("h100-7b", {"update_pause_s": seconds}), PAPER_CLUSTER,
                        modes, steps, PAPER_LENGTHS)  # fmt: skip
        speedups.append(ratio(runs, modes))
        print(f"| {seconds:g} | {speedups[-1]:.2f}x | {runs['pipeline'].actor_paused:.3f} |")
    pause.plot(pauses, speedups, "o-")
    pause.set(xlabel="update pause (s)", ylabel="pipeline / colocated G=32 (samples/s)")

    print("\n| H | lag mean | lag p90 | lag max | samples/s |\n|---|---|---|---|---|")
    sizes = [16, 32, 64, 128, 256]
    means, p90s, maxima = [], [], []
    for size in sizes:
        runs = run_case(PAPER_SETTINGS, paper, PAPER_CLUSTER, ("pipeline",), steps, PAPER_LENGTHS, [
            f"actor.max_in_flight={size}"])  # fmt: skip
        run = runs["pipeline"]
        means.append(run.lag_mean)
        p90s.append(run.lag_p90)
        maxima.append(run.lag_max)
        print(f"| {size} | {run.lag_mean:.2f} | {run.lag_p90} | {run.lag_max} | {run.samples_per_s:,.1f} |")
    lag.plot(sizes, means, "o-", label="mean")
    lag.plot(sizes, p90s, "s--", label="p90")
    lag.plot(sizes, maxima, "^:", label="max")
    lag.set(xscale="log", xlabel="H (sequences in flight per engine)", ylabel="token lag (versions)")
    lag.set_xticks(sizes, [str(size) for size in sizes])
    lag.minorticks_off()
    lag.legend(fontsize="small")
    figure.suptitle(
        f"Predicted, the paper's setting (h100-7b profile, 128 H100, {steps} steps)", fontsize="medium"
    )
    args.figure.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.figure, dpi=110)
    print(f"\nfigure written to {args.figure}", file=sys.stderr)


if __name__ == "__main__":
    main()
