"""Which broker store to read, as a JDBC target: URL, driver class, options, table names.

Owns the translation of the store URLs the broker takes (``sqlite:///path`` for the embedded
default, ``postgresql://user:password@host:port/db``) into what Spark's JDBC source needs. The
password travels as a JDBC property, never inside the URL, so ``display`` is safe to log.
Pure: parses strings, touches no file or socket.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

from tidemesh.core.settings import ConfigError


class Dialect(StrEnum):
    SQLITE = "sqlite"
    POSTGRES = "postgres"


DRIVERS = {Dialect.SQLITE: "org.sqlite.JDBC", Dialect.POSTGRES: "org.postgresql.Driver"}
# Where each driver comes from on Debian and Ubuntu, for the message when it is missing.
DRIVER_PACKAGES = {Dialect.SQLITE: "libxerial-sqlite-jdbc-java",
                   Dialect.POSTGRES: "libpostgresql-jdbc-java"}


def missing_driver(dialect: Dialect, jar: str) -> str:
    """One line saying how to get the JDBC driver of ``dialect`` that is not at ``jar``."""
    package = DRIVER_PACKAGES[dialect]
    setting = "audit.sqlite_jar" if dialect is Dialect.SQLITE else "audit.pg_jar"
    return (f"the {dialect.value} JDBC driver ({DRIVERS[dialect]}) is not at {jar}: install "
            f"the Debian package {package} (apt-get install {package}), or set {setting} to "
            "its jar, or audit.jar_packages to Maven coordinates")


def driver_named(causes: list[str]) -> Dialect | None:
    """The dialect whose driver class a failed run could not load, from its error text."""
    for dialect, cls in DRIVERS.items():
        if any("ClassNotFoundException" in c and cls in c for c in causes):
            return dialect
    return None


@dataclass(frozen=True, slots=True)
class JdbcTarget:
    dialect: Dialect
    url: str
    display: str                                     # the store without secrets, for logs
    options: dict[str, str] = field(default_factory=dict, repr=False)   # may hold a password

    @property
    def driver(self) -> str:
        return DRIVERS[self.dialect]

    def table(self, name: str) -> str:
        """The qualified table name: PostgreSQL keeps the broker's tables in schema ``mesh``."""
        return f"mesh.{name}" if self.dialect is Dialect.POSTGRES else name


def parse_store(url: str) -> JdbcTarget:
    """The JDBC target for a broker store URL; ConfigError for anything else."""
    scheme = url.split(":", 1)[0].lower()
    if scheme == "sqlite":
        return _sqlite(url)
    if scheme in ("postgresql", "postgres"):
        return _postgres(url)
    raise ConfigError(f"unsupported store URL scheme {scheme!r}: use sqlite:/// or postgresql://",
                      field="audit.store")


def _sqlite(url: str) -> JdbcTarget:
    # sqlite:///abs/path.db (and sqlite:////abs/path.db, SQLAlchemy's spelling) are absolute;
    # sqlite:rel/path.db is relative to the working directory.
    raw = url[len("sqlite://"):] if url.startswith("sqlite://") else url[len("sqlite:"):]
    path = unquote(raw.split("?", 1)[0])
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if not path or path == "/":
        raise ConfigError("sqlite store URL has no path", field="audit.store")
    resolved = str(Path(path).resolve())
    return JdbcTarget(
        Dialect.SQLITE,
        f"jdbc:sqlite:{resolved}",
        f"sqlite://{resolved}",
        # open_mode=1 is SQLITE_OPEN_READONLY: a missing file fails instead of being created
        # empty (spark-notes gotcha 8); busy_timeout rides out a writer's exclusive lock.
        {"open_mode": "1", "busy_timeout": "15000"},
    )


def _postgres(url: str) -> JdbcTarget:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 5432
    db = unquote(parts.path.lstrip("/")) or "postgres"
    query = dict(parse_qsl(parts.query))
    options: dict[str, str] = {}
    if parts.username:
        options["user"] = unquote(parts.username)
    if parts.password:
        options["password"] = unquote(parts.password)
    for key in ("sslmode", "sslrootcert", "application_name"):
        if key in query:
            options[key] = query[key]
    user = f"{options['user']}@" if "user" in options else ""
    return JdbcTarget(
        Dialect.POSTGRES,
        f"jdbc:postgresql://{host}:{port}/{db}",
        f"postgresql://{user}{host}:{port}/{db}",
        options,
    )
