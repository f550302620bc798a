"""The ``pipelinerl bench`` commands that measure whole runs: ``learning`` (PipelineRL against the
baselines), ``recipes``, ``faults``, ``restart`` and ``figures`` (the paper's figures from finished runs).

Plain functions with typer's annotations; ``bench/cli.py`` registers them on ``bench_app`` beside the
component benchmarks. Heavy libraries load inside the commands, so ``--help`` answers at once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from pipelinerl.bench.cli_support import (
    ConfigOption,
    EvalEveryOption,
    EvalProblemsOption,
    OutOption,
    QuickOption,
    SeedsOption,
    SetOption,
    StepsOption,
    TargetGainOption,
    console,
    fail,
    finish,
    parse_seeds,
)

# The configs shipped beside the package (a source checkout), one per task: configs/<task>.toml.
CONFIGS_DIR = Path(__file__).resolve().parents[2] / "configs"
TASK_CONFIGS = {"arithmetic": "pipeline.toml", "math": "math.toml", "reasoning_gym": "reasoning_gym.toml"}


def shipped_task_config(task: str) -> Path:
    """The shipped config of ``task`` (``--task``); a clear error for an unknown task or a missing file."""
    if task not in TASK_CONFIGS:
        raise fail(f"--task {task!r} has no shipped config; valid: {', '.join(TASK_CONFIGS)} (or --config)")
    path = CONFIGS_DIR / TASK_CONFIGS[task]
    if not path.is_file():
        raise fail(f"--task {task!r}: {path} is not there (a source checkout ships configs/); use --config")
    return path


def learning(
    config_path: ConfigOption = None,
    set_: SetOption = None,
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            help="A shipped task's config as the base, instead of --config: arithmetic, math or "
            "reasoning_gym (configs/<task>.toml).",
        ),
    ] = None,
    gs: Annotated[
        str, typer.Option("--gs", help="Conventional baselines' G values, comma-separated.")
    ] = "1,4,8",
    no_async: Annotated[bool, typer.Option("--no-async", help="Leave out the async ablation.")] = False,
    no_strict: Annotated[
        bool,
        typer.Option(
            "--no-strict",
            help="Leave out the largest G with strict rounds (run.train_during_round=false: generation, "
            "then training, the paper's baseline).",
        ),
    ] = False,
    seeds: SeedsOption = "0",
    steps: StepsOption = 100,
    eval_every: EvalEveryOption = 10,
    eval_problems: EvalProblemsOption = 200,
    target_gain: TargetGainOption = 0.10,
    no_pin: Annotated[
        bool, typer.Option("--no-pin", help="Do not give actor and trainer their own cores.")
    ] = False,
    quick: QuickOption = False,
    out: OutOption = None,
    from_record: Annotated[
        Path | None,
        typer.Option(
            "--from-record",
            help="Run nothing: summarise the runs of this learning.json again (e.g. with another "
            "--target-gain) from their measured success curves.",
        ),
    ] = None,
) -> None:
    """PipelineRL against conventional RL (G = 1, 4, 8) and async: time to a held-out success target."""
    if from_record is not None:
        _learning_from_record(from_record, target_gain, out)
        return
    from pipelinerl.bench.learning import run_learning_bench, variants
    from pipelinerl.bench.report import default_path, load_average, target_check
    from pipelinerl.platform.config import ConfigError, load_config, with_overrides
    from pipelinerl.platform.tracking.ratios import times_faster_key

    try:
        g_values = [int(part) for part in gs.split(",") if part.strip()]
        seed_values = [int(part) for part in seeds.split(",") if part.strip()]
    except ValueError:
        raise fail(f"--gs {gs!r} and --seeds {seeds!r} must be comma-separated integers") from None
    if not seed_values or any(g < 1 for g in g_values) or any(s < 0 for s in seed_values):
        raise fail(f"--gs needs values >= 1 and --seeds values >= 0 (got {gs!r}, {seeds!r})")
    if quick:
        steps, eval_every, eval_problems, g_values = 4, 2, 16, [2]
    if task is not None:
        if config_path is not None:
            raise fail("give --task or --config, not both")
        config_path = shipped_task_config(task)
    try:
        base = load_config(config_path, list(set_ or []))
        base = with_overrides(base, {"run.max_steps": steps, "task.eval_problems": eval_problems})
    except ConfigError as error:
        raise fail(str(error)) from None
    load_before, started_at = load_average(), datetime.now(UTC)
    chosen = variants(g_values, with_async=not no_async, strict=not no_strict)
    record_path = out or default_path("learning")
    report = run_learning_bench(
        base,
        chosen=chosen,
        seeds=seed_values,
        target_gain=target_gain,
        eval_every=eval_every,
        pin=not no_pin,
        paper_figure=record_path.with_name(f"{record_path.stem}-paper.png"),
        on_status=lambda text: console.log(text, markup=False, highlight=False),
    )
    headline = report["headline"]
    targets = {}
    if g_values:  # the paper's comparison: at least 2x sooner than G = max, with no lower ESS
        largest = f"conventional_g{max(g_values)}"
        for baseline in (largest, f"{largest}_strict"):
            if (key := times_faster_key("pipeline", baseline)) in headline:
                targets[key] = target_check(headline[key], at_least=2.0)
        if (baseline_ess := headline.get(f"ess_mean_{largest}")) is not None:
            targets["ess_mean_pipeline"] = target_check(
                headline.get("ess_mean_pipeline"), at_least=baseline_ess
            )
    from pipelinerl.bench.learning_tables import TABLE_HEADERS, table_rows
    from pipelinerl.bench.report import markdown_table

    finish(
        "learning",
        report,
        targets=targets,
        settings={
            **report["details"].pop("settings"),
            "gs": g_values,
            "with_async": not no_async,
            "strict": not no_strict,
            "target_gain": target_gain,
            "quick": quick,
        },
        out=out,
        load_before=load_before,
        started_at=started_at,
        render=lambda record: markdown_table(TABLE_HEADERS, table_rows(record)),
    )
    import json

    from pipelinerl.bench.learning import save_overlay

    figure = save_overlay(json.loads(record_path.read_text()), record_path.with_suffix(".png"))
    console.print(f"overlay figure: {figure}", markup=False, highlight=False)
    if paper := report["details"].get("paper_figure"):
        console.print(f"the paper's figures: {paper}", markup=False, highlight=False)


def recipes(
    config_path: ConfigOption = None,
    set_: SetOption = None,
    names: Annotated[
        str,
        typer.Option(
            "--recipes",
            help="Recipes, comma-separated: truncated_is (the reference, always run), ppo_clip_higher_token, "
            "gspo, cispo, truncated_is_kl.",
        ),
    ] = "truncated_is,ppo_clip_higher_token,gspo,cispo,truncated_is_kl",
    seeds: SeedsOption = "0",
    steps: StepsOption = 100,
    eval_every: EvalEveryOption = 10,
    eval_problems: EvalProblemsOption = 200,
    target_gain: TargetGainOption = 0.10,
    quick: QuickOption = False,
    out: OutOption = None,
) -> None:
    """The training recipes (docs/recipes.md) in PipelineRL mode on the same task: held-out success,
    ESS, lag, tokens clipped and step time per recipe, against truncated_is, the paper's loss."""
    import json

    from pipelinerl.bench.learning import run_learning_bench, save_overlay
    from pipelinerl.bench.recipes import (
        REFERENCE,
        TABLE_HEADERS,
        add_recipe_figures,
        recipe_variants,
        table_rows,
    )
    from pipelinerl.bench.report import default_path, load_average, markdown_table
    from pipelinerl.platform.config import ConfigError, load_config, with_overrides

    seed_values = parse_seeds(seeds)
    try:
        chosen = recipe_variants([part.strip() for part in names.split(",") if part.strip()])
    except ValueError as error:
        raise fail(f"--recipes: {error}") from None
    if quick:
        steps, eval_every, eval_problems = 4, 2, 16
    try:
        base = load_config(config_path, list(set_ or []))
        base = with_overrides(base, {"run.max_steps": steps, "task.eval_problems": eval_problems})
    except ConfigError as error:
        raise fail(str(error)) from None
    load_before, started_at = load_average(), datetime.now(UTC)
    record_path = out or default_path("recipes")
    report = run_learning_bench(
        base,
        chosen=chosen,
        seeds=seed_values,
        target_gain=target_gain,
        eval_every=eval_every,
        on_status=lambda text: console.log(text, markup=False, highlight=False),
        reference=REFERENCE,
        name="bench-recipes",
    )
    report = add_recipe_figures(report)
    finish(
        "recipes",
        report,
        targets={},
        settings={
            **report["details"].pop("settings"),
            "recipes": {variant.label: variant.overrides for variant in chosen},
            "learning_rate": base.trainer.learning_rate,
            "target_gain": target_gain,
            "quick": quick,
        },
        out=record_path,
        load_before=load_before,
        started_at=started_at,
        render=lambda record: markdown_table(TABLE_HEADERS, table_rows(record)),
    )
    figure = save_overlay(
        json.loads(record_path.read_text()),
        record_path.with_suffix(".png"),
        title="Held-out success by recipe (PipelineRL mode)",
    )
    console.print(f"overlay figure: {figure}", markup=False, highlight=False)


