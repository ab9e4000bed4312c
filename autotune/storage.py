"""Where a study lives: the storage URL, its engine options, opening a study, the artifacts.

Nothing here adds tables of its own: trial values, constraints and namespaced ``user_attrs`` go
into Optuna's RDB storage, so ``optuna-dashboard`` and plain ``optuna.load_study`` read
everything autotune writes. The attribute keys live in :mod:`autotune.names`.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import unquote_plus

import optuna
from optuna.artifacts import FileSystemArtifactStore
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from autotune._files import file_kind
from autotune.errors import SpecError

HEARTBEAT_INTERVAL_S = 10
HEARTBEAT_GRACE_S = 30


def _env_seconds(name: str, default: int) -> int:
    """A whole number of seconds from the environment (tests shorten the heartbeat)."""
    try:
        return max(1, int(os.environ.get(name, default)))
    except ValueError:
        return default


#: a study name becomes a file name (``<name>.db``, ``<name>-artifacts``): no separators, no
#: leading dot, so nothing derived from it can leave the storage directory
STUDY_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def study_name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a study, or None. The one rule for the spec's ``study:`` key
    and every ``--study`` option."""
    if isinstance(name, str) and STUDY_NAME_RE.fullmatch(name):
        return None
    return (
        "must be a name of letters, digits, '.', '_' or '-' (starting with a letter or "
        f"digit, at most 128 characters), got {name!r}"
    )


def check_study_name(name: str, *, key: str = "--study") -> str:
    problem = study_name_problem(name)
    if problem is not None:
        raise SpecError(problem, key=key)
    return name


