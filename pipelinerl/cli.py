"""The ``pipelinerl`` command.

Heavy libraries (torch, transformers, DeepSpeed) are imported only inside the commands that need
them, so ``pipelinerl --help`` answers at once and a bad configuration is reported before any of
them loads.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from pipelinerl.bench.cli import bench_app
from pipelinerl.flows.netns_cli import cluster_app
from pipelinerl.launch.replay_cli import audit_command, export_command, replay_command
from pipelinerl.plan.cli import plan_app
from pipelinerl.platform.tracking.db_cli import db_app, runs_app

app = typer.Typer(
    help="PipelineRL: on-policy RL of language models with in-flight weight updates, and its baselines.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
console = Console()

ConfigOption = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML experiment file (default: the embedded default).")
]
SetOption = Annotated[
    list[str] | None,
    typer.Option("--set", "-s", help="Override one setting: section.key=value (repeatable)."),
]


def _load(config_path: Path | None, overrides: list[str] | None):  # type: ignore[no-untyped-def]
    from pipelinerl.platform.config import ConfigError, load_config

    try:
        return load_config(config_path, overrides or [])
    except ConfigError as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from None


def _local_stack(config):  # type: ignore[no-untyped-def]
    """The local stack (``pipelinerl up``) in the config's home, as a run would use it, for the doctor:
    the config tracking in its MLflow server when no store is named, and its Prefect API when
    PREFECT_API_URL is not set (else None). Quiet: the doctor's checks say what they found."""
    from pipelinerl.flows.stack import read_state
    from pipelinerl.platform.config import with_overrides

    state = read_state(config.run.home.expanduser())
    if state is None or not state.ready:
        return config, None
    named = config.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if config.tracking.enabled and not named:
        config = with_overrides(config, {"tracking.mlflow_uri": state.mlflow_url})
    return config, None if os.environ.get("PREFECT_API_URL") else state.prefect_api_url


def _track_in_stack(config):  # type: ignore[no-untyped-def]
    """With the local stack up (``pipelinerl up``) and no tracking store named, track in the stack's
    MLflow server: its experiments keep their artifacts behind the server, where a run writing to the
    same SQLite store directly could not put them. A stack whose MLflow server does not answer is an
    error naming it, not minutes of retries."""
    from pipelinerl.flows.stack import mlflow_healthy, read_state, state_path
    from pipelinerl.platform.config import with_overrides

    if not config.tracking.enabled or config.tracking.mlflow_uri or os.environ.get("MLFLOW_TRACKING_URI"):
        return config
    home = config.run.home.expanduser()
    state = read_state(home)
    if state is None or not state.ready:
        return config
    if not mlflow_healthy(state.mlflow_url):
        console.print(
            f"[red]error:[/red] the local stack ({state_path(home)}) lists an MLflow server at "
            f"{state.mlflow_url} that does not answer; start it again with `pipelinerl up`, stop it with "
            "`pipelinerl down`, or name a store with --set tracking.mlflow_uri=...",
            soft_wrap=True,
        )
        raise typer.Exit(2)
    console.print(f"tracking in the local stack's MLflow server, {state.mlflow_url}", highlight=False)
    return with_overrides(config, {"tracking.mlflow_uri": state.mlflow_url})


def _log_to_console() -> None:
    """Library progress (the warm-start, warnings) goes through the same console as the live view; the
    libraries' own chatter does not: Alembic's INFO lines about its plugins and each migration (the
    platform database is migrated at every run's start), and transformers' progress bars while the
    weights load or save (HF_HUB_DISABLE_PROGRESS_BARS=0 shows them again). Their warnings still show."""
    import logging
    import os

    from rich.logging import RichHandler

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when transformers is imported
    logging.basicConfig(level=logging.INFO, format="%(message)s", handlers=[RichHandler(console=console)])
    logging.getLogger("alembic").setLevel(logging.WARNING)


