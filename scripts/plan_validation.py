"""The simulator against runs measured on this machine (docs/plan.md, issue 27's acceptance).

Runs the embedded default experiment in several configurations (``pipelinerl run``, tracking off),
then predicts each one with a profile calibrated on the *other* runs only (and their completion
lengths), and prints measured beside predicted as a markdown table. A few minutes on 2 cores.

    .venv/bin/python scripts/plan_validation.py /tmp/plan-validation [--steps 20]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pipelinerl.plan.calibrate import calibrate, completion_lengths
from pipelinerl.plan.contention import fit_alone_speedups
from pipelinerl.plan.from_config import workload_from_config
from pipelinerl.plan.measured import measured
from pipelinerl.plan.simulate import simulate
from pipelinerl.platform.config import load_config

CONFIGURATIONS: dict[str, list[str]] = {
    "pipeline, H=32": ["run.mode=pipeline", "actor.max_in_flight=32"],
    "pipeline, H=16": ["run.mode=pipeline", "actor.max_in_flight=16"],
    "pipeline, H=64, B=64": ["run.mode=pipeline", "actor.max_in_flight=64", "rl.batch_size=64"],
    "conventional, G=4": ["run.mode=conventional", "run.steps_per_round=4"],
    "conventional, G=4, strict": [
        "run.mode=conventional",
        "run.steps_per_round=4",
        "run.train_during_round=false",
    ],
}
PROMPT_TOKENS = 40  # the arithmetic task's prompts, in the character tokenizer's tokens (about)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument(
        "--no-contention", action="store_true", help="leave the stages' sharing of cores out of the profiles"
    )
    parser.add_argument(
        "--profile-out",
        type=Path,
        help="also write the profile calibrated on all the runs (the shipped cpu one)",
    )
    args = parser.parse_args()
    runs: dict[str, Path] = {}
    for index, (name, settings) in enumerate(CONFIGURATIONS.items()):
        output = args.directory / f"config{index}"
        if not list(output.glob("*/summary.json")):
            print(f"running {name} ...", file=sys.stderr, flush=True)
            command = [sys.executable, "-m", "pipelinerl.cli", "run", "-s", f"run.output_dir={output}"]
            for setting in [f"run.max_steps={args.steps}", "tracking.enabled=false", *settings]:
                command += ["-s", setting]
            subprocess.run(command, check=True, capture_output=True, text=True)
        (runs[name],) = [path.parent for path in output.glob("*/summary.json")]
    print(
        "| configuration | samples/s measured / predicted | trainer idle | actor idle | lag mean | lag max "
        "| alone speed-ups (actor, trainer) |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, run_dir in runs.items():
        others = [other for key, other in runs.items() if key != name]
        profile = calibrate(others, "others")
        if not args.no_contention:
            profile, _ = fit_alone_speedups(profile, others, PROMPT_TOKENS)
        costs = profile.cost_model()
        config = load_config(None, [f"run.max_steps={args.steps}", *CONFIGURATIONS[name]])
        workload = workload_from_config(config, completion_lengths(others), PROMPT_TOKENS)
        predicted = simulate(workload, costs)
        seen = measured(run_dir)
        speed = seen["steady_samples_per_s"]
        error = predicted.steady_samples_per_s / speed - 1
        print(
            f"| {name} | {speed:.1f} / {predicted.steady_samples_per_s:.1f} ({error:+.0%}) "
            f"| {seen['trainer_idle']:.2f} / {predicted.steady_trainer_idle:.2f} "
            f"| {seen['actor_idle']:.2f} / {predicted.actor_idle:.2f} "
            f"| {seen['lag_mean']:.2f} / {predicted.lag_mean:.2f} | {seen['lag_max']} / {predicted.lag_max} "
            f"| {costs.actor_alone_speedup:.2f}, {costs.trainer_alone_speedup:.2f} |"
        )
    if args.profile_out is not None:
        profile = calibrate(list(runs.values()), args.profile_out.stem)
        if not args.no_contention:
            profile, _ = fit_alone_speedups(profile, list(runs.values()), PROMPT_TOKENS)
        profile.description = (
            "this machine's kind (2 CPU cores, the embedded default: the tiny model, arithmetic), calibrated "
            f"on the {len(runs)} runs of scripts/plan_validation.py --steps {args.steps} (docs/plan.md)"
        )
        args.profile_out.write_text(profile.model_dump_json(indent=2) + "\n")
        print(f"profile written to {args.profile_out}", file=sys.stderr)


if __name__ == "__main__":
    main()
