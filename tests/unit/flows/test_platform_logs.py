"""The rl-run flow forwards the platform's own log records (the warm-start's progress) to its logger."""

from __future__ import annotations

import logging

from pipelinerl.flows.rl_run import PlatformLogs


class _Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_warm_start_progress_reaches_the_flow_run_logger_only_while_the_flow_runs():
    target = logging.getLogger("test.flow-run")
    target.propagate = False
    collected = _Collect()
    target.addHandler(collected)
    target.setLevel(logging.INFO)
    warmstart = logging.getLogger("pipelinerl.launch.warmstart")
    with PlatformLogs(target):
        warmstart.info("warm-start (supervised): step %d/%d", 60, 600)
        logging.getLogger("elsewhere").info("not the platform's")
    warmstart.info("after the flow")
    assert collected.messages == ["warm-start (supervised): step 60/600"]
