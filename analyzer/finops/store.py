"""Daily cost rollups kept beyond Prometheus retention: SQLite (a file) or PostgreSQL (a URL).

One rollup row is one (day, group_by, group, model) with additive float columns (GPU-hours,
dollars; never ratios, so sums over any range of days stay correct): the rows of
``analyzer.finops.costs.daily_rollups`` (``ROLLUP_COLUMNS``). ``write_day`` takes, and ``read``
gives back:

* ``day``      ISO date (``YYYY-MM-DD``); optional on write, and then equal to the day written
* ``group_by`` what the rows group by (``"namespace"``, ``"workload"``...); optional on write, and
  then equal to the ``group_by`` written
* ``group``    the group key (a namespace/job/pod name: user text, stored as-is through
  parameterized SQL). On write the column may instead be named ``key``, ``group_key`` or after
  ``group_by`` itself (``namespace``).
* ``model``    the GPU model of the row (optional on write, then ""): a report from the store
  names each row's SKU and list price. ``read`` sums over models unless ``per_day=True``.
* ``currency``, ``cluster`` (columns holding one value, or ``DataFrame.attrs``): optional; the
  store remembers the first ones written and refuses others (one store per cluster/currency);
  ``read`` puts them back in ``attrs``.
* every other column: a numeric, additive value, returned in ``ROLLUP_COLUMNS`` order

Values are stored long (one SQL row per key and column) so new rollup columns need no
migration and no column name ever reaches SQL text. Writing a day replaces that
(day, group_by) atomically in one transaction: a reader sees the old day or the new day,
and a writer killed mid-write leaves every day it committed before intact.

Open a store with ``open_store``: a file path (or ``sqlite:///relative`` /
``sqlite:////absolute``, the SQLAlchemy spelling) is SQLite in WAL mode with
``synchronous=FULL``; ``postgresql://...`` (or ``postgres://``) is PostgreSQL through
psycopg 3.
"""

from __future__ import annotations

import math
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import pandas as pd

from analyzer.finops.costs import ROLLUP_COLUMNS, ROLLUP_KEY_COLUMNS

#: Bump with a migration in ``_MIGRATIONS`` when the tables change.
SCHEMA_VERSION = 3

#: ("day", "group_by", "group", "model"): the key columns of a rollup row.
DAY_COLUMN, GROUP_BY_COLUMN, KEY_COLUMN, MODEL_COLUMN = ROLLUP_KEY_COLUMNS
#: Extra names accepted for the key column on write (besides ``group_by`` itself).
KEY_ALIASES = ("key", "group_key")
#: Store-wide facts a rollup frame may carry (columns or attrs): all rows of a store share them.
META_FIELDS = ("currency", "cluster")

_VERSION_TABLE = "truegpu_schema_version"
_DAYS_TABLE = "truegpu_rollup_days"
_VALUES_TABLE = "truegpu_rollup_values"
_META_TABLE = "truegpu_store_meta"

