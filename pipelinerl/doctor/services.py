"""Services: the tracking store and the platform database answer and are migrated, the Prefect API
answers with the deployments' pools and their workers, and the transport ports are free."""

from __future__ import annotations

import importlib.util
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pipelinerl.doctor.checks import Check, Status
from pipelinerl.platform.config import ROLES, PipelineConfig
from pipelinerl.platform.transport import PortInUseError, check_bindable

SECTION = "Services"
HTTP_TIMEOUT_S = 5.0


def preload() -> None:
    """Import what the store checks use, in this thread: a package imported by two threads at once
    can be seen half-initialised by one of them (SQLAlchemy's circular imports do)."""
    import alembic.migration  # noqa: F401, PLC0415
    import alembic.script  # noqa: F401, PLC0415
    import sqlalchemy  # noqa: F401, PLC0415

    import pipelinerl.platform.tracking.db  # noqa: F401, PLC0415
    import pipelinerl.platform.tracking.mlflow_store  # noqa: F401, PLC0415


def tracking_uri(config: PipelineConfig) -> str:
    """The MLflow store a run would use (``mlflow_store.mlflow_uri`` without creating the home)."""
    if config.tracking.mlflow_uri:
        return config.tracking.mlflow_uri
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    return f"sqlite:///{config.run.home.expanduser() / 'mlflow.db'}"


def platform_database_url(config: PipelineConfig) -> str:
    """The platform database a run would use (``db.database_url`` without creating the home)."""
    from pipelinerl.platform.tracking.db import DEFAULT_DATABASE_FILE, ENV_DATABASE_URL  # noqa: PLC0415

    if config.tracking.database_url:
        return config.tracking.database_url
    if os.environ.get(ENV_DATABASE_URL):
        return os.environ[ENV_DATABASE_URL]
    return f"sqlite:///{config.run.home.expanduser().resolve() / DEFAULT_DATABASE_FILE}"


def _missing_sqlite(url: str) -> Path | None:
    """The file of a ``sqlite:///`` URL that does not exist yet (None otherwise)."""
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url.removeprefix("sqlite:///"))
    return None if path.exists() else path


def mlflow_head() -> tuple[str | None, set[str]]:
    """The newest revision of MLflow's own migrations and every revision it knows (no mlflow import)."""
    from alembic.script import ScriptDirectory  # noqa: PLC0415

    spec = importlib.util.find_spec("mlflow")
    if spec is None or spec.origin is None:
        return None, set()
    scripts = ScriptDirectory(str(Path(spec.origin).parent / "store" / "db_migrations"))
    return scripts.get_current_head(), {script.revision for script in scripts.walk_revisions()}


def _revision(url: str, version_table: str) -> str | None:
    import sqlalchemy  # noqa: PLC0415
    from alembic.migration import MigrationContext  # noqa: PLC0415

    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(connection, opts={"version_table": version_table})
            return context.get_current_revision()
    finally:
        engine.dispose()


def check_tracking_store(config: PipelineConfig) -> Check:
    """The MLflow store answers and its schema is MLflow's newest."""
    name = "tracking store (MLflow)"
    if not config.tracking.enabled:
        return Check(SECTION, name, "SKIP", "tracking.enabled=false")
    from pipelinerl.platform.tracking.mlflow_store import TrackingError, check_reachable  # noqa: PLC0415

    uri = tracking_uri(config)
    shown = _hide_password(uri)
    try:
        check_reachable(uri)
    except TrackingError as error:
        return Check(
            SECTION, name, "FAIL", str(error), "start it, or set tracking.mlflow_uri / MLFLOW_TRACKING_URI"
        )
    if uri.startswith(("http://", "https://")):
        return Check(SECTION, name, "PASS", f"{shown} answers (the server migrates its own store)")
    missing = _missing_sqlite(uri)
    if missing is not None:
        return Check(SECTION, name, "PASS", f"{shown}: not created yet; the first run creates it")
    if "://" not in uri or uri.startswith("file:"):
        return Check(SECTION, name, "PASS", f"{shown}: a file store")
    head, known = mlflow_head()
    try:
        current = _revision(uri, "alembic_version")
    except Exception as error:  # driver errors vary; the first line names the cause
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return Check(SECTION, name, "FAIL", f"{shown}: {first}", "check the store's URL and permissions")
    data = {"uri": shown, "revision": current, "head": head}
    fix = f"mlflow db upgrade '{shown}'"
    if current is None:
        return Check(
            SECTION, name, "WARN", f"{shown} answers, never migrated", f"{fix} (before runs start)", data
        )
    if current == head:
        return Check(SECTION, name, "PASS", f"{shown} answers, at MLflow's newest schema", data=data)
    if current in known:
        return Check(SECTION, name, "WARN", f"{shown} answers, schema {current} behind {head}", fix, data)
    return Check(
        SECTION,
        name,
        "FAIL",
        f"{shown}: schema {current} unknown to this MLflow (a newer MLflow migrated it)",
        "upgrade mlflow in this environment",
        data,
    )


