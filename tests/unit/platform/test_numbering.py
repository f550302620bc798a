"""Message numbers per stream: in order, gaps, replays, late joiners, a bounded memory, pinning by
sender name."""

from __future__ import annotations

import pytest

from pipelinerl.platform.numbering import (
    MAX_INCARNATIONS,
    Gap,
    InOrder,
    Replay,
    StreamNumbers,
    actor_sender,
    sender_of,
)


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


# An actor's stream as ``transport.Sender`` names it: its sender name, its pid, a random suffix.
ACTOR0 = f"{actor_sender(0)}/4242/9f2a1c"


def test_a_flood_of_invented_stream_names_never_drops_a_pinned_stream() -> None:
    """The run's own senders are pinned by sender name: however many names a stranger invents, an
    actor's next number is judged against its last one (unpinned, it would be forgotten and read as a
    gap from 1)."""
    numbers = StreamNumbers(expect_first=True, max_streams=8, pinned=[actor_sender(0)])
    for seq in range(1, 6):
        assert isinstance(numbers.observe(ACTOR0, seq), InOrder)
    for index in range(1000):
        numbers.observe(f"invented-{index}", 7)
    assert isinstance(numbers.observe(ACTOR0, 6), InOrder)
    assert numbers.observe(ACTOR0, 3) == Replay(ACTOR0, 3, 6)
    assert numbers.observe(ACTOR0, 9) == Gap(ACTOR0, 7, 9)
    unpinned = StreamNumbers(expect_first=True, max_streams=8)
    unpinned.observe(ACTOR0, 1)
    for index in range(1000):
        unpinned.observe(f"invented-{index}", 7)
    assert unpinned.observe(ACTOR0, 2) == Gap(ACTOR0, 1, 2), "forgotten, then a false gap"


@pytest.mark.parametrize(
    ("stream", "pinned"),
    [
        (ACTOR0, True),
        ("actor0", True),
        ("actor1/4242/9f2a1c", True),
        ("actor01/4242/9f2a1c", False),  # another sender name, not a prefix match
        ("xactor0/1/2", False),
        ("trainer/1/2", False),
        ("/actor0/1", False),
    ],
)
def test_a_stream_is_pinned_by_its_sender_name(stream: str, pinned: bool) -> None:
    numbers = StreamNumbers(expect_first=True, pinned=[actor_sender(0), actor_sender(1)])
    assert numbers.is_pinned(stream) is pinned


def test_a_restarted_actor_is_a_new_pinned_stream_from_one_not_a_replay() -> None:
    """A restarted actor (new pid) starts its numbers at 1 again under a new stream of the same sender:
    in order, pinned, while its dead incarnation's record is kept apart."""
    numbers = StreamNumbers(expect_first=True, max_streams=4, pinned=[actor_sender(0)])
    for seq in range(1, 101):
        numbers.observe(ACTOR0, seq)
    restarted = f"{actor_sender(0)}/5151/0b7e33"
    assert numbers.observe(restarted, 1) == InOrder(restarted, 1)
    assert numbers.observe(restarted, 2) == InOrder(restarted, 2)
    assert sorted(numbers.pinned_streams()) == sorted([ACTOR0, restarted])
    for index in range(100):  # strangers' streams never push either out
        numbers.observe(f"invented-{index}", 1)
    assert numbers.observe(restarted, 2) == Replay(restarted, 2, 2)


def test_a_pinned_sender_keeps_its_newest_incarnations_only() -> None:
    """Bounded also for a holder of the run's keys inventing streams under a pinned name: the least
    recently seen incarnations go first, and the unpinned table is untouched."""
    numbers = StreamNumbers(expect_first=True, max_streams=4, pinned=[actor_sender(0)])
    numbers.observe("stranger", 1)
    streams = [f"{actor_sender(0)}/{pid}/000000" for pid in range(MAX_INCARNATIONS + 5)]
    for stream in streams:
        numbers.observe(stream, 3)
    assert numbers.pinned_streams() == streams[-MAX_INCARNATIONS:]
    assert isinstance(numbers.observe("stranger", 1), Replay), "the unpinned table kept its stream"
    assert numbers.observe(streams[0], 4) == Gap(streams[0], 1, 4), "the oldest incarnation was dropped"


@pytest.mark.parametrize("name", ["actor0/1", "", "a/b"])
def test_a_pinned_sender_name_has_no_slash(name: str) -> None:
    with pytest.raises(ValueError, match="part before its first '/'"):
        StreamNumbers(expect_first=True, pinned=[name])


def test_sender_of_is_the_part_before_the_first_slash() -> None:
    assert sender_of(ACTOR0) == "actor0"
    assert sender_of("trainer") == "trainer"