def check_url(url: str, *, key: str = "--storage", file: str | None = None) -> str:
    """Parse the URL and refuse what cannot keep a study: an in-memory SQLite database runs
    real trials and loses every one of them when the process exits. Touches nothing."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:
        # SQLAlchemy reads the port with int(): "host:abc" and "[::1/x" raise ValueError
        why = " (its port is not a number)" if "int()" in str(exc) else ""
        raise SpecError(
            f"not a valid SQLAlchemy storage URL{why}: {_unparsed(url)!r}", key=key, file=file
        ) from None
    if parsed.port is not None and not 0 < parsed.port < 65536:
        raise SpecError(
            f"the storage URL's port must be 1 to 65535, got {parsed.port}: {safe_url(url)!r}",
            key=key,
            file=file,
        )
    # A percent-encoded NUL (``%00``) is decoded into the database path, the host or a query
    # value, where a path lookup or the driver raised ``ValueError: embedded null byte``.
    parts = [parsed.username, parsed.password, parsed.host, parsed.database, *parsed.query]
    for value in parsed.query.values():  # a query value is a string, or a tuple when repeated
        parts += [value] if isinstance(value, str) else list(value)
    if "\0" in url or any(isinstance(part, str) and "\0" in part for part in parts):
        raise SpecError(
            f"the storage URL holds a NUL character (%00): {safe_url(url)!r}", key=key, file=file
        )
    if parsed.get_backend_name() == "sqlite":
        database = parsed.database or ""
        if (
            database in ("", ":memory:")
            or database.startswith("file::memory:")
            or parsed.query.get("mode") == "memory"
        ):
            raise SpecError(
                f"{safe_url(url)!r} is an in-memory SQLite database: every trial would be lost "
                "when autotune exits; give a file, e.g. sqlite:///studies/NAME.db",
                key=key,
                file=file,
            )
    return url


#: a query parameter that carries a secret, by its name (any case): libpq's ``password`` and
#: ``sslpassword``, MySQL's ``passwd``, a key's passphrase, a token, an ODBC connection string
#: (its ``PWD=``). Hidden wherever a URL is shown, and never put on a command line.
_SECRET_KEY = re.compile(r"pass(?:word|wd|phrase)|pwd|secret|token|odbc_connect", re.IGNORECASE)
#: ``_SECRET_KEY`` as a parameter of an unparsed URL's query (``?sslpassword=``, ``&PWD=``)
_SECRET_PARAM = re.compile(rf"[?&;][^=&;]*(?:{_SECRET_KEY.pattern})[^=&;]*=", re.IGNORECASE)
#: what a hidden query value is rendered as before it becomes ``***`` (which SQLAlchemy quotes)
_HIDDEN = "AUTOTUNEHIDDENVALUE"


def _secret_key(key: str) -> bool:
    return _SECRET_KEY.search(key) is not None


def _unparsed(url: str) -> str:
    """A URL SQLAlchemy cannot parse, as an error may show it: whatever stands before its last
    ``@`` (a user name and password) is hidden, since no parser says where the password ends;
    so is everything after the scheme where a query parameter names a password."""
    scheme, sep, rest = url.partition("://")
    if not sep:  # no scheme: "bob:pw@host"
        scheme, rest = "", url
    if _SECRET_PARAM.search(unquote_plus(rest)):
        return f"{scheme}{sep}***"
    if "@" not in rest:
        return url
    return f"{scheme}{sep}***@{rest.rsplit('@', 1)[1]}"


def resolve_url(url: str, *, key: str = "--storage", file: str | None = None) -> str:
    """Validate an SQLAlchemy URL; for SQLite make sure the directory exists and is writable."""
    parsed = make_url(check_url(url, key=key, file=file))
    if parsed.get_backend_name() == "sqlite":
        if Path(parsed.database).is_dir():
            raise SpecError(
                f"{parsed.database} is a directory, not an SQLite database file",
                key=key,
                file=file,
            )
        _check_sqlite_file(Path(parsed.database), key=key, file=file)
        directory = Path(parsed.database).resolve().parent
        if not directory.is_dir():
            raise SpecError(
                f"directory for the SQLite study does not exist: {directory}", key=key, file=file
            )
        if not _writable(directory):
            raise SpecError(
                f"directory for the SQLite study is not writable: {directory}", key=key, file=file
            )
    return url


def _check_sqlite_file(database: Path, *, key: str, file: str | None) -> None:
    """Refuse an SQLite path that exists and is not a regular file (links followed).

    ``sqlite:////dev/null`` opened (a device reads as an empty database), printed the budget
    and the live view, failed at the first write with "disk I/O error" and left
    ``/dev/null-journal`` behind; a FIFO blocks the open. Refused before anything is printed.
    """
    try:
        mode = os.stat(database).st_mode
    except OSError:  # not there yet (SQLite creates it), or its folder is checked next
        return
    if not stat.S_ISREG(mode):
        raise SpecError(
            f"{database} is {file_kind(mode)}, not an SQLite database file", key=key, file=file
        )


def check_reachable(url: str, *, key: str = "--storage", file: str | None = None) -> None:
    """Connect once to a database server, writing nothing (no tables are created), so a bad
    server URL is refused before any directory is made. SQLite is only checked by
    :func:`resolve_url`: connecting would create the file."""
    if make_url(url).get_backend_name() == "sqlite":
        return
    try:
        engine = create_engine(url, pool_pre_ping=True)
        try:
            with engine.connect():
                pass
        finally:
            engine.dispose()
    except Exception as exc:  # driver and connection errors share no base class
        message = f"storage unreachable: {type(exc).__name__}: {exc}".splitlines()[0]
        raise SpecError(message, key=key, file=file) from None


def sqlite_file(url: str) -> Path | None:
    """The database file of an SQLite URL (None for other databases)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or not parsed.database:
        return None
    return Path(parsed.database)


def open_storage(url: str, *, heartbeat: bool = True) -> optuna.storages.RDBStorage:
    """An RDBStorage with settings suited to long trials and several workers.

    SQLite gets a long busy timeout (several local workers write the same file); other
    databases get ``pool_pre_ping`` so a connection dropped overnight is replaced. Heartbeats
    let a killed run's RUNNING trials be found and failed by the next run (or another worker).
    """
    url = resolve_url(url)
    backend = make_url(url).get_backend_name()
    engine_kwargs: dict[str, Any] = {}
    if backend == "sqlite":
        engine_kwargs["connect_args"] = {"timeout": 60}
    else:
        engine_kwargs["pool_pre_ping"] = True
    kwargs: dict[str, Any] = {}
    if heartbeat:
        # A RUNNING trial whose heartbeat is older than the grace belongs to a dead run.
        interval = _env_seconds("AUTOTUNE_HEARTBEAT_INTERVAL_S", HEARTBEAT_INTERVAL_S)
        grace = _env_seconds("AUTOTUNE_HEARTBEAT_GRACE_S", HEARTBEAT_GRACE_S)
        kwargs = {"heartbeat_interval": interval, "grace_period": max(grace, interval + 1)}
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)
    except Exception as exc:  # SQLAlchemy's connection and driver errors have no common base
        message = f"storage unreachable: {type(exc).__name__}: {exc}".splitlines()[0]
        if isinstance(exc, ImportError) and exc.__cause__ is not None:
            # Optuna hides which driver is missing: "No module named 'psycopg'"
            message += f" ({exc.__cause__})"
        raise SpecError(message, key="--storage") from None


