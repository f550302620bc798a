"""The launcher's tails of the prompt records: the hand-outs read on across a restart (an actor that
outlived it has written its kept groups since the last read), the drops go on from the files the
restart rewrote."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelinerl.launch.launcher import RecordTails
from pipelinerl.platform.prompt_records import dropped_prompts_path, handed_out_path, trainer_dropped_path


class Collected:
    """A sink that keeps what it is handed."""

    def __init__(self) -> None:
        self.handouts: list[tuple[int, dict[str, Any]]] = []
        self.drops: list[dict[str, Any]] = []

    def trainer_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def actor_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def preprocessor_records(self, records: Sequence[dict[str, Any]]) -> None: ...
    def eval_records(self, records: Sequence[dict[str, Any]]) -> None: ...

    def handout_records(self, actor_id: int, records: Sequence[dict[str, Any]]) -> None:
        self.handouts += [(actor_id, record) for record in records]

    def drop_records(self, records: Sequence[dict[str, Any]]) -> None:
        self.drops += records


def append(path: Path, *records: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        handle.writelines(json.dumps(record) + "\n" for record in records)


def test_hand_outs_are_read_on_across_a_restart_and_drops_from_the_rewritten_files(tmp_path: Path) -> None:
    tails, sink = RecordTails(tmp_path, num_actors=2, trainer_ranks=2), Collected()
    append(handed_out_path(tmp_path, 1), {"position": 0, "group_id": "a1-p0-1a", "started_at": 1.0})
    append(dropped_prompts_path(tmp_path), {"group_id": "a1-p0-1a", "reason": "stale", "step": 3})
    append(trainer_dropped_path(tmp_path, 1), {"group_id": "a1-p1-1a", "policy_version": 4})
    tails.read(sink)
    assert [actor for actor, _ in sink.handouts] == [1]
    assert [drop["group_id"] for drop in sink.drops] == ["a1-p0-1a", "a1-p1-1a"]

    # The restart: the actor that outlived it records its kept group; the drops of the discarded
    # versions are set aside (the files rewritten shorter), then the tails rewind.
    append(
        handed_out_path(tmp_path, 1), {"position": 5, "group_id": "a1-p5-1a", "started_at": 2.0, "kept": True}
    )
    dropped_prompts_path(tmp_path).write_text("")
    tails.rewind(2)
    append(dropped_prompts_path(tmp_path), {"group_id": "a1-p6-2b", "reason": "zero_variance", "step": 2})
    tails.read(sink)
    assert [record["group_id"] for _, record in sink.handouts] == ["a1-p0-1a", "a1-p5-1a"]
    assert [drop["group_id"] for drop in sink.drops] == ["a1-p0-1a", "a1-p1-1a", "a1-p6-2b"]
