"""Run every check (the slow ones side by side) and show them: a table, or JSON for scripts."""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Collection
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipelinerl.doctor import collectives, config_fit, engines, machine, model_facts, services, weight_paths
from pipelinerl.doctor.checks import STATUSES, Check
from pipelinerl.platform.config import PipelineConfig

STYLES = {"PASS": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}
SECTIONS = (machine.SECTION, config_fit.SECTION, engines.SECTION, collectives.SECTION, services.SECTION)


@dataclass
class Report:
    checks: list[Check]
    elapsed_s: float  # the checks' own time
    smoke_s: float | None = None  # the smoke run's, when there was one
    complete: bool = True  # every section was checked (not ``--only`` some)

    @property
    def ok(self) -> bool:
        return not any(check.status == "FAIL" for check in self.checks)

    def counts(self) -> dict[str, int]:
        counted = Counter(check.status for check in self.checks)
        return {status: counted.get(status, 0) for status in STATUSES}

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "elapsed_s": round(self.elapsed_s, 2),
            "smoke_s": None if self.smoke_s is None else round(self.smoke_s, 1),
            "complete": self.complete,
            "counts": self.counts(),
            "checks": [check.as_dict() for check in self.checks],
        }


def _guarded(section: str, name: str, work: Callable[[], Any]) -> Callable[[], list[Check]]:
    """``work`` as a list of checks; a check that raises is a FAIL naming the error, not a traceback."""

    def run() -> list[Check]:
        try:
            result = work()
        except Exception as error:
            return [Check(section, name, "FAIL", f"the check itself failed: {type(error).__name__}: {error}")]
        return result if isinstance(result, list) else [result]

    return run


def _settled(work: Callable[[], Any]) -> Any:
    """What ``work`` returns or raises: a check reports the error as its own FAIL."""
    try:
        return work()
    except Exception as error:
        return error


# The names ``pipelinerl doctor --only`` takes, one per section.
SECTION_NAMES = {
    "machine": machine.SECTION,
    "config": config_fit.SECTION,
    "engines": engines.SECTION,
    "collectives": collectives.SECTION,
    "services": services.SECTION,
}


def sections_named(names: Collection[str]) -> frozenset[str]:
    """The sections ``names`` (``SECTION_NAMES``' keys, any case) stand for; none: every section.
    ``ValueError`` naming a name that is none of them, and the valid ones."""
    if not names:
        return frozenset(SECTIONS)
    unknown = [name for name in names if name.lower() not in SECTION_NAMES]
    if unknown:
        raise ValueError(f"unknown doctor section {unknown[0]!r}; valid sections: {', '.join(SECTION_NAMES)}")
    return frozenset(SECTION_NAMES[name.lower()] for name in names)


