"""``bench recipes``' pure parts: the recipes as variants (each a config the platform accepts), and
the figures read from a run's trainer records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelinerl.bench.recipes import RECIPES, REFERENCE, add_recipe_figures, recipe_figures, recipe_variants
from pipelinerl.platform.config import load_config, with_overrides


def test_every_recipe_is_a_config_the_platform_accepts_in_pipeline_mode() -> None:
    chosen = recipe_variants(list(RECIPES))
    assert [variant.label for variant in chosen] == list(RECIPES)
    for variant in chosen:
        config = with_overrides(load_config(), variant.overrides)
        assert config.run.mode == "pipeline"
    assert with_overrides(load_config(), chosen[-1].overrides).rl.kl.coef > 0


def test_the_reference_runs_first_whether_named_or_not() -> None:
    assert [variant.label for variant in recipe_variants(["gspo", "cispo"])] == [REFERENCE, "gspo", "cispo"]


def test_an_unknown_recipe_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="unknown recipe\\(s\\) grpo; valid: truncated_is, "):
        recipe_variants(["gspo", "grpo"])


def test_figures_are_means_over_the_steps_and_absent_terms_stay_absent() -> None:
    records = [
        {
            "rl/clipped_fraction": 0.1,
            "rl/clipped_low_fraction": 0.0,
            "rl/clipped_high_fraction": 0.1,
            "trainer/step_s": 1.0,
        },
        {
            "rl/clipped_fraction": 0.3,
            "rl/clipped_low_fraction": 0.1,
            "rl/clipped_high_fraction": 0.2,
            "trainer/step_s": 2.0,
        },
    ]
    figures = recipe_figures(records)
    assert figures["clipped_fraction"] == pytest.approx(0.2)
    assert figures["clipped_low_fraction"] == pytest.approx(0.05) and figures["step_s"] == pytest.approx(1.5)
    assert figures["kl_mean"] is None, "no KL term, no KL figure"


def test_each_variant_row_gets_its_runs_figures(tmp_path: Path) -> None:
    runs = []
    for label, seed, kl in (("truncated_is_kl", 0, 0.01), ("truncated_is_kl", 1, 0.03), ("gspo", 0, None)):
        run_dir = tmp_path / f"{label}-{seed}"
        run_dir.mkdir()
        record = {"rl/clipped_fraction": 0.5, "trainer/step_s": 1.0} | ({"rl/kl_mean": kl} if kl else {})
        (run_dir / "metrics.jsonl").write_text(json.dumps(record) + "\n")
        runs.append({"label": label, "seed": seed, "run_dir": str(run_dir)})
    report = {"details": {"runs": runs, "variants": [{"variant": "truncated_is_kl"}, {"variant": "gspo"}]}}
    rows = {row["variant"]: row for row in add_recipe_figures(report)["details"]["variants"]}
    assert rows["truncated_is_kl"]["kl_mean"] == pytest.approx(0.02) and rows["gspo"]["kl_mean"] is None
    assert rows["gspo"]["clipped_fraction"] == 0.5
