"""Message numbers per stream: in order, gaps, replays, late joiners, a bounded memory."""

from __future__ import annotations

import pytest

from pipelinerl.platform.numbering import Gap, InOrder, Replay, StreamNumbers


def test_numbers_in_order_from_one_are_in_order_per_stream() -> None:
    numbers = StreamNumbers(expect_first=True)
    verdicts = [numbers.observe(stream, seq) for seq in (1, 2, 3) for stream in ("actor0", "actor1")]
    assert all(isinstance(verdict, InOrder) for verdict in verdicts)


def test_a_skipped_number_is_a_gap_that_names_what_never_arrived() -> None:
    numbers = StreamNumbers(expect_first=True)
    numbers.observe("p", 1)
    gap = numbers.observe("p", 5)
    assert gap == Gap("p", 2, 5) and gap.lost == 3
    assert gap.describe() == "3 message(s) of stream 'p' never arrived (#2..#4; #5 did)"
    assert isinstance(numbers.observe("p", 6), InOrder)
    assert Gap("p", 2, 3).describe() == "1 message(s) of stream 'p' never arrived (#2; #3 did)"


def test_a_pull_that_first_sees_a_stream_at_three_lost_one_and_two() -> None:
    assert StreamNumbers(expect_first=True).observe("p", 3) == Gap("p", 1, 3)


def test_a_subscriber_may_join_a_stream_late() -> None:
    numbers = StreamNumbers(expect_first=False)
    assert isinstance(numbers.observe("trainer", 40), InOrder)
    assert numbers.observe("trainer", 42) == Gap("trainer", 41, 42)


@pytest.mark.parametrize("seq", [1, 2, 3])
def test_a_number_not_above_the_last_is_a_replay_and_changes_nothing(seq: int) -> None:
    numbers = StreamNumbers(expect_first=True)
    for number in (1, 2, 3):
        numbers.observe("p", number)
    assert numbers.observe("p", seq) == Replay("p", seq, 3)
    assert isinstance(numbers.observe("p", 4), InOrder)


def test_streams_tracked_are_bounded_least_recent_dropped_first() -> None:
    numbers = StreamNumbers(expect_first=False, max_streams=3)
    for name in ("a", "b", "c"):
        numbers.observe(name, 1)
    numbers.observe("a", 2)  # a is now the most recent
    numbers.observe("d", 1)  # drops b
    assert isinstance(numbers.observe("a", 1), Replay)
    assert isinstance(numbers.observe("b", 1), InOrder), "b was forgotten: its numbers start afresh"
    with pytest.raises(ValueError, match="max_streams"):
        StreamNumbers(expect_first=True, max_streams=0)


def test_a_flood_of_invented_stream_names_never_drops_a_pinned_stream() -> None:
    """The run's own senders are pinned: however many names a stranger invents, an actor's next number
    is judged against its last one (unpinned, it would be forgotten and read as a gap from 1)."""
    numbers = StreamNumbers(expect_first=True, max_streams=8, pinned=["actor0"])
    for seq in range(1, 6):
        assert isinstance(numbers.observe("actor0", seq), InOrder)
    for index in range(1000):
        numbers.observe(f"invented-{index}", 7)
    assert isinstance(numbers.observe("actor0", 6), InOrder)
    assert numbers.observe("actor0", 3) == Replay("actor0", 3, 6)
    assert numbers.observe("actor0", 9) == Gap("actor0", 7, 9)
    unpinned = StreamNumbers(expect_first=True, max_streams=8)
    unpinned.observe("actor0", 1)
    for index in range(1000):
        unpinned.observe(f"invented-{index}", 7)
    assert unpinned.observe("actor0", 2) == Gap("actor0", 1, 2), "forgotten, then a false gap"