def check_platform_database(config: PipelineConfig) -> Check:
    """The platform database answers and is at the migrations' head (``pipelinerl db upgrade``)."""
    name = "platform database"
    if not config.tracking.enabled:
        return Check(SECTION, name, "SKIP", "tracking.enabled=false")
    from alembic.script import ScriptDirectory  # noqa: PLC0415

    from pipelinerl.platform.tracking import db  # noqa: PLC0415

    url = platform_database_url(config)
    try:
        shown = db.display_url(db.parse_url(url))
    except db.PlatformDatabaseError as error:
        return Check(
            SECTION, name, "FAIL", str(error), "set tracking.database_url to sqlite:/// or postgresql://"
        )
    if _missing_sqlite(url) is not None:
        return Check(
            SECTION, name, "PASS", f"{shown}: not created yet; the first run creates and migrates it"
        )
    upgrade = "pipelinerl db upgrade"
    try:
        current = db.current_revision(url)
        head = db.head_revision()
    except db.PlatformDatabaseError as error:
        return Check(SECTION, name, "FAIL", str(error), "start the database, or fix tracking.database_url")
    data = {"url": shown, "revision": current, "head": head}
    if current == head:
        return Check(SECTION, name, "PASS", f"{shown} answers, at revision {head} (head)", data=data)
    if current is None:
        return Check(SECTION, name, "WARN", f"{shown} answers, never migrated", upgrade, data)
    scripts = ScriptDirectory.from_config(db.alembic_config(url))
    if current in {script.revision for script in scripts.walk_revisions()}:
        return Check(SECTION, name, "WARN", f"{shown} answers, at {current}, behind {head}", upgrade, data)
    return Check(
        SECTION,
        name,
        "FAIL",
        f"{shown}: revision {current} unknown to this code (newer code migrated it)",
        "update this checkout, or use another database",
        data,
    )


def _hide_password(uri: str) -> str:
    parts = urllib.parse.urlsplit(uri)
    if parts.password:
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
        return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
    return uri


def _prefect(api: str, path: str, body: Any = None) -> Any:
    request = urllib.request.Request(
        f"{api.rstrip('/')}/{path}",
        data=None if body is None else json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Accept": "application/json"},
        method="GET" if body is None else "POST",
    )
    if os.environ.get("PREFECT_API_KEY"):
        request.add_header("Authorization", f"Bearer {os.environ['PREFECT_API_KEY']}")
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:
        return json.loads(response.read() or b"null")


def check_prefect(
    config: PipelineConfig, api: str | None = None, origin: str = "PREFECT_API_URL"
) -> list[Check]:
    """The Prefect API (PREFECT_API_URL, or ``api`` found elsewhere: ``origin`` says where) answers; each
    role's deployment, its pool and online workers. Missing pools fail a run placed on them
    (cluster.placement='pools'); otherwise they only warn."""
    api = os.environ.get("PREFECT_API_URL") if api is None else api
    if not api:
        return [
            Check(
                SECTION,
                "Prefect API",
                "SKIP",
                "PREFECT_API_URL is not set and no local stack (`pipelinerl up`) runs in run.home: runs use "
                "local processes",
            )
        ]
    try:
        _prefect(api, "health")
    except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
        reason = getattr(error, "reason", error)
        return [
            Check(
                SECTION,
                "Prefect API",
                "FAIL",
                f"{api} does not answer ({reason})",
                "start it (`pipelinerl up` or `prefect server start`), or unset PREFECT_API_URL",
            )
        ]
    checks = [Check(SECTION, "Prefect API", "PASS", f"{api} answers ({origin})")]
    bad: Status = "FAIL" if config.cluster.placement == "pools" else "WARN"
    for role in ROLES:
        deployment = config.cluster.deployment(role)
        name = f"pool of {role}s"
        try:
            found = _prefect(api, f"deployments/name/{deployment}")
        except urllib.error.HTTPError as error:
            if error.code == 404:
                checks.append(
                    Check(
                        SECTION,
                        name,
                        bad,
                        f"no deployment {deployment!r}",
                        "register it: `pipelinerl deploy`",
                    )
                )
                continue
            checks.append(Check(SECTION, name, bad, f"deployment {deployment!r}: HTTP {error.code}"))
            continue
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
            checks.append(Check(SECTION, name, bad, f"deployment {deployment!r}: {error}"))
            continue
        pool = (found or {}).get("work_pool_name")
        if not pool:
            checks.append(
                Check(SECTION, name, bad, f"deployment {deployment!r} has no work pool", "redeploy it")
            )
            continue
        try:
            workers = _prefect(api, f"work_pools/{urllib.parse.quote(pool)}/workers/filter", {}) or []
        except (urllib.error.URLError, OSError, json.JSONDecodeError) as error:
            checks.append(Check(SECTION, name, bad, f"pool {pool!r}: {error}"))
            continue
        online = [worker.get("name", "?") for worker in workers if worker.get("status") == "ONLINE"]
        detail = f"{deployment} on pool {pool!r}: {len(online)} worker(s) online of {len(workers)}"
        if online:
            checks.append(Check(SECTION, name, "PASS", detail, data={"pool": pool, "online": online}))
        else:
            checks.append(
                Check(
                    SECTION,
                    name,
                    bad,
                    detail,
                    f"start one: prefect worker start --pool {pool}",
                    {"pool": pool},
                )
            )
    return checks


def check_ports(config: PipelineConfig) -> Check:
    """The transport ports of the config can be bound now (on trainer node 0 with pools)."""
    addresses = config.transport.all_bound_addresses(config.trainer.num_processes)
    taken: list[str] = []
    errors: list[str] = []
    for address in addresses:
        try:
            check_bindable(address, setting="transport.base_port")
        except PortInUseError:
            taken.append(address)
        except (OSError, ValueError) as error:
            errors.append(str(error))
    base = config.transport.base_port
    if errors:
        return Check(
            SECTION, "transport ports", "FAIL", errors[0], "set transport.host to an address of this machine"
        )
    if taken:
        return Check(
            SECTION,
            "transport ports",
            "FAIL",
            f"in use: {', '.join(taken)}",
            f"set transport.base_port to a free range (now {base}), or stop the process that holds them",
            {"taken": taken},
        )
    return Check(
        SECTION,
        "transport ports",
        "PASS",
        f"{len(addresses)} free from {addresses[0]}",
        data={"addresses": addresses},
    )