def load_study(
    url: str,
    name: str,
    *,
    heartbeat: bool = False,
    sampler: optuna.samplers.BaseSampler | None = None,
    pruner: optuna.pruners.BasePruner | None = None,
) -> optuna.Study:
    """The existing study ``name`` at ``url``: how every command that reads or extends a study
    opens it. A missing study is a SpecError naming the studies that are there; nothing is
    created, so a mistyped ``--study`` never leaves an empty study behind. ``heartbeat`` for
    commands that run trials in it (a killed run's trials are then found and failed)."""
    storage = open_storage(url, heartbeat=heartbeat)
    try:
        return optuna.load_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner)
    except KeyError:
        studies = optuna.study.get_all_study_names(storage=storage)
        raise SpecError(
            f"no study named {name!r} in {safe_url(url)} (studies: {', '.join(studies) or 'none'})",
            key="--study",
        ) from None


def safe_url(url: str) -> str:
    """The URL as a message, a page or a command line may show it: a database password stays
    out, given as ``user:pass@`` or as a query parameter (``?password=``, ``?sslpassword=``,
    which psycopg and libpq read too), and a URL that cannot be parsed is never printed."""
    try:
        parsed = make_url(url)
        hidden = {key: _HIDDEN for key in parsed.query if _secret_key(key)}
        shown = parsed.update_query_dict(hidden) if hidden else parsed
        return shown.render_as_string(hide_password=True).replace(_HIDDEN, "***")
    except Exception:  # noqa: BLE001 - an unparsable URL was refused long before
        return "(storage URL)"


def artifact_dir_for(url: str, study_name: str, override: str | None = None) -> Path:
    """Server logs and verified outputs live beside an SQLite file, or where the user says.

    The name is checked first: ``--study ../../x`` must not put artifacts outside the storage
    directory."""
    check_study_name(study_name)
    if override:
        return Path(override)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parent = Path(parsed.database).resolve().parent
    else:
        parent = Path("studies")
    path = parent / f"{study_name}-artifacts"
    if Path(os.path.normpath(path)).parent != parent:  # cannot happen with a checked name
        raise SpecError(f"artifacts would leave {parent}: {path}", key="--study")
    return path


def artifact_store(directory: Path) -> FileSystemArtifactStore:
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SpecError(
            f"cannot create the artifact directory {directory}: {exc.strerror}",
            key="--artifact-dir",
        ) from None
    if not _writable(directory):
        raise SpecError(
            f"the artifact directory is not writable: {directory}", key="--artifact-dir"
        )
    return FileSystemArtifactStore(str(directory))


def check_artifact_dir(directory: Path) -> None:
    """Refuse an artifact directory :func:`artifact_store` could not make or write, creating
    nothing: ``run`` checks it before the study is opened, and makes it only once every refusal
    (storage, study, warm start, workload) has passed, so bad input leaves no folder behind."""
    if directory.exists():
        if not directory.is_dir():
            raise SpecError(
                f"cannot create the artifact directory {directory}: not a directory",
                key="--artifact-dir",
            )
        existing = directory
    else:
        existing = directory.absolute().parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise SpecError(
                f"cannot create the artifact directory {directory}: {existing} is not a directory",
                key="--artifact-dir",
            )
    if not _writable(existing):
        raise SpecError(
            f"the artifact directory is not writable: {directory}"
            + ("" if existing == directory else f" ({existing} is not writable)"),
            key="--artifact-dir",
        )