def faults(
    config_path: ConfigOption = None,
    set_: SetOption = None,
    seeds: Annotated[
        str, typer.Option("--seeds", help="Seeds, comma-separated: one pair of runs each.")
    ] = "0",
    rate: Annotated[
        int, typer.Option("--rate", min=1, help="Damaged frames per second sent to the rollout socket.")
    ] = 500,
    quick: QuickOption = False,
    out: OutOption = None,
) -> None:
    """The same run undisturbed and under a flood of damaged and impossible input: learning, refusals
    counted, nothing lost (docs/reliability.md)."""
    from pipelinerl.bench.faults import TABLE_HEADERS, run_faults_bench, table_rows
    from pipelinerl.bench.report import load_average, markdown_table, target_check
    from pipelinerl.platform.config import ConfigError, load_config, with_overrides

    seed_values = parse_seeds(seeds)
    try:
        base = load_config(config_path, list(set_ or []))
        if quick:
            base = with_overrides(base, {"run.max_steps": 6, "task.eval_problems": 16})
    except ConfigError as error:
        raise fail(str(error)) from None
    load_before, started_at = load_average(), datetime.now(UTC)
    status = lambda text: console.log(text, markup=False, highlight=False)  # noqa: E731
    report = run_faults_bench(base, seeds=seed_values, rate=rate, on_status=status)
    headline = report["headline"]
    targets = {
        "lost": target_check(headline["lost"], below=1),
        "stranger_rollouts_trained": target_check(headline["stranger_rollouts_trained"], below=1),
        # a peer without the run's keys is refused at the handshake (checked once per flooded run)
        "keyless_strangers_refused": target_check(
            headline["keyless_strangers_refused"], at_least=headline["flooded_runs"]
        ),
        # bad input costs no learning: the flooded runs' median gain within 5 points of the undisturbed
        "gain_flooded_median": target_check(
            headline["gain_flooded_median"],
            at_least=(headline["gain_undisturbed_median"] or 0.0) - 0.05,
        ),
        "runs_finished": target_check(headline["runs_finished"], at_least=headline["runs"]),
    }
    finish(
        "faults",
        report,
        targets=targets,
        settings={**report["details"].pop("settings"), "seeds": seed_values, "quick": quick},
        out=out,
        load_before=load_before,
        started_at=started_at,
        render=lambda record: markdown_table(TABLE_HEADERS, table_rows(record)),
    )


