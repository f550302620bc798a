"""Shared fixtures: tiny models built locally (no downloads) and isolated tool homes."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import psutil
import pytest
import torch
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from transformers import Qwen2Config, Qwen2ForCausalLM

from pipelinerl.launch.model_source import resolve_model
from pipelinerl.platform.config import load_config
from pipelinerl.platform.model_loading import serialise_model_loading
from pipelinerl.tasks.tokenizer import build_tokenizer
from tests.models import build_family_model_dir

# Fixtures that live in their own modules, for every test.
pytest_plugins = ["tests.side_effects", "tests.scheduling"]

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Tests load models in their own thread while a run's launcher loads in another (model_loading).
serialise_model_loading()

_TOOL_HOME = pytest.StashKey[Path]()

# The real PostgreSQL server the database tests use (``.ci/run`` makes sure it is up).
POSTGRES_URL = os.environ.get("PIPELINERL_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/postgres")


# Parallel test workers (pytest-xdist, ``make test`` runs two) each get their own block of the fixed
# ports the modules use (FIXED_PORTS): worker 1's block is worker 0's moved down by WORKER_PORT_SHIFT,
# so the two never meet and both stay below the ephemeral range (32768+), where the OS hands out
# the ports of ``bind(0)`` and of every outgoing connection (CI saw a restart test's port, once
# shifted up to 32980, taken that way).
FIXED_PORTS = range(21000, 29000)
WORKER_PORT_SHIFT = -8000
MAX_PORT_WORKERS = 2


def worker_port(port: int) -> int:
    """``port`` in this test worker's own range, so parallel workers never bind the same port."""
    if port not in FIXED_PORTS:
        raise ValueError(
            f"test port {port} is outside the fixed block {FIXED_PORTS.start}-{FIXED_PORTS.stop - 1}"
        )
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker.removeprefix("gw"))
    if index >= MAX_PORT_WORKERS:
        raise RuntimeError(
            f"test worker {worker!r}: the fixed port ranges support {MAX_PORT_WORKERS} workers "
            "(pytest -n 1 or -n 2)"
        )
    return port + WORKER_PORT_SHIFT * index


T = TypeVar("T")


def wait_until(condition: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.1) -> T:
    """The first truthy value of ``condition()``, polled every ``interval_s``; fails naming ``what``
    after ``timeout_s``. The one poll loop of the suite: a deadline is a bound on a hang, never a
    speed requirement, so give it room for a loaded machine."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(interval_s)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``gpu`` tests skip, saying why, where CUDA is absent (``pytest -m gpu`` on a GPU machine runs
    them). The suite's order is tests/scheduling.py's."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False here)")
    for item in gpu_items:
        item.add_marker(skip)


def free_port() -> int:
    """A port the kernel has just found free (from the ephemeral range), for a server bound at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def build_random_model_dir(path: Path, seed: int = 0, hidden_size: int = 64) -> Path:
    """A small random Qwen2 model with the task tokenizer, saved as a Hugging Face directory."""
    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_model_dir(tmp_path_factory.mktemp("random-model"))


def pytest_configure(config: pytest.Config) -> None:
    """Isolated tool homes, set before any test module is imported: Prefect reads ``PREFECT_HOME``
    once, when it is imported, so a fixture would come too late for a module importing it at its top.
    One home per process that runs tests (each xdist worker its own, not the controller, whose
    environment the workers inherit), removed when the session ends."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        return  # the xdist controller: it runs no test
    home = Path(tempfile.mkdtemp(prefix="pipelinerl-test-home-"))
    config.stash[_TOOL_HOME] = home
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    # Runs that do not name their own stores track into this session's, not the user's home.
    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{home / 'mlflow.db'}")
    os.environ.setdefault("PIPELINERL_DATABASE_URL", f"sqlite:///{home / 'platform.db'}")


def pytest_unconfigure(config: pytest.Config) -> None:
    home = config.stash.get(_TOOL_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="session")
def warm_model_dir() -> Path:
    """The embedded default model, warm-started exactly as ``pipelinerl run`` does.

    It shares the platform home's cache with ``make run`` (the cache key covers every setting and
    the code version), so the supervised phase runs at most once per machine.
    """
    return resolve_model(load_config())


@contextlib.contextmanager
def fresh_postgres_database() -> Iterator[str]:
    """A new database on the PostgreSQL server, dropped afterwards (skips if unreachable)."""
    admin = create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT", connect_args={"connect_timeout": 5})
    shown = make_url(POSTGRES_URL).render_as_string(hide_password=True)
    try:
        with admin.connect() as connection:
            connection.execute(text("SELECT 1"))
    except OperationalError as error:
        admin.dispose()
        pytest.skip(f"PostgreSQL at {shown} is unreachable: {str(error.orig).strip().splitlines()[0]}")
    name = f"pipelinerl_test_{uuid.uuid4().hex[:16]}"
    with admin.connect() as connection:
        connection.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(POSTGRES_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database for one test."""
    with fresh_postgres_database() as url:
        yield url


@pytest.fixture
def second_postgres_url() -> Iterator[str]:
    """Another fresh database (MLflow and the platform tables must not share one)."""
    with fresh_postgres_database() as url:
        yield url


def non_loopback_ipv4() -> str | None:
    """This machine's first IPv4 address that is not loopback (None if it has none)."""
    for addresses in psutil.net_if_addrs().values():
        for address in addresses:
            if address.family == socket.AF_INET and not address.address.startswith("127."):
                return address.address
    return None


@pytest.fixture(scope="session")
def qwen_style_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Qwen2 model with a Qwen-style tokenizer (no BOS, chat template, EOS list): models.py."""
    return build_family_model_dir(tmp_path_factory.mktemp("qwen-style") / "model", "qwen_style")


@pytest.fixture(scope="session")
def llama_style_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random Llama model with a Llama-3-style tokenizer (BOS, no pad, EOS list); see tests/models.py."""
    return build_family_model_dir(tmp_path_factory.mktemp("llama-style") / "model", "llama_style")
