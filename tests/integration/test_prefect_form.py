"""Prefect's run form for ``rl-run``, in a real headless browser against a real Prefect server: a
cross-field mistake is shown under the field to change, in words, and no flow run is created; a good
change is submitted. The rules come from the flow's parameter schema (``config/base.requires_when``,
``multiple_of_field``), which Prefect's form validates on submit.

Screenshots go to ``$PIPELINERL_TEST_ARTIFACTS/prefect-form`` (default ``.cache/test-artifacts``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.browser import headless_chromium
from tests.conftest import worker_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PORT = worker_port(28240)
REPOSITORY = Path(__file__).resolve().parents[2]
PAGE_TIMEOUT_S = 120  # the form renders the whole config schema; slow on a loaded 2-core machine


@pytest.fixture(scope="module")
def prefect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prefect server with its UI (``prefect server start``), on its own SQLite database."""
    home = tmp_path_factory.mktemp("prefect-home")
    url = f"http://127.0.0.1:{PORT}"
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"{url}/api",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home / 'prefect.db'}",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    }
    log = (home / "server.log").open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(PORT)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/health", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"the Prefect server did not start:\n{(home / 'server.log').read_text()[-3000:]}"
                    )
                time.sleep(1)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


@pytest.fixture(scope="module")
def deployment_id(prefect_url: str) -> str:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from pipelinerl.flows.rl_run import rl_run

    with temporary_settings(updates={PREFECT_API_URL: f"{prefect_url}/api"}):
        return str(rl_run.to_deployment(name="form-check").apply())


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with headless_chromium(window="1400,2400") as session:
        yield session


@pytest.fixture(scope="module")
def artifacts() -> Path:
    root = Path(os.environ.get("PIPELINERL_TEST_ARTIFACTS", REPOSITORY / ".cache" / "test-artifacts"))
    directory = root / "prefect-form"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def flow_runs(prefect_url: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    async def read() -> list[Any]:
        async with get_client() as client:
            return await client.read_flow_runs()

    with temporary_settings(updates={PREFECT_API_URL: f"{prefect_url}/api"}):
        return anyio.run(read)


def field(browser: Any, label: str, description: str) -> Any:
    """The form property labelled ``label`` whose description is ``description`` (labels repeat across
    sections): its element, the one holding its input and its error."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions
    from selenium.webdriver.support.ui import WebDriverWait

    header = "./div[contains(@class,'p-label__header')]"
    xpath = (
        "//div[contains(@class,'schema-form-property')]"
        f"[{header}//span[normalize-space()='{label} (Optional)']]"
        f'[{header}//div[normalize-space()="{description}"]]'
    )
    WebDriverWait(browser, PAGE_TIMEOUT_S).until(
        expected_conditions.presence_of_element_located((By.XPATH, xpath))
    )
    (element,) = browser.find_elements(By.XPATH, xpath)
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", element)
    return element


def type_into(element: Any, text: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    control = element.find_element(By.XPATH, "./div[contains(@class,'p-label__body')]//input")
    control.send_keys(Keys.CONTROL, "a")
    control.send_keys(text)


def submit(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    (button,) = browser.find_elements(By.XPATH, "//button[normalize-space()='Submit']")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
    button.click()


def wait_for_text(element: Any, text: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in element.text:
        if time.monotonic() > deadline:
            raise AssertionError(f"{text!r} never appeared under the field; it shows {element.text!r}")
        time.sleep(0.5)


BATCH = ("Batch Size", "B: sequences per optimizer step.")
TENSOR_PARALLEL = (
    "Tensor Parallel Size",
    "vllm engine: GPUs (workers) per actor. Each worker joins the weight group, receives the full tensors "
    "and lets vLLM shard them.",
)
ENGINE = (
    "Engine",
    "Inference engine: transformers (in this environment, CPU) or vllm (its own environment, make vllm-env). "
    "tensor_parallel_size above 1, kv_cache_on_update=recompute and eval.greedy need vllm.",
)


@pytest.mark.parametrize(
    ("changed", "value", "shown_under", "message"),
    [
        (BATCH, "30", BATCH, "30 is not a multiple of 4"),  # rl.batch_size by rl.group_size
        (TENSOR_PARALLEL, "2", ENGINE, "'vllm' was expected"),  # a rule across two sections
    ],
    ids=["divisibility", "engine"],
)
def test_a_cross_field_mistake_is_shown_under_the_field_and_nothing_runs(
    prefect_url: str,
    deployment_id: str,
    browser: Any,
    artifacts: Path,
    changed: tuple[str, str],
    value: str,
    shown_under: tuple[str, str],
    message: str,
    request: pytest.FixtureRequest,
) -> None:
    before = len(flow_runs(prefect_url))
    browser.get(f"{prefect_url}/deployments/deployment/{deployment_id}/run")
    type_into(field(browser, *changed), value)
    submit(browser)
    where = field(browser, *shown_under)
    wait_for_text(where, message)
    browser.save_screenshot(str(artifacts / f"{request.node.callspec.id}.png"))
    assert "/run" in browser.current_url, "the form left its page: the run was submitted"
    time.sleep(2)  # a submission that slipped through would create its flow run by now
    assert len(flow_runs(prefect_url)) == before


def test_a_good_change_is_submitted_with_its_value(
    prefect_url: str, deployment_id: str, browser: Any
) -> None:
    """The control: the same form, a valid change, and the flow run carries it."""
    browser.get(f"{prefect_url}/deployments/deployment/{deployment_id}/run")
    type_into(field(browser, *BATCH), "64")
    submit(browser)
    deadline = time.monotonic() + 60
    while not (runs := flow_runs(prefect_url)):
        assert time.monotonic() < deadline, "no flow run was created for a valid form"
        time.sleep(1)
    (run,) = runs
    assert run.parameters["config"]["rl"]["batch_size"] == 64