def restart(
    config_path: ConfigOption = None,
    set_: SetOption = None,
    seeds: SeedsOption = "0,1,2",
    kill_at: Annotated[
        int,
        typer.Option("--kill-at", min=1, help="Kill trainer rank 0 after the checkpoint at this version."),
    ] = 10,
    out: OutOption = None,
) -> None:
    """Time from a trainer crash to the next step, the actors restarted or kept (docs/reliability.md)."""
    from pipelinerl.bench.report import load_average, markdown_table
    from pipelinerl.bench.restart import TABLE_HEADERS, run_restart_bench, table_rows
    from pipelinerl.platform.config import ConfigError, load_config, with_overrides

    seed_values = parse_seeds(seeds)
    try:
        base = load_config(config_path, list(set_ or []))
        if not base.trainer.checkpoint_every or kill_at % base.trainer.checkpoint_every:
            base = with_overrides(base, {"trainer.checkpoint_every": kill_at})
        if base.run.max_steps <= kill_at:
            raise ConfigError(
                f"--kill-at {kill_at}: the run must train past it (run.max_steps={base.run.max_steps})"
            )
    except ConfigError as error:
        raise fail(str(error)) from None
    load_before, started_at = load_average(), datetime.now(UTC)
    status = lambda text: console.log(text, markup=False, highlight=False)  # noqa: E731
    report = run_restart_bench(base, seeds=seed_values, kill_at=kill_at, on_status=status)
    finish(
        "restart",
        report,
        targets={},
        settings={**report["details"].pop("settings"), "seeds": seed_values},
        out=out,
        load_before=load_before,
        started_at=started_at,
        render=lambda record: markdown_table(TABLE_HEADERS, table_rows(record)),
    )


