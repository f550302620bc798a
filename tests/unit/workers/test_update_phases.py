"""An update pause taken apart: the phases add up to the pause, the receiving is split out of the
engine's load only where it happened inside the pause."""

from __future__ import annotations

import pytest

from pipelinerl.workers.update_phases import update_phases


def test_receiving_inside_the_pause_is_taken_out_of_the_load() -> None:
    engine = {"pause": 0.002, "load": 0.050, "label_resume": 0.001}
    fields = update_phases(engine, 0.030, received_in_pause=True)
    assert fields["weights/update_phase_ms/receive"] == pytest.approx(30.0)
    assert fields["weights/update_phase_ms/load"] == pytest.approx(20.0)
    phases = [value for key, value in fields.items() if key.startswith("weights/update_phase_ms/")]
    assert sum(phases) == pytest.approx(1000 * sum(engine.values()))
    assert fields["weights/receive_ms"] == pytest.approx(30.0)


def test_receiving_before_the_pause_is_not_a_phase_of_it() -> None:
    engine = {"pause": 0.004, "load": 0.010, "label_resume": 0.002}
    fields = update_phases(engine, 0.5, received_in_pause=False)
    assert "weights/update_phase_ms/receive" not in fields
    assert fields["weights/update_phase_ms/load"] == pytest.approx(10.0)
    assert fields["weights/receive_ms"] == pytest.approx(500.0)


def test_a_receive_timed_longer_than_the_load_never_makes_a_negative_phase() -> None:
    fields = update_phases({"load": 0.010}, 0.011, received_in_pause=True)
    assert fields["weights/update_phase_ms/load"] == 0.0
    assert fields["weights/update_phase_ms/receive"] == pytest.approx(10.0)