@app.command()
def run(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Run the three stages (actor, preprocessor, trainer) and report what was learned.

    They run on this machine, or with cluster.placement=pools as flow runs on the Prefect work pools
    (PREFECT_API_URL names the server)."""
    resolved = _track_in_stack(_load(config, set_))
    _log_to_console()
    from pipelinerl.launch.launcher import launch, local_placement
    from pipelinerl.launch.progress import ProgressView

    placement = local_placement
    if resolved.cluster.placement == "pools":
        from pipelinerl.flows.placement import placement_for

        placement = placement_for(resolved, lambda text: console.log(text))
    view = ProgressView(console, resolved)
    with _run_errors(), view:
        result = launch(
            resolved,
            on_records=view.add_records,
            on_status=view.set_status,
            on_eval=view.add_evals,
            placement=placement,
        )
    view.print_summary(result.summary, result.run_dir)


@contextlib.contextmanager
def _run_errors() -> Iterator[None]:
    """Errors a user can act on, printed as one message (exit 1) instead of a traceback."""
    from pipelinerl.launch.launcher import RunTerminated, StageFailed
    from pipelinerl.platform.checkpoint import CheckpointError
    from pipelinerl.platform.config import ConfigError
    from pipelinerl.platform.tracking.db import PlatformDatabaseError
    from pipelinerl.platform.tracking.mlflow_store import TrackingError
    from pipelinerl.platform.transport import PortInUseError

    try:
        yield
    except RunTerminated as stop:
        console.print(f"[yellow]stopped:[/yellow] {stop}; every stage was stopped", soft_wrap=True)
        raise typer.Exit(143) from None
    except KeyboardInterrupt:
        console.print("[yellow]interrupted:[/yellow] every stage was stopped", soft_wrap=True)
        raise typer.Exit(130) from None
    except (
        PortInUseError,
        StageFailed,
        FileNotFoundError,
        CheckpointError,
        ConfigError,
        TrackingError,
        PlatformDatabaseError,
    ) as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True)
        raise typer.Exit(1) from None


def _status_lines(update: Callable[[str], None], every_s: float = 10.0) -> Callable[[str], None]:
    """A status callback for long work: in a terminal the spinner's text changes; written to a file or
    a pipe (where a spinner shows nothing) a timestamped line is printed at each new phase and, within
    one, at most every ``every_s`` seconds."""
    import time

    last: dict[str, Any] = {"at": 0.0, "phase": None}

    def show(text: str) -> None:
        update(text)
        if console.is_terminal:
            return
        phase = text.split(" step ")[0]
        now = time.monotonic()
        if phase != last["phase"] or now - last["at"] >= every_s:
            console.print(
                f"{time.strftime('%H:%M:%S')} {text}", highlight=False, markup=False, soft_wrap=True
            )
            last.update(at=now, phase=phase)

    return show


@app.command()
def compare(
    modes: Annotated[
        str, typer.Option("--modes", "-m", help="Comma-separated modes; the first is the reference.")
    ] = "pipeline,conventional",
    config: ConfigOption = None,
    set_: SetOption = None,
    target: Annotated[
        float | None,
        typer.Option(help="Train reward to reach (default: the highest smoothed reward every mode reached)."),
    ] = None,
    window: Annotated[int, typer.Option(min=1, help="Steps in the trailing mean of the reward.")] = 5,
) -> None:
    """Run the same experiment once per mode, as child runs of one MLflow run, and compare them."""
    from pipelinerl.platform.config import ConfigError

    resolved = _track_in_stack(_load(config, set_))
    from pipelinerl.launch.compare import parse_modes, run_comparison

    try:
        mode_list = parse_modes(modes)
    except ConfigError as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from None
    _log_to_console()
    with _run_errors(), console.status("comparing") as spinner:
        result = run_comparison(
            resolved, mode_list, target=target, window=window, on_status=_status_lines(spinner.update)
        )
    from pipelinerl.launch.progress import print_comparison

    print_comparison(console, result)


config_app = typer.Typer(help="Inspect configurations.", no_args_is_help=True)
app.add_typer(config_app, name="config")


@config_app.command("show")
def config_show(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Validate and print the resolved configuration (every field, with defaults)."""
    from pipelinerl.platform.config import flatten

    resolved = _load(config, set_)
    for key, value in flatten(resolved).items():
        console.print(f"{key} = {value!r}", highlight=False)


@app.command()
def warmstart(config: ConfigOption = None, set_: SetOption = None) -> None:
    """Build (or find in the cache) the embedded tiny model, warm-started on the task."""
    resolved = _load(config, set_)
    _log_to_console()
    from pipelinerl.launch.model_source import resolve_model

    path = resolve_model(resolved, console=console)
    console.print(f"warm-started model: {path}")


@app.command()
def doctor(
    config: ConfigOption = None,
    set_: SetOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the checks as JSON, for scripts.")] = False,
    smoke: Annotated[
        bool,
        typer.Option(
            "--smoke",
            help="Also make a 3-step run of the config on this machine's devices (CPU; one GPU: colocated "
            "vLLM actor; two or more: actor on its own GPU, NCCL) and report its figures.",
        ),
    ] = False,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record", help="With --smoke: where its record goes (docs/benchmarks/smoke-<device>.json)."
        ),
    ] = None,
    only: Annotated[
        list[str] | None,
        typer.Option(
            "--only",
            help="Only this section's checks (repeatable): machine, config, engines, collectives, services. "
            "E.g. --only services after `pipelinerl up`.",
        ),
    ] = None,
) -> None:
    """Check whether this machine can run the platform: machine, engines, collectives, services.

    Each check is PASS, WARN, FAIL or SKIP with a one-line fix; the exit status is 1 when any fails.
    --smoke then proves the path end to end with a short real run (the GPU path, on a GPU)."""
    import json
    import time

    from pipelinerl.doctor.report import Report, render, run_checks, sections_named

    try:
        sections = sections_named(only or [])
    except ValueError as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True)
        raise typer.Exit(2) from None
    resolved, stack_api = _local_stack(_load(config, set_))
    origin = "the local stack, `pipelinerl up`" if stack_api else ""
    if as_json:
        report = run_checks(resolved, stack_api, origin, sections)
    else:
        _log_to_console()
        with console.status("checking this machine"):
            report = run_checks(resolved, stack_api, origin, sections)
    if smoke:
        from pipelinerl.doctor.machine import torch_facts
        from pipelinerl.doctor.smoke import run_smoke

        gpu_names = [device["name"] for device in torch_facts().get("devices", [])]
        start = time.perf_counter()
        if as_json:
            result = run_smoke(resolved, gpu_names, record_path=record)
        else:
            with console.status("smoke run: starting") as spinner:
                on_status = _status_lines(lambda text: spinner.update(f"smoke run: {text}"))
                result = run_smoke(resolved, gpu_names, record_path=record, on_status=on_status)
        report = Report(
            report.checks + result.checks, report.elapsed_s, time.perf_counter() - start, report.complete
        )
    if as_json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        render(report, console)
    if not report.ok:
        raise typer.Exit(1)


