"""The dashboard application: the pages, the JSON API and the static files, served on 127.0.0.1.

``create_app(settings)`` builds it (tests and other servers mount it as is); ``serve(settings, port)``
runs it under uvicorn until interrupted. The charts are drawn by plotly.js from the ``plotly``
package's own bundle, served at ``/static/plotly.min.js``: nothing is fetched from the internet, and
FastAPI's interactive ``/docs`` (which loads Swagger UI from a CDN) is off; ``/openapi.json`` stays.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import plotly
import uvicorn
from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from pipelinerl.platform.tracking.db import database_url as configured_database_url
from pipelinerl.platform.tracking.mlflow_store import mlflow_uri as configured_mlflow_uri
from pipelinerl.ui import api, pages
from pipelinerl.ui.mlflow_reader import MlflowReader
from pipelinerl.ui.queries import PlatformReader
from pipelinerl.ui.service import Dashboard

if TYPE_CHECKING:
    from pipelinerl.platform.config import PipelineConfig

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8300
# Where ``pipelinerl up`` serves the Prefect and MLflow UIs (flows/stack.py), for the run links.
DEFAULT_PREFECT_UI_PORT = 4200
DEFAULT_MLFLOW_UI_PORT = 5000
STATIC_DIR = Path(__file__).parent / "static"


@dataclass(frozen=True)
class UiSettings:
    """Where the dashboard reads from and what it links to."""

    database_url: str
    mlflow_uri: str | None = None  # None: no MLflow metrics (stage throughput, evals) and no links
    mlflow_ui_url: str | None = None  # MLflow's UI for the run links
    prefect_ui_url: str | None = None  # Prefect's UI for the flow-run links
    poll_interval_s: float = 3.0  # how often the pages refresh
    plans_home: Path | None = None  # the platform home whose plans/ the Plan page reads; None: no plans


def settings_from_config(
    config: PipelineConfig,
    *,
    database_url: str | None = None,
    mlflow_uri: str | None = None,
    mlflow_ui_url: str | None = None,
    prefect_ui_url: str | None = None,
) -> UiSettings:
    """The settings for a run configuration's stores (``tracking.database_url`` / ``mlflow_uri``, their
    environment variables, else the platform home), each overridable. The links go to the UIs that
    ``pipelinerl up`` starts unless told otherwise: MLflow's is the tracking server itself when the
    store is one (http...), Prefect's is ``$PREFECT_UI_URL``. The Plan page's plans are those under
    ``run.home``."""
    tracking_uri = mlflow_uri or configured_mlflow_uri(config)
    if mlflow_ui_url is None:
        is_server = tracking_uri.startswith(("http://", "https://"))
        mlflow_ui_url = tracking_uri if is_server else f"http://{DEFAULT_HOST}:{DEFAULT_MLFLOW_UI_PORT}"
    return UiSettings(
        database_url=database_url or configured_database_url(config),
        mlflow_uri=tracking_uri,
        mlflow_ui_url=mlflow_ui_url,
        prefect_ui_url=prefect_ui_url
        or os.environ.get("PREFECT_UI_URL")
        or f"http://{DEFAULT_HOST}:{DEFAULT_PREFECT_UI_PORT}",
        plans_home=config.run.home,
    )


def plotly_bundle() -> Path:
    """plotly.js as the ``plotly`` Python package ships it (the same file ``plotly.offline`` inlines)."""
    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def create_app(settings: UiSettings) -> FastAPI:
    database = PlatformReader(settings.database_url)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        database.close()

    app = FastAPI(
        lifespan=lifespan,
        title="PipelineRL dashboard",
        summary="Runs, the live pipeline, comparisons and plans: the platform database, MLflow, the home.",
        docs_url=None,
        redoc_url=None,
    )
    mlflow = MlflowReader(settings.mlflow_uri, settings.mlflow_ui_url) if settings.mlflow_uri else None
    app.state.settings = settings
    app.state.dashboard = Dashboard(database, mlflow, settings.prefect_ui_url)
    app.include_router(api.router)
    app.include_router(pages.router)
    bundle = plotly_bundle()

    @app.get("/static/plotly.min.js", include_in_schema=False)
    def plotly_js() -> FileResponse:
        return FileResponse(bundle, media_type="text/javascript")

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")

    return app


class PortInUse(RuntimeError):
    """The dashboard's port is taken; the message says which and what to do."""


def check_port(host: str, port: int) -> None:
    """Fail with a clear message, before anything starts, when ``host:port`` cannot be bound."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind((host, port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PortInUse(
                    f"port {port} on {host} is already in use (another dashboard or program holds it); "
                    "choose another with --port"
                ) from None
            raise


def serve(settings: UiSettings, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve the dashboard until interrupted (what ``pipelinerl ui`` runs); ``PortInUse`` first if
    the port is taken."""
    check_port(host, port)
    uvicorn.run(create_app(settings), host=host, port=port, log_level="warning")
