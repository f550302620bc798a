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
peer inventing stream names cannot grow a receiver's memory. The streams a receiver expects (``pinned``:
the run's own senders) are never dropped: a flood of invented names must not make a real stream's
next number look like a gap from 1.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection
from dataclasses import dataclass

DEFAULT_MAX_STREAMS = 1024


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
    """The last number seen of each stream (at most ``max_streams`` streams)."""

    def __init__(
        self, *, expect_first: bool, max_streams: int = DEFAULT_MAX_STREAMS, pinned: Collection[str] = ()
    ) -> None:
        if max_streams < 1:
            raise ValueError(f"max_streams must be >= 1, got {max_streams}")
        self.expect_first = expect_first
        self.max_streams = max_streams
        self.pinned = frozenset(pinned)
        self._last: OrderedDict[str, int] = OrderedDict()  # streams not pinned, least recently seen first
        self._pinned_last: dict[str, int] = {}

    def observe(self, stream: str, seq: int) -> Verdict:
        """Judge message ``seq`` of ``stream``; a replay leaves the record unchanged."""
        record = self._pinned_last if stream in self.pinned else self._last
        last = record.get(stream)
        if last is None:
            last = 0 if self.expect_first else seq - 1
        elif seq <= last:
            if record is self._last:
                self._last.move_to_end(stream)
            return Replay(stream, seq, last)
        record[stream] = seq
        if record is self._last:
            self._last.move_to_end(stream)
            while len(self._last) > self.max_streams:
                self._last.popitem(last=False)
        if seq == last + 1:
            return InOrder(stream, seq)
        return Gap(stream, last + 1, seq)
