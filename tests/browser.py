"""A real headless browser for the tests of web pages: Debian's chromium through chromium-driver
(selenium). Tests that need one skip, saying what to install, where the machine lacks it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service


@contextmanager
def headless_chromium(window: str = "1400,2300") -> Iterator[Any]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.skip(
            "the browser tests need Debian's chromium and chromium-driver "
            "(sudo apt-get install -y chromium chromium-driver)"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the dev extra")

    options = Options()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--window-size={window}",
    ):
        options.add_argument(argument)
    session = webdriver.Chrome(options=options, service=Service(driver))
    session.set_page_load_timeout(60)
    try:
        yield session
    finally:
        session.quit()


REPOSITORY = Path(__file__).resolve().parents[1]


def screenshot_dir(name: str) -> Path:
    """Where a browser test saves its screenshots: ``$PIPELINERL_TEST_ARTIFACTS/<name>`` (default
    ``.cache/test-artifacts/<name>`` in the repository, git-ignored), made if missing."""
    root = Path(os.environ.get("PIPELINERL_TEST_ARTIFACTS", REPOSITORY / ".cache" / "test-artifacts"))
    directory = root / name
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def trace_count(browser: Any, element_id: str) -> int:
    """How many traces the Plotly chart ``element_id`` of the page draws (0 before it is drawn)."""
    script = f"const e = document.getElementById('{element_id}'); return e && e.data ? e.data.length : 0;"
    return int(browser.execute_script(script))