#: Statements per backend; ``?`` placeholders everywhere (PostgreSQL's are rewritten to %s).
_SCHEMA = {
    "sqlite": [
        f"CREATE TABLE IF NOT EXISTS {_VERSION_TABLE} (version INTEGER NOT NULL, applied_at TEXT NOT NULL)",
        f"""CREATE TABLE IF NOT EXISTS {_DAYS_TABLE} (
            group_by TEXT NOT NULL, day TEXT NOT NULL, n_keys INTEGER NOT NULL, written_at TEXT NOT NULL,
            PRIMARY KEY (group_by, day))""",
        f"""CREATE TABLE IF NOT EXISTS {_VALUES_TABLE} (
            group_by TEXT NOT NULL, day TEXT NOT NULL, group_key TEXT NOT NULL, model TEXT NOT NULL DEFAULT '',
            metric TEXT NOT NULL, value REAL, PRIMARY KEY (group_by, day, group_key, model, metric))""",
        f"CREATE TABLE IF NOT EXISTS {_META_TABLE} (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ],
    "postgresql": [
        f"""CREATE TABLE IF NOT EXISTS {_VERSION_TABLE} (
            version INTEGER NOT NULL, applied_at TIMESTAMPTZ NOT NULL)""",
        f"""CREATE TABLE IF NOT EXISTS {_DAYS_TABLE} (
            group_by TEXT NOT NULL, day DATE NOT NULL, n_keys INTEGER NOT NULL, written_at TIMESTAMPTZ NOT NULL,
            PRIMARY KEY (group_by, day))""",
        f"""CREATE TABLE IF NOT EXISTS {_VALUES_TABLE} (
            group_by TEXT NOT NULL, day DATE NOT NULL, group_key TEXT NOT NULL, model TEXT NOT NULL DEFAULT '',
            metric TEXT NOT NULL, value DOUBLE PRECISION, PRIMARY KEY (group_by, day, group_key, model, metric))""",
        f"CREATE TABLE IF NOT EXISTS {_META_TABLE} (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    ],
}
# 3: rows grouped by workload were written as group_by "job" (the label's old name).
_WORKLOAD_RENAME = [f"UPDATE {table} SET group_by = 'workload' WHERE group_by = 'job'"
                    for table in (_DAYS_TABLE, _VALUES_TABLE)]
#: backend -> version -> statements taking a store from version-1 to version.
_MIGRATIONS: dict[str, dict[int, list[str]]] = {
    # 2: the GPU model joins the key (rows written before it have model "").
    "sqlite": {3: _WORKLOAD_RENAME, 2: [
        f"ALTER TABLE {_VALUES_TABLE} RENAME TO {_VALUES_TABLE}_v1",
        _SCHEMA["sqlite"][2],
        f"INSERT INTO {_VALUES_TABLE} (group_by, day, group_key, model, metric, value) "
        f"SELECT group_by, day, group_key, '', metric, value FROM {_VALUES_TABLE}_v1",
        f"DROP TABLE {_VALUES_TABLE}_v1",
    ]},
    "postgresql": {3: _WORKLOAD_RENAME, 2: [
        f"ALTER TABLE {_VALUES_TABLE} ADD COLUMN IF NOT EXISTS model TEXT NOT NULL DEFAULT ''",
        f"ALTER TABLE {_VALUES_TABLE} DROP CONSTRAINT IF EXISTS {_VALUES_TABLE}_pkey",
        f"ALTER TABLE {_VALUES_TABLE} ADD PRIMARY KEY (group_by, day, group_key, model, metric)",
    ]},
}


class StoreError(RuntimeError):
    """The store cannot be opened or used (bad URL, missing driver, newer schema)."""


def open_store(url_or_path: str | Path) -> RollupStore:
    """A file path or ``sqlite:///path`` -> SQLite; ``postgresql://...`` -> PostgreSQL."""
    if isinstance(url_or_path, Path):
        return SqliteStore(url_or_path)
    text = str(url_or_path)
    scheme, sep, rest = text.partition("://")
    if not sep:
        return SqliteStore(Path(text))
    scheme = scheme.lower()
    if scheme == "sqlite":
        if not rest.startswith("/") or rest == "/":
            raise StoreError(f"sqlite URL needs a path: sqlite:///relative.db or sqlite:////abs/path.db, got {text!r}")
        return SqliteStore(Path(rest[1:]))
    if scheme in ("postgresql", "postgres") or scheme.startswith("postgresql+"):
        return PostgresStore(text if "+" not in scheme else "postgresql://" + rest)
    raise StoreError(f"unsupported store {text!r}: use a file path, sqlite:///path or postgresql://...")


def _as_date(value: date | str) -> date:
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    if isinstance(value, str):
        return date.fromisoformat(value)
    raise TypeError(f"day must be a date or an ISO date string, got {type(value).__name__}")


def _check_text(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} must be a string, got {value!r}")
    if "\x00" in value:
        raise ValueError(f"{what} must not contain NUL characters: {value!r}")
    return value


def _key_column(rows: pd.DataFrame, group_by: str) -> str:
    for name in (KEY_COLUMN, group_by, *KEY_ALIASES):
        if name in rows.columns:
            return name
    raise ValueError(
        f"rollup rows need a group key column named {KEY_COLUMN!r} (or {group_by!r}, "
        f"{' or '.join(repr(a) for a in KEY_ALIASES)}); got columns {list(rows.columns)}"
    )


def _records(day: date, group_by: str, rows: pd.DataFrame) -> tuple[list[tuple[str, str, str, float | None]], int]:
    """(key, model, metric, value) for the rows of one day and the number of keys; validates everything."""
    if not isinstance(rows, pd.DataFrame):
        raise TypeError(f"rows must be a pandas DataFrame, got {type(rows).__name__}")
    if DAY_COLUMN in rows.columns and len(rows):
        days = {_as_date(d) if not isinstance(d, pd.Timestamp) else d.date() for d in rows[DAY_COLUMN]}
        if days != {day}:
            raise ValueError(f"rows carry day(s) {sorted(map(str, days))} but write_day was given {day.isoformat()}")
    if GROUP_BY_COLUMN in rows.columns and len(rows):
        given = set(rows[GROUP_BY_COLUMN])
        if given != {group_by}:
            raise ValueError(f"rows carry group_by {sorted(map(str, given))} but write_day was given {group_by!r}")
    key_col = _key_column(rows, group_by)
    reserved = {DAY_COLUMN, GROUP_BY_COLUMN, key_col, MODEL_COLUMN, *META_FIELDS}
    metrics = [c for c in rows.columns if c not in reserved]
    bad = [
        c for c in metrics
        if not pd.api.types.is_numeric_dtype(rows[c]) or pd.api.types.is_bool_dtype(rows[c])
    ]
    if bad:
        raise ValueError(f"rollup columns must be numeric (additive GPU-hours / dollars); not numeric: {bad}")
    for metric in metrics:
        _check_text("column name", metric)
    keys = rows[key_col]
    if keys.isna().any():
        raise ValueError(f"group key column {key_col!r} has missing values")
    keys = [_check_text("group key", k if isinstance(k, str) else str(k)) for k in keys]
    models = ([_check_text("model", "" if pd.isna(m) else str(m)) for m in rows[MODEL_COLUMN]]
              if MODEL_COLUMN in rows.columns else [""] * len(keys))
    pairs = list(zip(keys, models, strict=True))
    if len(set(pairs)) != len(pairs):
        counts = pd.Series(pairs).value_counts()
        repeated = list(counts[counts > 1].index[:10])
        raise ValueError(f"(group key, model) must be unique within a day; repeated: {repeated}")
    out: list[tuple[str, str, str, float | None]] = []
    columns = [rows[m].to_numpy(dtype=float, na_value=math.nan) for m in metrics]
    for i, (key, model) in enumerate(pairs):
        for metric, values in zip(metrics, columns, strict=True):
            v = float(values[i])
            out.append((key, model, metric, None if math.isnan(v) else v))
    return out, len(set(keys))


def _metadata(rows: pd.DataFrame) -> dict[str, str]:
    """currency/cluster of a rollup frame, from one-valued columns or ``attrs``."""
    out: dict[str, str] = {}
    for name in META_FIELDS:
        if name in rows.columns:
            values = set(rows[name].dropna().astype(str))
            if len(values) > 1:
                raise ValueError(f"one store holds one {name}; these rows carry {sorted(values)}")
            if values:
                out[name] = _check_text(name, values.pop())
        elif rows.attrs.get(name) is not None:
            out[name] = _check_text(name, str(rows.attrs[name]))
    return out


def _metric_order(metrics: Iterable[str]) -> list[str]:
    """Rollup columns in ROLLUP_COLUMNS order, then any others sorted."""
    names = set(metrics)
    first = [m for m in ROLLUP_COLUMNS if m in names]
    return first + sorted(names - set(first))


class RollupStore(ABC):
    """Daily rollups per (day, group_by, key). Use ``open_store``; close it or use ``with``."""

    backend: str
    _param = "?"

    def __init__(self) -> None:
        self._closed = False
        self._ensure_schema()

    # -- backend hooks -------------------------------------------------------------------------
    @abstractmethod
    @contextmanager
    def _transaction(self) -> Iterator[None]: ...

    @abstractmethod
    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]: ...

    @abstractmethod
    def _executemany(self, sql: str, rows: list[tuple]) -> None: ...

    @abstractmethod
    def _close(self) -> None: ...

    @abstractmethod
    def _day_param(self, day: date) -> Any: ...

    @abstractmethod
    def _lock_schema(self) -> None:
        """Serialize schema creation between processes (inside the schema transaction)."""

    # -- schema ----------------------------------------------------------------------------------
    def _ensure_schema(self) -> None:
        with self._transaction():
            self._lock_schema()
            for stmt in _SCHEMA[self.backend]:
                self._execute(stmt)
            row = self._execute(f"SELECT MAX(version) FROM {_VERSION_TABLE}")
            current = row[0][0] if row and row[0][0] is not None else 0
            if current > SCHEMA_VERSION:
                raise StoreError(
                    f"store schema version {current} is newer than this truegpu understands ({SCHEMA_VERSION}); "
                    "upgrade truegpu"
                )
            if current == SCHEMA_VERSION:
                return
            # A fresh store (0) already has the newest tables from the CREATE statements above.
            for version in range(current + 1, SCHEMA_VERSION + 1) if current else ():
                for stmt in _MIGRATIONS[self.backend].get(version, []):
                    self._execute(stmt)
            self._execute(f"DELETE FROM {_VERSION_TABLE}")
            self._execute(
                f"INSERT INTO {_VERSION_TABLE} (version, applied_at) VALUES (?, ?)",
                (SCHEMA_VERSION, self._now()),
            )

    def _now(self) -> Any:
        return datetime.now(UTC)

    def schema_version(self) -> int:
        self._check_open()
        return int(self._execute(f"SELECT MAX(version) FROM {_VERSION_TABLE}")[0][0])

    # -- API ---------------------------------------------------------------------------------------
    def write_day(self, day: date | str, group_by: str, rows: pd.DataFrame) -> None:
        """Replace (day, group_by) with ``rows`` in one transaction (idempotent; an empty frame empties the day)."""
        self._check_open()
        day = _as_date(day)
        group_by = _check_text("group_by", group_by)
        if not group_by:
            raise ValueError("group_by must not be empty")
        records, n_keys = _records(day, group_by, rows)
        meta = _metadata(rows)
        d = self._day_param(day)
        values = [(group_by, d, *record) for record in records]
        with self._transaction():
            for name, value in meta.items():
                self._execute(f"INSERT INTO {_META_TABLE} (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
                              (name, value))
                stored = self._execute(f"SELECT value FROM {_META_TABLE} WHERE name = ?", (name,))[0][0]
                if stored != value:
                    raise ValueError(f"this store holds {name} {stored!r}, not {value!r}: keep one store per {name}")
            # The upsert locks the (group_by, day) row first, so two writers of the same day queue up
            # here and the DELETE below (a new statement) sees everything the previous writer committed.
            self._execute(
                f"INSERT INTO {_DAYS_TABLE} (group_by, day, n_keys, written_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (group_by, day) DO UPDATE SET n_keys = excluded.n_keys, written_at = excluded.written_at",
                (group_by, d, n_keys, self._now()),
            )
            self._execute(f"DELETE FROM {_VALUES_TABLE} WHERE group_by = ? AND day = ?", (group_by, d))
            if values:
                self._executemany(
                    f"INSERT INTO {_VALUES_TABLE} (group_by, day, group_key, model, metric, value) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    values,
                )

    def write_rollups(self, rows: pd.DataFrame) -> list[tuple[str, date]]:
        """``write_day`` for every (group_by, day) in ``rows`` (e.g. ``daily_rollups`` over several days).

        Each day is its own transaction. Returns the (group_by, day) pairs written.
        """
        self._check_open()
        missing = [c for c in (DAY_COLUMN, GROUP_BY_COLUMN) if c not in rows.columns]
        if missing:
            raise ValueError(f"write_rollups needs columns {missing}; use write_day for rows of one day")
        written = []
        for (group_by, day), part in rows.groupby([GROUP_BY_COLUMN, DAY_COLUMN], sort=True):
            part.attrs = dict(rows.attrs)
            self.write_day(day, group_by, part)
            written.append((group_by, _as_date(day)))
        return written

    def metadata(self) -> dict[str, str]:
        """currency/cluster this store holds (whatever was written first)."""
        self._check_open()
        return dict(self._execute(f"SELECT name, value FROM {_META_TABLE} ORDER BY name"))

    def read(
        self, start_day: date | str, end_day: date | str, group_by: str, *, per_day: bool = False
    ) -> pd.DataFrame:
        """Sums per group over ``start_day..end_day`` (both included): columns group_by, group, then the values.

        With ``per_day=True`` the stored rows themselves: columns day (ISO), group_by, group, model, values.
        Sorted by (day,) group; ``attrs`` carry the store's currency/cluster.
        """
        self._check_open()
        start, end = _as_date(start_day), _as_date(end_day)
        if end < start:
            raise ValueError(f"end_day {end} is before start_day {start}")
        group_by = _check_text("group_by", group_by)
        params = (group_by, self._day_param(start), self._day_param(end))
        where = "WHERE group_by = ? AND day >= ? AND day <= ?"
        if per_day:
            raw = self._execute(
                f"SELECT day, group_key, model, metric, value FROM {_VALUES_TABLE} {where} "
                "ORDER BY day, group_key, model", params
            )
            index = [DAY_COLUMN, KEY_COLUMN, MODEL_COLUMN]
            long = pd.DataFrame(raw, columns=[*index, "metric", "value"])
            long[DAY_COLUMN] = [_as_date(d).isoformat() for d in long[DAY_COLUMN]]
        else:
            raw = self._execute(
                f"SELECT group_key, metric, SUM(value) FROM {_VALUES_TABLE} {where} GROUP BY group_key, metric",
                params,
            )
            index = [KEY_COLUMN]
            long = pd.DataFrame(raw, columns=[*index, "metric", "value"])
        metrics = _metric_order(long["metric"].unique())
        long["value"] = long["value"].astype(float)
        if long.empty:
            wide = pd.DataFrame(columns=index)
        else:
            wide = long.pivot(index=index, columns="metric", values="value").reindex(columns=metrics).reset_index()
        wide.columns.name = None
        wide[GROUP_BY_COLUMN] = group_by
        wide = wide.sort_values(index, kind="stable").reset_index(drop=True)
        keys = [DAY_COLUMN, GROUP_BY_COLUMN, KEY_COLUMN, MODEL_COLUMN] if per_day else [GROUP_BY_COLUMN, KEY_COLUMN]
        wide = wide[[*keys, *metrics]]
        wide.attrs.update(self.metadata())
        return wide

    def days(self, group_by: str) -> list[date]:
        """Days written for ``group_by``, oldest first."""
        self._check_open()
        group_by = _check_text("group_by", group_by)
        rows = self._execute(f"SELECT day FROM {_DAYS_TABLE} WHERE group_by = ? ORDER BY day", (group_by,))
        return [_as_date(r[0]) for r in rows]

    def group_bys(self) -> list[str]:
        """Every group_by with at least one day written."""
        self._check_open()
        return [r[0] for r in self._execute(f"SELECT DISTINCT group_by FROM {_DAYS_TABLE} ORDER BY group_by")]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._close()

    def __enter__(self) -> RollupStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError("store is closed")


class SqliteStore(RollupStore):
    backend = "sqlite"

    def __init__(self, path: Path, *, busy_timeout_s: float = 60.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: no implicit transactions; _transaction() issues BEGIN IMMEDIATE itself.
        self._conn = sqlite3.connect(str(self.path), timeout=busy_timeout_s, isolation_level=None)
        try:
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise StoreError(f"SQLite refused WAL mode for {self.path} (got {mode!r})")
            self._conn.execute("PRAGMA synchronous=FULL")
            self._conn.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            super().__init__()
        except BaseException:
            self._conn.close()
            raise

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        self._conn.execute("BEGIN IMMEDIATE")  # take the write lock up front: no upgrade deadlocks
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        return self._conn.execute(sql, tuple(params)).fetchall()

    def _executemany(self, sql: str, rows: list[tuple]) -> None:
        self._conn.executemany(sql, rows)

    def _day_param(self, day: date) -> str:
        return day.isoformat()

    def _lock_schema(self) -> None:
        pass  # BEGIN IMMEDIATE already holds the database's write lock

    def _now(self) -> str:
        return datetime.now(UTC).isoformat(timespec="seconds")

    def _close(self) -> None:
        self._conn.close()

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r})"


