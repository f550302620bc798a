"""The vLLM engine's version stamps at an update (no vLLM needed: the engine's record, not its run).

The weights thread stamps inside the pause while the actor's main thread may submit; the engine's
version changes under the stamps' lock, so a request submitted at any moment is stamped right."""

from __future__ import annotations

import threading
from typing import Any

from pipelinerl.workers.engines.vllm_engine import VLLMEngine


class _Loop:
    """Stands in for the engine's asyncio loop: ``submit`` only hands it the request."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def call_soon_threadsafe(self, callback: Any, request_id: str, *args: Any) -> None:
        self.started.append(request_id)


def engine_at(version: int) -> VLLMEngine:
    engine = VLLMEngine.__new__(VLLMEngine)  # the record only: no vLLM process behind it
    engine.policy_version = version
    engine._outstanding = {}
    engine._finished = set()
    engine._stamps_lock = threading.Lock()
    engine._loop = _Loop()  # type: ignore[assignment]
    engine._sampling = engine._greedy_sampling = None  # vLLM's SamplingParams: passed on, never read here
    return engine


def test_an_update_stamps_every_outstanding_request_and_every_later_one():
    engine = engine_at(3)
    for request_id in ("running", "queued", "done"):
        engine.submit(request_id, [1, 2])
    engine._finished.add("done")  # its final output already reached this process
    # vLLM 0.32 reports ids with a suffix of its own; "queued" has not been scheduled yet.
    engine._stamp(4, {"running-1a2b3c4d": (5, 17)})
    engine.submit("after", [1, 2])  # submitted once the stamps are recorded, still in the pause

    assert engine.policy_version == 4
    assert engine._outstanding["running"].versions(7) == [3, 3, 3, 3, 3, 4, 4]
    assert engine._outstanding["queued"].versions(2) == [4, 4]
    assert engine._outstanding["done"].versions(2) == [3, 3]
    assert engine._outstanding["after"].versions(2) == [4, 4]
    assert engine._outstanding["after"].switches == []