@app.command()
def resume(
    run: Annotated[
        str,
        typer.Argument(help="The run's directory, or its id (or a unique prefix) in the platform database."),
    ],
    url: Annotated[
        str | None,
        typer.Option("--url", help="The platform database to find RUN in (default: the config's)."),
    ] = None,
) -> None:
    """Go on with a run whose launcher stopped (killed, its machine lost) in place: same run, from its
    newest checkpoint, the prompts its policy was not trained on handed out again."""
    run_dir = _run_dir_of(run, url)
    _log_to_console()
    from pipelinerl.launch.progress import ProgressView
    from pipelinerl.launch.resume import ResumeRefused, resume
    from pipelinerl.platform.config import PipelineConfig

    try:
        config = PipelineConfig.model_validate_json((run_dir / "config.json").read_text())
    except (OSError, ValueError) as error:
        console.print(f"[red]error:[/red] {run_dir} is not a run directory: {error}", soft_wrap=True)
        raise typer.Exit(2) from None
    view = ProgressView(console, config)
    try:
        with _run_errors(), view:
            result = resume(
                run_dir, on_records=view.add_records, on_status=view.set_status, on_eval=view.add_evals
            )
    except ResumeRefused as refused:
        console.print(f"[red]error:[/red] {refused}", soft_wrap=True)
        raise typer.Exit(2) from None
    view.print_summary(result.summary, result.run_dir)


def _run_dir_of(run: str, url: str | None) -> Path:
    """RUN as a directory, else the directory the platform database holds for that run id."""
    path = Path(run).expanduser()
    if path.is_dir():
        return path.resolve()
    from pipelinerl.platform.tracking.db_cli import open_store, resolve_url

    with open_store(resolve_url(url, None, None)) as store:
        found = store.get_run(store.find_run_id(run)).run
    if found.run_dir is None:
        console.print(
            f"[red]error:[/red] the platform database holds no run directory for {run!r}", soft_wrap=True
        )
        raise typer.Exit(2)
    return Path(found.run_dir)


app.command("replay")(replay_command)
runs_app.command("export")(export_command)
runs_app.command("audit")(audit_command)
app.add_typer(db_app, name="db", help="Migrate the platform database (Alembic): upgrade, downgrade, current.")
app.add_typer(runs_app, name="runs", help="Runs recorded in the platform database: list, show.")
app.add_typer(bench_app, name="bench")
app.add_typer(plan_app, name="plan")
dev_app = typer.Typer(
    help="Tools for developing and trying the platform on one machine.", no_args_is_help=True
)
dev_app.add_typer(cluster_app, name="cluster")
app.add_typer(dev_app, name="dev")


HomeOption = Annotated[
    Path | None,
    typer.Option(
        "--home", help="Platform home (default: run.home, ~/.pipelinerl); the stack lives in HOME/stack."
    ),
]


def _home(home: Path | None) -> Path:
    if home is not None:
        return home
    from pipelinerl.platform.config import RunConfig

    return RunConfig().home


