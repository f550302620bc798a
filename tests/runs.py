"""A finished run as the integration modules' shared-run fixtures hand it to their tests."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pipelinerl.launch.launcher import RunResult
from pipelinerl.platform.config import PipelineConfig


@dataclass
class Run:
    config: PipelineConfig
    result: RunResult

    def jsonl(self, name: str) -> list[dict[str, Any]]:
        """The records of the run directory's ``name`` (``metrics.jsonl``, ``eval.jsonl``, ...)."""
        return [json.loads(line) for line in (self.result.run_dir / name).read_text().splitlines()]