def _learning_from_record(path: Path, target_gain: float, out: Path | None) -> None:
    import json

    from pipelinerl.bench.learning import results_from_record, retarget, save_overlay, summarize_bench
    from pipelinerl.bench.learning_tables import TABLE_HEADERS, table_rows
    from pipelinerl.bench.report import load_average, markdown_table, target_check
    from pipelinerl.platform.tracking.ratios import times_faster_key

    if not path.is_file():
        raise fail(f"--from-record {str(path)!r} is not a file (a learning.json written by bench learning)")
    try:
        record = json.loads(path.read_text())
        results = retarget(results_from_record(record), target_gain)
        labels = [row["variant"] for row in record["variants"]]
    except (ValueError, KeyError, TypeError) as error:
        raise fail(f"{path} is not a bench learning record ({error})") from None
    load_before, started_at = load_average(), datetime.now(UTC)
    report = summarize_bench(results, target_gain, labels)
    report["notes"].append(f"summarised again from the runs of {path} (run {record.get('timestamp')})")
    headline = report["headline"]
    targets = {}
    for label in labels:
        if label.startswith("conventional_g") and (key := times_faster_key("pipeline", label)) in headline:
            targets[key] = target_check(headline[key], at_least=2.0)
    baselines = [label for label in labels if label.startswith("conventional_g")]
    if baselines and (baseline_ess := headline.get(f"ess_mean_{baselines[0]}")) is not None:
        targets["ess_mean_pipeline"] = target_check(headline.get("ess_mean_pipeline"), at_least=baseline_ess)
    record_path = out or path
    finish(
        "learning",
        report,
        targets=targets,
        settings={**record.get("settings", {}), "target_gain": target_gain, "from_record": str(path)},
        out=record_path,
        load_before=load_before,
        started_at=started_at,
        render=lambda written: markdown_table(TABLE_HEADERS, table_rows(written)),
    )
    figure = save_overlay(json.loads(record_path.read_text()), record_path.with_suffix(".png"))
    console.print(f"overlay figure: {figure}", markup=False, highlight=False)


def figures(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="Finished run directories (runs/<run-id>), one per variant.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="PNG to write (default: the learning record's figure).")
    ] = Path("docs/benchmarks/learning-paper.png"),
) -> None:
    """The paper's figure set (lag by token position, lag histogram, ESS by step, reward against wall
    time) drawn again from finished runs, e.g. those of a ``bench learning`` record, without re-running."""
    from pipelinerl.bench.learning import redraw_paper_figures
    from pipelinerl.bench.learning_tables import CLAIM_HEADERS, claim_rows
    from pipelinerl.bench.report import markdown_table

    try:
        claims = redraw_paper_figures(run_dirs, out)
    except ValueError as error:
        raise fail(str(error)) from None
    console.print(
        markdown_table(CLAIM_HEADERS, claim_rows(claims)), markup=False, highlight=False, soft_wrap=True
    )
    console.print(f"the paper's figures: {out}", markup=False, highlight=False)
