"""The simulator against runs measured on this machine (docs/plan.md, issue 27's acceptance).

Runs the embedded default experiment in several configurations (``pipelinerl run``, tracking off),
several seeds each, then predicts each configuration with a profile calibrated on the *other*
configurations' runs only (``plan/validation.py``), and prints measured beside predicted as a markdown
table. About a minute a run on 2 cores.

This machine's speed drifts by more than the tolerances over the half hour the runs take, so the runs
go round by round (every configuration at seed 0, then every one at seed 1, ...): each configuration
meets the same mix of the machine's moods. With ``--engine-sweeps`` the engine alone (``pipelinerl
bench decode`` on the actor's core) is measured before the first round and after each one, and the
decode step is read from all those sweeps together (the median at each H), not from one moment.

    .venv/bin/python scripts/plan_validation.py /tmp/plan-validation [--steps 24] [--engine-sweeps]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pipelinerl.plan.calibrate import calibrate
from pipelinerl.plan.validation import CONTENTIONS, compare, markdown_table, with_contention

# Issue 27's set: pipeline at three values of H, conventional rounds of G=8 steps with and without
# training during the round, and async mode; the embedded default otherwise (B=32, 4 samples a prompt).
CONFIGURATIONS: dict[str, list[str]] = {
    "pipeline, H=32": ["run.mode=pipeline", "actor.max_in_flight=32"],
    "pipeline, H=16": ["run.mode=pipeline", "actor.max_in_flight=16"],
    "pipeline, H=64": ["run.mode=pipeline", "actor.max_in_flight=64"],
    "conventional, G=8": ["run.mode=conventional", "run.steps_per_round=8"],
    "conventional, G=8, strict": [
        "run.mode=conventional",
        "run.steps_per_round=8",
        "run.train_during_round=false",
    ],
    "async": ["run.mode=async", "actor.max_in_flight=32"],
}
# Each stage on a core of its own, as on a cluster each has its own GPUs: the actor on core 0, the
# trainer and the preprocessor on core 1 (bench/learning.py pins them the same way).
PINNED = ["actor.cpus=[0]", "trainer.cpus=[1]"]
PROMPT_TOKENS = 40  # the arithmetic task's prompts, in the character tokenizer's tokens (about)
# The values of H a sweep measures: those the configurations run, and points between for the table.
SWEEP_IN_FLIGHT = "4,8,16,24,32,40,48,56,64"


def run_once(directory: Path, steps: int, seed: int, settings: list[str]) -> Path:
    """One run of a configuration (kept: a run already there is not run again); its directory."""
    if not list(directory.glob("*/summary.json")):
        command = [sys.executable, "-m", "pipelinerl.cli", "run", "-s", f"run.output_dir={directory}"]
        for setting in [
            f"run.max_steps={steps}",
            f"run.seed={seed}",
            "tracking.enabled=false",
            *PINNED,
            *settings,
        ]:
            command += ["-s", setting]
        subprocess.run(command, check=True, capture_output=True, text=True)
    (run,) = [path.parent for path in directory.glob("*/summary.json")]
    return run


def sweep_once(path: Path) -> Path:
    """The engine alone on the actor's core over ``SWEEP_IN_FLIGHT`` (kept: a sweep already there is not
    measured again); its record."""
    if not path.exists():
        command = [sys.executable, "-m", "pipelinerl.cli", "bench", "decode", "--cpus", "0"]
        command += ["--in-flight", SWEEP_IN_FLIGHT, "--out", str(path)]
        subprocess.run(command, check=True, capture_output=True, text=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--steps", type=int, default=24, help="a multiple of 8: whole rounds")
    parser.add_argument("--seeds", default="0,1,2", help="runs of each configuration, one per seed")
    parser.add_argument(
        "--contention",
        choices=CONTENTIONS,
        default="simulate",
        help="how the stages' sharing of the machine enters the profiles (plan/validation.py)",
    )
    parser.add_argument("--no-contention", action="store_true", help="the same as --contention none")
    parser.add_argument(
        "--profile-out",
        type=Path,
        help="also write the profile calibrated on all the runs (the shipped cpu one)",
    )
    parser.add_argument(
        "--engine-record",
        type=Path,
        action="append",
        default=[],
        help="a `pipelinerl bench decode` record of the actor's engine on its core (repeatable)",
    )
    parser.add_argument(
        "--scale-table",
        action="store_true",
        help="scale the decode records (the engine alone) to what the other runs' actors wrote",
    )
    parser.add_argument(
        "--engine-sweeps",
        action="store_true",
        help="measure the engine alone before the first round of runs and after each one, and read the "
        "decode step from those sweeps (with any --engine-record)",
    )
    args = parser.parse_args()
    contention = "none" if args.no_contention else args.contention
    seeds = [int(seed) for seed in args.seeds.split(",")]
    engine_records: list[Path] = list(args.engine_record)
    args.directory.mkdir(parents=True, exist_ok=True)
    if args.engine_sweeps:
        print("engine sweep 0 ...", file=sys.stderr, flush=True)
        engine_records.append(sweep_once(args.directory / "decode-sweep0.json"))
    runs: dict[str, list[Path]] = {}
    for round_index, seed in enumerate(seeds, start=1):
        for index, (name, settings) in enumerate(CONFIGURATIONS.items()):
            print(f"{name}, seed {seed} ...", file=sys.stderr, flush=True)
            directory = args.directory / f"config{index}-seed{seed}"
            runs.setdefault(name, []).append(run_once(directory, args.steps, seed, settings))
        if args.engine_sweeps:
            print(f"engine sweep {round_index} ...", file=sys.stderr, flush=True)
            engine_records.append(sweep_once(args.directory / f"decode-sweep{round_index}.json"))
    comparisons = compare(
        runs,
        PROMPT_TOKENS,
        contention=contention,
        engine_records=engine_records,
        scale_table_to_runs=args.scale_table,
    )
    print(markdown_table(comparisons))
    within = sum(c.all_within for c in comparisons)
    print(f"\n{within} of {len(comparisons)} configurations within every tolerance")
    if args.profile_out is not None:
        every = [run for group in runs.values() for run in group]
        profile = calibrate(
            every, args.profile_out.stem, engine_records, scale_table_to_runs=args.scale_table
        )
        profile = with_contention(profile, every, PROMPT_TOKENS, contention)
        profile.description = (
            "this machine's kind (2 CPU cores, the embedded default: the tiny model, arithmetic; the actor "
            f"and the trainer on a core each), calibrated on the {len(every)} runs of "
            f"scripts/plan_validation.py --steps {args.steps} --seeds {args.seeds} (docs/plan.md)"
        )
        args.profile_out.write_text(profile.model_dump_json(indent=2) + "\n")
        print(f"profile written to {args.profile_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