def run_checks(
    config: PipelineConfig,
    prefect_api: str | None = None,
    prefect_origin: str = "",
    sections: Collection[str] = SECTIONS,
) -> Report:
    """The checks of ``sections`` (every one by default) on ``config``; the ones that start processes
    run side by side, and a section left out costs nothing. ``prefect_api``: a Prefect API found other
    than by PREFECT_API_URL (``prefect_origin`` says where: the local stack)."""
    start = time.perf_counter()
    wanted = set(sections)
    devices = bool(wanted & {machine.SECTION, config_fit.SECTION, collectives.SECTION})
    if services.SECTION in wanted:
        services.preload()  # before the threads: two threads importing SQLAlchemy at once break its import
    checks: list[Check] = []
    with ThreadPoolExecutor(max_workers=8) as pool:

        def submit(section: str, name: str, work: Callable[[], Any]) -> list[Future[list[Check]]]:
            return [pool.submit(_guarded(section, name, work))] if section in wanted else []

        torch_future = pool.submit(machine.torch_facts) if devices else None
        smi_future = pool.submit(machine.nvidia_smi_facts) if devices else None
        deepspeed_future = pool.submit(engines.deepspeed_facts) if engines.SECTION in wanted else None
        model_future = (
            pool.submit(_settled, lambda: model_facts.model_facts(config))
            if config_fit.SECTION in wanted
            else None
        )
        later = [
            *submit(collectives.SECTION, "gloo", lambda: collectives.check_gloo(config)),
            *submit(engines.SECTION, "vLLM environment", lambda: engines.check_vllm_env(config)),
            *submit(engines.SECTION, "transformers", lambda: engines.check_transformers(config)),
            *submit(services.SECTION, "tracking store", lambda: services.check_tracking_store(config)),
            *submit(services.SECTION, "platform database", lambda: services.check_platform_database(config)),
            *submit(
                services.SECTION,
                "Prefect API",
                lambda: services.check_prefect(config, prefect_api, prefect_origin or "PREFECT_API_URL"),
            ),
            *submit(services.SECTION, "transport ports", lambda: services.check_ports(config)),
        ]
        if torch_future is not None and smi_future is not None:
            torch, smi = torch_future.result(), smi_future.result()
            gpus = len(torch.get("devices", []))
            later += submit(collectives.SECTION, "NCCL", lambda: collectives.check_nccl(config, gpus))
            later += submit(
                collectives.SECTION, "CUDA IPC", lambda: weight_paths.check_cuda_ipc(config, gpus)
            )
            if machine.SECTION in wanted:
                checks += _guarded(
                    machine.SECTION,
                    "this machine",
                    lambda: machine.machine_checks(config, torch=torch, smi=smi or False),
                )()
            if model_future is not None:
                model = model_future.result()
                checks += _guarded(
                    config_fit.SECTION,
                    "config",
                    lambda: config_fit.config_checks(config, model, torch, smi),
                )()
            if collectives.SECTION in wanted:
                seen = config_fit.visible(torch, smi, os.environ)  # the GPUs as the launcher hands them out
                checks += _guarded(
                    collectives.SECTION,
                    "weight updates",
                    lambda: weight_paths.check_weight_backend(config, seen.ids, seen.torch_cuda),
                )()
        if deepspeed_future is not None:
            deepspeed = deepspeed_future.result()
            checks += _guarded(engines.SECTION, "DeepSpeed", lambda: engines.check_deepspeed(deepspeed))()
        for future in later:
            checks += future.result()
    order = {section: index for index, section in enumerate(SECTIONS)}
    checks.sort(key=lambda check: order.get(check.section, len(order)))  # stable: keeps each section's order
    return Report(checks, time.perf_counter() - start, complete=wanted >= set(SECTIONS))


def render(report: Report, console: Console) -> None:
    """The checks as one table, a section per heading row; long cells wrap, no column is dropped."""
    table = Table(show_lines=False, expand=True, header_style="bold")
    table.add_column("Check", ratio=2, min_width=10, overflow="fold")
    table.add_column("Status", no_wrap=True, min_width=4)
    table.add_column("Result", ratio=4, min_width=16, overflow="fold")
    table.add_column("Fix", ratio=3, min_width=12, overflow="fold")
    section = None
    for check in report.checks:
        if check.section != section:
            if section is not None:
                table.add_section()
            section = check.section
            table.add_row(Text(section, style="bold cyan"), "", "", "")
        table.add_row(check.name, Text(check.status, style=STYLES[check.status]), check.detail, check.fix)
    console.print(table)
    counts = ", ".join(f"{count} {status}" for status, count in report.counts().items() if count)
    verdict = (
        "[bold red]fix the FAILs[/bold red]"
        if not report.ok
        else "[green]this machine can run the platform[/green]"
        if report.complete
        else "[green]no check failed[/green] (some sections only: `pipelinerl doctor` checks them all)"
    )
    smoke = "" if report.smoke_s is None else f" and a smoke run of {report.smoke_s:.0f} s"
    console.print(
        f"{len(report.checks)} checks in {report.elapsed_s:.1f} s{smoke}: {counts}; {verdict}",
        highlight=False,
    )
