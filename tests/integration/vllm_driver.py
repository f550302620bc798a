"""Drives one ``VLLMEngine`` inside ``.venv-vllm`` for the tests, which run in ``.venv``.

Run: ``.venv-vllm/bin/python -m tests.integration.vllm_driver`` from the repository root (the tests
do). Commands arrive as JSON lines on stdin, one answer per command as a JSON line on the original
stdout; everything vLLM prints (its logger writes to stdout, in every process it starts) goes to
stderr instead, so it cannot interleave with the answers.

Commands: ``start`` (engine keyword arguments and the weight group), ``submit`` (request id ->
prompt ids), ``update`` (version, the tensors' names, shapes and dtypes; the test broadcasts the
tensors meanwhile as trainer rank 0, then sends one more line, ``{"digests": [hex, ...]}``, the
trainer's digest of every bucket, as the trainer's ``WeightDigests``; optionally only once sequences
are known to be in flight; a refused update answers ``refused``, the buckets, and ``reason``),
``collect`` (wait for n finished sequences), ``set``
(``kv_cache_on_update``), ``status`` (policy version, requests in flight), ``close``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import traceback
from typing import Any

from pipelinerl.platform.weights import BucketsRefused
from pipelinerl.workers.checked_receive import receive_checked
from pipelinerl.workers.engines.vllm_engine import VLLMEngine, WeightGroupAddress


def main() -> None:
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # vLLM's output, children's too, to stderr
    import vllm  # noqa: PLC0415 (after the dup2: vLLM logs to stdout as it is imported)

    engine: VLLMEngine | None = None
    for line in sys.stdin:
        command = json.loads(line)
        try:
            answer: dict[str, Any] = {}
            name = command["cmd"]
            if name == "start":
                group = command.get("weight_group")
                engine = VLLMEngine(
                    command["model"],
                    weight_group=WeightGroupAddress(**group) if group else None,
                    **command["engine"],
                )
                answer["startup_s"] = engine.startup_s
            elif engine is None:
                raise RuntimeError(f"{name!r} before 'start'")
            elif name == "submit":
                for request_id, prompt in command["requests"].items():
                    engine.submit(request_id, prompt, greedy=command.get("greedy", False))
            elif name == "update":
                answer.update(update(engine, command))
            elif name == "collect":
                done = []
                deadline = time.monotonic() + command["timeout_s"]
                while len(done) < command["n"] and time.monotonic() < deadline:
                    done += engine.poll(0.5)
                answer["sequences"] = [dataclasses.asdict(sequence) for sequence in done]
                answer["in_flight"] = engine.num_in_flight
                answer["stamp_disagreements"] = engine.stamp_disagreements
            elif name == "set":
                engine.kv_cache_on_update = command["kv_cache_on_update"]
            elif name == "status":
                answer["vllm_version"] = vllm.__version__
                answer["policy_version"] = engine.policy_version
                answer["in_flight"] = engine.num_in_flight
            elif name == "close":
                engine.close()
                answers.write(json.dumps({"ok": True}) + "\n")
                return
            else:
                raise ValueError(f"unknown command {name!r}")
        except Exception:
            answer = {"error": traceback.format_exc()}
        answers.write(json.dumps(answer) + "\n")


class NotYet(Exception):
    """The batch does not yet hold the sequences an update waits for; generation resumes."""


def update(engine: Any, command: dict[str, Any]) -> dict[str, Any]:
    """One in-flight update; with ``when_in_flight`` (``sequences``, ``min_tokens``, ``eos``,
    ``max_new_tokens``, ``timeout_s``), only in a pause where at least that many sequences are
    being written and have at least ``min_tokens`` tokens: those are certain to straddle it.

    The condition is checked inside the pause (nothing moves there); until it holds, each pause ends
    without loading, and the trainer's broadcast simply waits for the one that loads.
    """
    tensors = (command["names"], command["shapes"], command["dtypes"])

    def announced() -> list[bytes]:  # the trainer's digests, the line after the broadcast
        return [bytes.fromhex(digest) for digest in json.loads(sys.stdin.readline())["digests"]]
    when = command.get("when_in_flight")
    load_s: list[float] = []
    straddling: list[str] = []

    def load(workers: Any) -> None:
        if when is not None:
            in_flight = workers.tokens_in_flight()
            straddling[:] = [
                request_id
                for request_id, (count, last) in in_flight.items()
                if when["min_tokens"] <= count < when["max_new_tokens"] and last != when["eos"]
            ]
            if len(straddling) < when["sequences"]:
                raise NotYet
        received_s = receive_checked(workers, *tensors, announced=announced)
        load_s.append(received_s + workers.load_received())

    deadline = time.monotonic() + (when or {}).get("timeout_s", 0)
    while True:
        try:
            pause_s = engine.update_weights(command["version"], load)
            break
        except BucketsRefused as refused:
            return {"refused": refused.buckets, "reason": refused.reason, "straddling": straddling}
        except NotYet:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"no pause within {when['timeout_s']} s found {when['sequences']} sequences in flight "
                    f"with {when['min_tokens']}+ tokens (the last had {len(straddling)})"
                ) from None
            time.sleep(0.005)
    return {
        "pause_s": pause_s,
        "receive_and_load_s": load_s[0],
        "phases_s": engine.last_update_s,
        "straddling": straddling,
    }


if __name__ == "__main__":
    main()