def study_names(url: str, *, key: str = "--storage") -> list[str] | None:
    """The names of the studies at ``url``, read without writing anything: an SQLite file that
    is not there is not created, and no Optuna table is made where there is none (None then:
    no Optuna storage there yet). A storage that cannot be read is a :class:`SpecError`."""
    database = sqlite_file(url)
    if database is not None and not database.exists():
        return None
    try:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                if not inspect(connection).has_table("studies"):
                    return None
                rows = connection.execute(text("SELECT study_name FROM studies"))
                return [row[0] for row in rows]
        finally:
            engine.dispose()
    except Exception as exc:  # driver and connection errors share no base class
        message = f"storage unreachable: {type(exc).__name__}: {exc}".splitlines()[0]
        raise SpecError(message, key=key) from None


#: where each database driver's client library reads a password from the environment
#: (libpq: PGPASSWORD; libmysqlclient, i.e. mysqlclient: MYSQL_PWD)
_PASSWORD_ENV = {"postgresql": "PGPASSWORD", "mysql": "MYSQL_PWD"}
#: the query parameters the driver takes as the password itself, each overriding the URL's
#: ``user:pass@`` and the ones before it (SQLAlchemy passes the query on as keyword arguments:
#: libpq's ``password``; mysqlclient's ``passwd``, then its alias ``password``)
_PASSWORD_KEYS = {"postgresql": ("password",), "mysql": ("passwd", "password")}


def dashboard_command(url: str, artifacts: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """``optuna-dashboard`` on the study's storage and artifacts, bound to 127.0.0.1: its argv
    and the environment variables to add. A process's argv is readable by every user of the
    machine (``ps``), so the storage URL goes there without its password (``user:pass@`` or
    ``?password=``), and the password goes to the driver's client library through the
    environment (PostgreSQL's libpq reads ``PGPASSWORD``). A secret that no client library of
    the URL's backend reads from the environment is refused (:class:`SpecError`), never put on
    argv."""
    exe = shutil.which("optuna-dashboard") or str(Path(sys.executable).parent / "optuna-dashboard")
    safe_url, env = password_off_argv(url)
    argv = [exe, safe_url, "--host", "127.0.0.1", "--port", str(port)]
    return [*argv, "--artifact-dir", str(artifacts)], env


def password_off_argv(url: str, *, who: str = "the dashboard") -> tuple[str, dict[str, str]]:
    """``url`` without its password and without any query parameter that carries a secret,
    and the env that carries the password instead (``who`` names the process that gets it, for
    the refusal where no env var can carry it). The password the driver would use is the one
    carried: a ``?password=`` wins over ``user:pass@``, as SQLAlchemy passes it on."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        return url, {}
    secrets = [key for key in parsed.query if _secret_key(key)]
    if parsed.password is None and not secrets:
        return url, {}
    backend = parsed.get_backend_name()
    var = _PASSWORD_ENV.get(backend)
    libpq = ("psycopg2", "psycopg", "psycopg2cffi")
    if (
        var is None
        or (var == "PGPASSWORD" and parsed.get_driver_name() not in libpq)
        or (var == "MYSQL_PWD" and parsed.get_driver_name() != "mysqldb")
    ):
        raise SpecError(
            f"--storage: {who} cannot be given the password of a "
            f"{parsed.drivername} URL without putting it on its command line; use a "
            "PostgreSQL URL, or one without a password (e.g. a ~/.pgpass or socket login)"
        )
    password = parsed.password
    for key in secrets:
        if key not in _PASSWORD_KEYS[backend]:
            hint = (
                "; put it in a connection service file (pg_service.conf) and name the service "
                "in the URL (?service=NAME)"
                if backend == "postgresql"
                else ""
            )
            raise SpecError(
                f"--storage: {who} cannot be given the URL's {key!r} parameter without putting "
                f"it on its command line (no environment variable carries it){hint}"
            )
    for key in _PASSWORD_KEYS[backend]:
        value = parsed.query.get(key)
        if value is None:
            continue
        if not isinstance(value, str):  # ?password=a&password=b
            raise SpecError(f"--storage: the URL gives {key!r} more than once")
        password = value
    safe = URL.create(  # URL.set(password=None) would keep the password
        parsed.drivername,
        username=parsed.username,
        host=parsed.host,
        port=parsed.port,
        database=parsed.database,
        query={k: v for k, v in parsed.query.items() if k not in secrets},
    ).render_as_string(hide_password=False)
    return safe, {var: str(password)}


def _writable(directory: Path) -> bool:
    """Try it: ``os.access`` says yes to root even where no file can be created (/proc, a
    read-only mount)."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            return True
    except OSError:
        return False


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"
