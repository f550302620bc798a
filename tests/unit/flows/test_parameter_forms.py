"""The flows' parameter forms (Prefect renders them from the parameter schema): every config field
described, choices as dropdowns, bounds, and no description hiding a placeholder."""

from __future__ import annotations

import re

from prefect.utilities.callables import parameter_schema

from pipelinerl.flows.compare import compare
from pipelinerl.flows.plan_flow import plan
from pipelinerl.flows.rl_run import rl_run
from pipelinerl.flows.sweep import sweep


def test_parameter_form_shows_config_fields_with_descriptions():
    schema = parameter_schema(rl_run).model_dump()
    definitions = schema["definitions"]
    run_section = definitions["RunConfig"]["properties"]
    assert run_section["mode"]["enum"] == ["pipeline", "conventional", "async"]  # a dropdown
    assert "in-flight" in run_section["mode"]["description"]
    assert run_section["max_steps"]["minimum"] == 1
    rl_section = definitions["RLConfig"]["properties"]
    assert rl_section["group_size"]["description"].startswith("Samples per prompt")
    assert set(definitions["PipelineConfig"]["properties"]) >= {
        "run",
        "model",
        "actor",
        "rl",
        "trainer",
        "tracking",
    }
    for section in ("RunConfig", "ActorConfig", "RLConfig", "TrainerConfig", "TrackingConfig"):
        for name, field in definitions[section]["properties"].items():
            assert field.get("description"), f"{section}.{name} has no description"


def test_every_form_parameter_is_described_and_no_description_hides_a_placeholder():
    """Prefect's form renders descriptions as markdown, where ``<run-id>`` is swallowed as a tag."""
    for flow in (rl_run, compare, sweep, plan):
        schema = parameter_schema(flow).model_dump()
        for name, parameter in schema["properties"].items():
            assert parameter.get("description"), f"{flow.name}: parameter {name} has no description"
        sections = [schema["properties"], *(d.get("properties", {}) for d in schema["definitions"].values())]
        for properties in sections:
            for name, field in properties.items():
                text = field.get("description", "")
                assert not re.search(r"<[A-Za-z][\w-]*>", text), f"{flow.name}: {name}: {text!r}"
    assert parameter_schema(compare).model_dump()["properties"]["modes"]["minItems"] == 2


def test_the_plan_form_offers_the_modes_and_the_shipped_profile() -> None:
    properties = parameter_schema(plan).model_dump()["properties"]
    assert properties["modes"]["items"]["enum"] == ["pipeline", "conventional", "async", "colocated"]
    assert properties["profile"]["default"] == "h100-7b" and properties["prompt_tokens"]["minimum"] == 0