@app.command()
def up(
    home: HomeOption = None,
    prefect_port: Annotated[
        int, typer.Option("--prefect-port", min=1, max=65535, help="Port of the Prefect server and UI.")
    ] = 4200,
    mlflow_port: Annotated[
        int, typer.Option("--mlflow-port", min=1, max=65535, help="Port of the MLflow server and UI.")
    ] = 5000,
    ui_port: Annotated[
        int, typer.Option("--ui-port", min=0, max=65535, help="Port of the dashboard (0: no dashboard).")
    ] = 8300,
) -> None:
    """Start the platform in the background: Prefect and MLflow servers, workers, deployments, the
    dashboard."""
    from pipelinerl.flows.stack import StackError
    from pipelinerl.flows.stack import up as stack_up

    try:
        with console.status("starting the stack") as spinner:
            state = stack_up(
                _home(home),
                prefect_port,
                mlflow_port,
                ui_port=ui_port or None,
                on_status=lambda text: spinner.update(text),
            )
    except StackError as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    console.print(f"Prefect UI: {state.prefect_ui_url}", highlight=False)
    console.print(f"MLflow UI:  {state.mlflow_url}", highlight=False)
    if state.dashboard_url:
        console.print(f"dashboard:  {state.dashboard_url}", highlight=False)
    console.print(
        f"deployments: {', '.join(state.deployments) or '(none)'} on work pool {state.launch_pool!r}; "
        f"logs in {state.home / 'stack' / 'logs'}; stop with `pipelinerl down"
        + (f" --home {home}`" if home is not None else "`"),
        soft_wrap=True,
        highlight=False,
    )


@app.command()
def down(home: HomeOption = None) -> None:
    """Stop the stack that `pipelinerl up` started in this home."""
    from pipelinerl.flows.stack import StackError
    from pipelinerl.flows.stack import down as stack_down

    resolved = _home(home)
    try:
        with console.status("stopping the stack"):
            state = stack_down(resolved)
    except StackError as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    if state is None:
        console.print(f"no stack is running in {resolved.expanduser()}", highlight=False)
        return
    console.print(f"stopped {len(state.processes)} processes of the stack in {state.home}", highlight=False)


@app.command()
def deploy(
    api_url: Annotated[
        str | None,
        typer.Option(
            "--api-url", help="Prefect API, e.g. http://127.0.0.1:4200/api (default: PREFECT_API_URL)."
        ),
    ] = None,
    work_pool: Annotated[
        str, typer.Option("--work-pool", help="Process work pool that runs the flows.")
    ] = "local",
) -> None:
    """Register the rl-run, compare and sweep deployments (the sweep's nightly schedule disabled)."""
    from pipelinerl.flows.deploy import DeployError, available_deployments
    from pipelinerl.flows.deploy import deploy as register

    _, missing = available_deployments()
    try:
        ids = register(api_url, work_pool=work_pool)
    except DeployError as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True, highlight=False)
        raise typer.Exit(1) from None
    for name, deployment_id in ids.items():
        console.print(f"{name}: {deployment_id}", highlight=False)
    for spec in missing:
        console.print(
            f"[yellow]skipped[/yellow] {spec.full_name}: {spec.path} does not exist", highlight=False
        )


@app.command()
def ui(
    port: Annotated[int, typer.Option("--port", "-p", min=1, max=65535, help="Port to serve on.")] = 8300,
    host: Annotated[
        str,
        typer.Option(
            "--host",
            help="Address to serve on. The dashboard has no authentication: anything but 127.0.0.1 (e.g. "
            "0.0.0.0 inside a container) publishes it to whoever reaches that address.",
        ),
    ] = "127.0.0.1",
    url: Annotated[
        str | None, typer.Option("--url", help="Platform database URL (default: from the configuration).")
    ] = None,
    mlflow_uri: Annotated[
        str | None, typer.Option("--mlflow-uri", help="MLflow tracking URI (default: from the config).")
    ] = None,
    mlflow_ui_url: Annotated[
        str | None, typer.Option("--mlflow-ui-url", help="MLflow UI for run links (default: :5000).")
    ] = None,
    prefect_ui_url: Annotated[
        str | None, typer.Option("--prefect-ui-url", help="Prefect UI for flow-run links (default: :4200).")
    ] = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Serve the dashboard (runs, the live pipeline, comparisons, a JSON API) on 127.0.0.1; read-only."""
    from pipelinerl.ui.app import DEFAULT_HOST, PortInUse, check_port, serve, settings_from_config

    settings = settings_from_config(
        _load(config, set_),
        database_url=url,
        mlflow_uri=mlflow_uri,
        mlflow_ui_url=mlflow_ui_url,
        prefect_ui_url=prefect_ui_url,
    )
    try:
        check_port(host, port)
    except PortInUse as error:
        console.print(f"[red]error:[/red] {error}", soft_wrap=True, highlight=False)
        raise typer.Exit(2) from None
    if host != DEFAULT_HOST:
        console.print(f"[yellow]note:[/yellow] serving on {host}, without authentication", highlight=False)
    console.print(f"dashboard: http://{host}:{port} (Ctrl-C stops it)", highlight=False)
    serve(settings, host, port)


if __name__ == "__main__":
    app()
