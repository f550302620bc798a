"""The exchange between an actor's two threads when the trainer role restarts
(``workers/rebase_handshake.py``): real threads, the launcher's notice a real file."""

from __future__ import annotations

import threading
from pathlib import Path

from pipelinerl.platform.rebase import Rebase, write_rebase
from pipelinerl.workers.rebase_handshake import RebaseHandshake


def test_the_weights_thread_asks_the_main_thread_pauses_and_the_lineages_weights_end_it(
    tmp_path: Path,
) -> None:
    handshake = RebaseHandshake(tmp_path, enabled=True)
    assert handshake.new() is None
    write_rebase(tmp_path, Rebase(attempt=1, version=4, checkpoint=None))
    rebase = handshake.new()
    assert rebase is not None and rebase.version == 4
    asked: list[bool] = []
    weights = threading.Thread(target=lambda: asked.append(handshake.ask(rebase, lambda: False)))
    weights.start()
    while handshake.request is None:  # the main thread sees the request at the top of its loop
        weights.join(0.01)
    assert weights.is_alive(), "the weights thread waits for the main thread's answer"
    handshake.answered()
    weights.join(5)
    assert asked == [True] and handshake.request is None and handshake.new() is None
    assert handshake.ends_pause(4) and not handshake.ends_pause(5) and not handshake.resumed()
    handshake.loaded(5)  # not the lineage's weights
    assert not handshake.resumed()
    handshake.loaded(4)
    assert handshake.resumed() and not handshake.ends_pause(4)


def test_a_stopped_actor_stops_waiting_and_a_process_started_after_a_notice_ignores_it(
    tmp_path: Path,
) -> None:
    write_rebase(tmp_path, Rebase(attempt=2, version=6, checkpoint=None))
    assert RebaseHandshake(tmp_path, enabled=True).new() is None  # older than this process
    assert RebaseHandshake(tmp_path, enabled=False).new() is None
    handshake = RebaseHandshake(tmp_path, enabled=True)
    write_rebase(tmp_path, Rebase(attempt=3, version=6, checkpoint=None))
    rebase = handshake.new()
    assert rebase is not None and not handshake.ask(rebase, lambda: True)