class PostgresStore(RollupStore):
    backend = "postgresql"
    #: Any constant: the advisory lock that serializes schema creation/migration.
    _SCHEMA_LOCK = 0x7472_7565_6770

    def __init__(self, url: str, *, connect_timeout_s: int = 30) -> None:
        try:
            import psycopg
        except ImportError as exc:
            raise StoreError(
                "PostgreSQL stores need the psycopg 3 driver: pip install 'psycopg[binary]>=3.1'"
            ) from exc
        self._psycopg = psycopg
        self.url = url
        try:
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=connect_timeout_s)
        except psycopg.OperationalError as exc:
            raise StoreError(f"cannot connect to PostgreSQL store: {exc}") from exc
        try:
            super().__init__()
        except BaseException:
            self._conn.close()
            raise

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        with self._conn.transaction():
            yield

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("?", "%s")  # our SQL text has no literal '?' or '%'; values never go in the text

    def _execute(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
        with self._conn.cursor() as cur:
            cur.execute(self._sql(sql), tuple(params))
            return cur.fetchall() if cur.description is not None else []

    def _executemany(self, sql: str, rows: list[tuple]) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(self._sql(sql), rows)

    def _lock_schema(self) -> None:
        self._execute("SELECT pg_advisory_xact_lock(?)", (self._SCHEMA_LOCK,))

    def _day_param(self, day: date) -> date:
        return day

    def _close(self) -> None:
        self._conn.close()

    def __repr__(self) -> str:
        return f"PostgresStore({self._conn.info.dsn!r})"
