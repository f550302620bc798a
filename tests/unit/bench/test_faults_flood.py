"""What ``bench faults`` sends in one set of impossible rollouts (pure: frames recorded, not sent)."""

from __future__ import annotations

from pipelinerl.bench.faults import Flood, _send_impossible
from pipelinerl.platform.wire import Envelope, Rollout, decode_numbered


class RecordingSocket:
    """Stands in for the flood's ZeroMQ socket: keeps what it is given."""

    def __init__(self) -> None:
        self.sent: list[list[bytes]] = []

    def send_multipart(self, frames: list[bytes]) -> None:
        self.sent.append(frames)

    def rollouts(self) -> list[tuple[Envelope, Rollout]]:
        decoded = [decode_numbered(frames) for frames in self.sent]
        assert all(isinstance(message, Rollout) for _, message in decoded)
        return [(envelope, message) for envelope, message in decoded if isinstance(message, Rollout)]


def test_an_impossible_set_goes_out_with_its_out_of_vocabulary_groups_first_numbered_in_order() -> None:
    """The four complete groups with a token outside the vocabulary are what the preprocessor batches
    and the trainer must refuse; first in line, they are read within a batch of the flood's start."""
    socket, flood = RecordingSocket(), Flood()
    last = _send_impossible(socket, "run", ["p0", "p1"], 0, flood)
    sent = socket.rollouts()
    assert last == len(sent) == flood.impossible == 316
    assert flood.outside_vocabulary == 16
    assert [envelope.seq for envelope, _ in sent] == list(range(1, 317))
    assert {envelope.stream for envelope, _ in sent} == {"impossible"}
    rollouts = [rollout for _, rollout in sent]
    assert all(rollout.group_id.startswith("stranger-oov-") for rollout in rollouts[:16])
    assert all(int(rollout.completion_token_ids.max()) >= 10**6 for rollout in rollouts[:16])
    assert not any(rollout.group_id.startswith("stranger-oov-") for rollout in rollouts[16:])
    # The next set goes on numbering the stream, and its rollouts are new ones.
    again = RecordingSocket()
    assert _send_impossible(again, "run", ["p0", "p1"], last, flood) == 2 * 316
    later = again.rollouts()
    assert later[0][0].seq == 317 and later[0][1].group_id.startswith("stranger-oov-")
    assert not {r.rollout_id for _, r in later} & {r.rollout_id for r in rollouts}
    assert flood.outside_vocabulary == 32
