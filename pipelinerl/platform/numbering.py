"""Message numbers per sending stream: what a receiver learns from them (no I/O here).

Every socket that sends stamps its messages 1, 2, 3, ... under a stream name of its own
(``wire.Envelope``). A receiver feeds each envelope to ``StreamNumbers.observe`` and gets one of:

* ``InOrder``: the next number of its stream (or the first one seen, see ``expect_first``);
* ``Gap``: numbers were skipped: that many messages of the stream never arrived here;
* ``Replay``: a number not above the last one seen: a duplicate, or a peer replaying old messages.

``expect_first``: a PULL receiver sees a stream from its first message, so a stream that starts at
5 lost 1..4. A SUB receiver may join a stream late (ZeroMQ's slow joiner), so its first number counts
from wherever it starts.

The number of streams tracked is bounded (``max_streams``, least recently seen dropped first), so a
peer inventing stream names cannot grow a receiver's memory.

Pinning by sender name: a stream is named ``<sender>/<pid>/<random>`` (``transport.Sender``: one
stream per socket, so a restarted stage, with a new pid, sends a new stream that starts at 1 again
and is no replay). A receiver is told the *sender names* of the run's own stages (``pinned``, e.g.
``actor0``); every stream whose part before the first ``/`` is one of them is pinned: kept apart from
the bounded table, so a flood of invented names cannot push it out and make its next number look like
a gap from 1, and its gaps are the run's own losses (``is_pinned``). Only peers that passed the run's
CurveZMQ handshake can send at all (``transport``), so only a holder of the run's keys could invent
streams under a pinned name; even so each pinned name keeps at most ``MAX_INCARNATIONS`` streams
(least recently seen dropped first: a restarted stage's dead incarnations go first).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

DEFAULT_MAX_STREAMS = 1024
# Streams kept per pinned sender name: one per incarnation of the stage (a restart makes a new one),
# far more than a run's restarts keep alive at once; the bound only matters against a key holder.
MAX_INCARNATIONS = 8


def actor_sender(actor_id: int) -> str:
    """The sender name of actor ``actor_id``'s rollout stream: the actor sends under it, the
    preprocessor pins it (one place, so the two cannot drift apart)."""
    return f"actor{actor_id}"


def sender_of(stream: str) -> str:
    """The sender name of ``stream``: its part before the first ``/`` (``actor0`` of ``actor0/41/9f2a1c``)."""
    return stream.split("/", 1)[0]


@dataclass(frozen=True)
class InOrder:
    stream: str
    seq: int


@dataclass(frozen=True)
class Gap:
    """Messages ``first_missing`` .. ``seq - 1`` of ``stream`` never arrived."""

    stream: str
    first_missing: int
    seq: int

    @property
    def lost(self) -> int:
        return self.seq - self.first_missing

    def describe(self) -> str:
        missing = f"#{self.first_missing}" if self.lost == 1 else f"#{self.first_missing}..#{self.seq - 1}"
        return f"{self.lost} message(s) of stream {self.stream!r} never arrived ({missing}; #{self.seq} did)"


@dataclass(frozen=True)
class Replay:
    """Message ``seq`` of ``stream`` came again, or after a later one (``last``)."""

    stream: str
    seq: int
    last: int

    def describe(self) -> str:
        return (
            f"message #{self.seq} of stream {self.stream!r} arrived after #{self.last}: a duplicate or replay"
        )


Verdict = InOrder | Gap | Replay


class StreamNumbers:
    """The last number seen of each stream (at most ``max_streams`` unpinned streams, and at most
    ``MAX_INCARNATIONS`` streams per pinned sender name)."""

    def __init__(
        self, *, expect_first: bool, max_streams: int = DEFAULT_MAX_STREAMS, pinned: Collection[str] = ()
    ) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        for name in pinned:
            if not name or "/" in name:
                raise ValueError(
                    f"a pinned sender name is a stream's part before its first '/', got {name!r}"
                )
        self.expect_first = expect_first
        self.max_streams = max_streams
        self.pinned = frozenset(pinned)  # sender names
        self._last: OrderedDict[str, int] = OrderedDict()  # streams not pinned, least recently seen first
        # Per pinned sender name, its streams (incarnations), least recently seen first.
        self._pinned_last: dict[str, OrderedDict[str, int]] = {name: OrderedDict() for name in self.pinned}

    def is_pinned(self, stream: str) -> bool:
        """Whether ``stream`` belongs to one of the run's own senders (its sender name is pinned)."""
        return sender_of(stream) in self.pinned

    def pinned_streams(self) -> list[str]:
        """The pinned streams tracked now (each incarnation of each pinned sender seen)."""
        return [stream for streams in self._pinned_last.values() for stream in streams]

    def observe(self, stream: str, seq: int) -> Verdict:
        """Judge message ``seq`` of ``stream``; a replay leaves the record unchanged."""
        pinned = self._pinned_last.get(sender_of(stream))
        record, bound = (self._last, self.max_streams) if pinned is None else (pinned, MAX_INCARNATIONS)
        last = record.get(stream)
        if last is None:
            last = 0 if self.expect_first else seq - 1
        elif seq <= last:
            record.move_to_end(stream)
            return Replay(stream, seq, last)
        record[stream] = seq
        record.move_to_end(stream)
        while len(record) > bound:
            record.popitem(last=False)
        if seq == last + 1:
            return InOrder(stream, seq)
        return Gap(stream, last + 1, seq)
