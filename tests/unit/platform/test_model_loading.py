"""Two threads loading models at once leave transformers whole once loading is serialised."""

from __future__ import annotations

import threading
from pathlib import Path

from transformers import AutoModelForCausalLM, PreTrainedModel

from pipelinerl.platform.model_loading import serialise_model_loading


def test_concurrent_loads_leave_weight_tying_in_place(random_model_dir: Path) -> None:
    """Without the lock this leaves ``PreTrainedModel.tie_weights`` a stub (transformers 5.19)."""
    serialise_model_loading()
    serialise_model_loading()  # idempotent
    tie_weights, init_weights = PreTrainedModel.tie_weights, PreTrainedModel.init_weights
    errors: list[BaseException] = []

    def load() -> None:
        try:
            for _ in range(40):
                AutoModelForCausalLM.from_pretrained(random_model_dir)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=load) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors
    assert PreTrainedModel.tie_weights is tie_weights and PreTrainedModel.init_weights is init_weights
    model = AutoModelForCausalLM.from_pretrained(random_model_dir)
    assert all(parameter.device.type == "cpu" for parameter in model.parameters())
