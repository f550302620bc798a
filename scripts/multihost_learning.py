"""Learning across hosts, measured (docs/cluster.md): the embedded default experiment on a namespace
cluster with pools placement, launched through the head's ``rl-run`` deployment as a user launches
it; prints the run's summary to compare with the same config on one host (``pipelinerl run -s
model.path=<the same warm start>``). Needs root; takes 3-4 minutes on a 2-core machine.

    sudo .venv/bin/python scripts/multihost_learning.py /tmp/learn-cluster [setting=value ...]
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

from pipelinerl.flows import netns_cluster
from pipelinerl.flows.netns_cluster import head_url, http_json, run_on
from pipelinerl.flows.netns_plan import PREFECT_PORT
from pipelinerl.launch.model_source import resolve_model
from pipelinerl.platform.config import load_config

PREFIX = "plrl"
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def main(home: Path, overrides: list[str]) -> None:
    netns_cluster.down(prefix=PREFIX)
    started = time.monotonic()
    state = netns_cluster.up(
        home,
        PREFIX,
        env=dict(os.environ, PREFECT_WORKER_QUERY_SECONDS="2"),
        on_status=lambda text: print(f"{time.monotonic() - started:6.1f} s  {text}", flush=True),
    )
    try:
        model = resolve_model(load_config())  # the embedded default's warm start, as `pipelinerl run`
        config = load_config(
            None,
            [
                f"model.path={model}",
                f"run.output_dir={home / 'runs'}",
                "run.name=learn-multihost",
                "transport.host=trainer-0",
                "cluster.placement=pools",
                'cluster.trainer_work_queues=["trainer-0"]',
                *overrides,
            ],
        ).model_dump(mode="json")
        prefect = str(Path(sys.executable).parent / "prefect")
        params = json.dumps({"config": config})
        done = run_on(state, "head", [prefect, "deployment", "run", "rl-run/default", "--params", params])
        if done.returncode != 0:
            raise SystemExit(done.stdout + done.stderr)
        match = re.search(r"UUID:\s*([0-9a-f-]{36})", done.stdout)
        assert match, done.stdout
        url = head_url(state.plan, PREFECT_PORT, f"/api/flow_runs/{match.group(1)}")
        while (run := http_json(state.plan, url))["state"]["type"] not in FINAL:
            time.sleep(2)
        print(f"{time.monotonic() - started:6.1f} s  the run is {run['state']['type']}", flush=True)
        for summary in sorted((home / "runs").glob("*/summary.json")):
            print(summary.read_text())
    finally:
        netns_cluster.down(home, PREFIX)


if __name__ == "__main__":
    main(Path(sys.argv[1]).resolve(), sys.argv[2:])
