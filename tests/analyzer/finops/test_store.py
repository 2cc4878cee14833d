"""Daily rollup store: the same tests against SQLite (a temp file) and a real PostgreSQL server.

PostgreSQL is started by the tests (tests/pgserver.py) and never skipped: missing server
binaries or driver fail with the install command.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import date, timedelta
from pathlib import Path

import pandas as pd
import pytest

from analyzer.finops.costs import ROLLUP_COLUMNS, ROLLUP_KEY_COLUMNS
from analyzer.finops.store import (
    SCHEMA_VERSION,
    PostgresStore,
    SqliteStore,
    StoreError,
    open_store,
)
from tests.conftest import ROOT
from tests.pgserver import create_database, postgres_server

D0 = date(2024, 3, 1)
METRICS = ["allocated_gpu_hours", "effective_gpu_hours", "cost"]  # in ROLLUP_COLUMNS order
_db_counter = itertools.count()


@pytest.fixture(scope="module")
def pg_server():
    with postgres_server() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request, tmp_path) -> str:
    """A fresh, empty store per test: a SQLite file, or a new database on the module's PostgreSQL."""
    if request.param == "sqlite":
        return str(tmp_path / "history" / "rollups.db")
    server = request.getfixturevalue("pg_server")
    return create_database(server, f"t{next(_db_counter)}_{os.getpid()}")


def rows_for(keys, scale: float = 1.0, group_by: str | None = None) -> pd.DataFrame:
    n = len(keys)
    df = pd.DataFrame({
        "group": list(keys),
        "cost": [scale * (i + 1) * 2.25 for i in range(n)],
        "effective_gpu_hours": [scale * (i + 1) * 0.5 for i in range(n)],
        "allocated_gpu_hours": [scale * (i + 1) for i in range(n)],
    })
    if group_by is not None:
        df.insert(0, "group_by", group_by)
    return df


def as_dict(df: pd.DataFrame, extra=()) -> dict:
    return {tuple(r[c] for c in (*extra, "group")): tuple(r[m] for m in METRICS) for _, r in df.iterrows()}


# -- API and persistence -------------------------------------------------------------------------

def test_round_trip_and_reopen(store_url):
    with open_store(store_url) as store:
        assert store.days("namespace") == []
        assert store.read(D0, D0, "namespace").empty
        store.write_day(D0, "namespace", rows_for(["ml-train", "infer"]))
        store.write_day(D0.isoformat(), "pod", rows_for(["p1"], scale=7, group_by="pod"))
        got = store.read(D0, D0, "namespace", per_day=True)
        assert list(got.columns) == ["day", "group_by", "group", "model", *METRICS]
        assert got["day"].tolist() == [D0.isoformat()] * 2 and got["model"].tolist() == ["", ""]
        assert set(got["group_by"]) == {"namespace"}
        assert as_dict(got) == as_dict(rows_for(["ml-train", "infer"]))
    # a second process-lifetime: everything committed is there, schema not recreated
    with open_store(store_url) as store:
        assert store.schema_version() == SCHEMA_VERSION
        assert store.days("namespace") == [D0] and store.days("pod") == [D0]
        assert store.group_bys() == ["namespace", "pod"]
        pod = store.read(D0, D0, "pod")
        assert list(pod.columns) == ["group_by", "group", *METRICS]
        assert as_dict(pod) == {("p1",): (7.0, 3.5, 15.75)}


def test_key_column_named_after_group_by_and_nan(store_url):
    rows = pd.DataFrame({"day": [D0.isoformat()] * 2, "namespace": ["a", "b"],
                         "gpu_hours": [1.0, float("nan")], "cost_usd": [2, 3]})
    with open_store(store_url) as store:
        store.write_day(D0, "namespace", rows)
        got = store.read(D0, D0 + timedelta(days=3), "namespace")
    assert got["group"].tolist() == ["a", "b"]
    assert got["cost_usd"].tolist() == [2.0, 3.0]
    assert got["gpu_hours"].iloc[0] == 1.0 and pd.isna(got["gpu_hours"].iloc[1])


def daily_rollup_frame(days: int, groups: list[str], group_by: str = "namespace") -> pd.DataFrame:
    """A frame shaped like ``costs.daily_rollups``: ROLLUP_COLUMNS, several days, currency in attrs."""
    values = [c for c in ROLLUP_COLUMNS if c not in ROLLUP_KEY_COLUMNS]
    recs = []
    for d in range(days):
        for g, group in enumerate(groups):
            base = {"day": (D0 + timedelta(days=d)).isoformat(), "group_by": group_by, "group": group,
                    "model": "NVIDIA H100 80GB HBM3" if g % 2 else "NVIDIA A100-SXM4-80GB"}
            recs.append(base | {c: float((d + 1) * (g + 1) * (j + 1)) / 8 for j, c in enumerate(values)})
    df = pd.DataFrame(recs, columns=list(ROLLUP_COLUMNS))
    df.attrs.update(currency="USD", cluster="")
    return df


def test_daily_rollups_frames_round_trip(store_url):
    rows = daily_rollup_frame(3, ["(unallocated)", "ml", "web"])
    with open_store(store_url) as store:
        assert store.write_rollups(rows) == [("namespace", D0 + timedelta(days=d)) for d in range(3)]
        back = store.read(D0, D0 + timedelta(days=2), "namespace", per_day=True)
        assert list(back.columns) == list(ROLLUP_COLUMNS)  # same schema out as in
        pd.testing.assert_frame_equal(back, rows, check_dtype=False)
        assert back.attrs == {"cluster": "", "currency": "USD"}
        total = store.read(D0, D0 + timedelta(days=2), "namespace")
        values = list(ROLLUP_COLUMNS[len(ROLLUP_KEY_COLUMNS):])
        assert list(total.columns) == ["group_by", "group", *values]  # summed over days and models
        expected = rows.groupby("group")[values].sum()
        assert total.set_index("group")[values].to_numpy() == pytest.approx(expected.to_numpy())
        # an empty daily_rollups frame writes nothing; other currencies are refused, as columns or attrs
        assert store.write_rollups(rows.iloc[:0]) == []
        eur = daily_rollup_frame(1, ["ml"])
        eur.attrs["currency"] = "EUR"
        with pytest.raises(ValueError, match="currency"):
            store.write_rollups(eur)
        with pytest.raises(ValueError, match="currency"):
            store.write_day(D0, "namespace", rows_for(["ml"]).assign(currency="EUR"))
        store.write_day(D0, "namespace", rows_for(["ml"]).assign(currency="USD", cluster=""))
        assert store.metadata() == {"cluster": "", "currency": "USD"}
        assert store.read(D0, D0, "namespace")["group"].tolist() == ["ml"]


def test_rewrite_of_a_day_replaces_it(store_url):
    with open_store(store_url) as store:
        store.write_day(D0, "namespace", rows_for(["a", "b", "c"]))
        store.write_day(D0 + timedelta(days=1), "namespace", rows_for(["a"], scale=3))
        store.write_day(D0, "namespace", rows_for(["b", "d"], scale=10))  # re-run of the same day
        store.write_day(D0, "namespace", rows_for(["b", "d"], scale=10))  # and again: idempotent
        assert store.days("namespace") == [D0, D0 + timedelta(days=1)]
        day0 = store.read(D0, D0, "namespace", per_day=True)
        assert as_dict(day0) == as_dict(rows_for(["b", "d"], scale=10))
        day1 = store.read(D0 + timedelta(days=1), D0 + timedelta(days=1), "namespace")
        assert as_dict(day1) == as_dict(rows_for(["a"], scale=3))  # other days untouched
        store.write_day(D0, "namespace", rows_for([]))  # a re-run that found nothing empties the day
        assert store.read(D0, D0, "namespace").empty
        assert store.days("namespace") == [D0, D0 + timedelta(days=1)]


def test_range_reaggregates_sums_per_key(store_url):
    written = []
    with open_store(store_url) as store:
        for i in range(6):
            day = D0 + timedelta(days=i)
            keys = ["a", "b", "c"][: 1 + i % 3]  # keys come and go
            df = rows_for(keys, scale=i + 1)
            store.write_day(day, "job", df)
            store.write_day(day, "namespace", rows_for(["a"], scale=1000))  # other group_by: never mixed in
            written.append(df.assign(day=day))
        got = store.read(D0 + timedelta(days=1), D0 + timedelta(days=4), "job")  # inclusive both ends
        per_day = store.read(D0 + timedelta(days=1), D0 + timedelta(days=4), "job", per_day=True)
        assert store.read(D0 + timedelta(days=10), D0 + timedelta(days=20), "job").empty
        with pytest.raises(ValueError, match="before"):
            store.read(D0 + timedelta(days=2), D0, "job")
    frame = pd.concat(written)
    window = frame[(frame["day"] >= D0 + timedelta(days=1)) & (frame["day"] <= D0 + timedelta(days=4))]
    expected = window.groupby("group")[METRICS].sum().reset_index()
    assert got["group"].tolist() == expected["group"].tolist()
    for m in METRICS:
        assert got[m].tolist() == pytest.approx(expected[m].tolist())
    assert len(per_day) == len(window)
    assert per_day.groupby("group")[METRICS].sum().reset_index()[METRICS].to_numpy() == pytest.approx(
        expected[METRICS].to_numpy())


def test_rows_per_model_of_one_group(store_url):
    """One group on two GPU models is two rows of a day; a repeated (group, model) is refused."""
    rows = rows_for(["ml", "ml", "web"]).assign(model=["H100", "A100", "H100"])
    with open_store(store_url) as store:
        store.write_day(D0, "namespace", rows)
        per_day = store.read(D0, D0, "namespace", per_day=True)
        assert list(zip(per_day["group"], per_day["model"], strict=True)) == [
            ("ml", "A100"), ("ml", "H100"), ("web", "H100")]
        total = store.read(D0, D0, "namespace")
        assert total.set_index("group")["cost"].to_dict() == pytest.approx({"ml": 2.25 + 4.5, "web": 6.75})
        with pytest.raises(ValueError, match=r"\(group key, model\) must be unique.*'ml', 'H100'"):
            store.write_day(D0, "namespace", rows.assign(model="H100"))


def test_version_1_store_is_migrated(store_url):
    """A version 1 store (before rows kept their model, and "workload" was "job") opens migrated."""
    v1 = {
        "sqlite": ("TEXT", "REAL"),
        "postgresql": ("DATE", "DOUBLE PRECISION"),
    }
    backend = "sqlite" if "://" not in store_url else "postgresql"
    day_type, value_type = v1[backend]
    with open_store(store_url) as store:
        d = store._day_param(D0)
        with store._transaction():
            store._execute("DROP TABLE truegpu_rollup_values")
            store._execute(f"""CREATE TABLE truegpu_rollup_values (group_by TEXT NOT NULL, day {day_type} NOT NULL,
                group_key TEXT NOT NULL, metric TEXT NOT NULL, value {value_type},
                PRIMARY KEY (group_by, day, group_key, metric))""")
            store._execute("INSERT INTO truegpu_rollup_values VALUES ('namespace', ?, 'ml', 'cost', 9.5)", (d,))
            store._execute("INSERT INTO truegpu_rollup_days VALUES ('namespace', ?, 1, ?)", (d, store._now()))
            store._execute("INSERT INTO truegpu_rollup_values VALUES ('job', ?, 'train', 'cost', 4.0)", (d,))
            store._execute("INSERT INTO truegpu_rollup_days VALUES ('job', ?, 1, ?)", (d, store._now()))
            store._execute("UPDATE truegpu_schema_version SET version = 1")
    with open_store(store_url) as store:
        assert store.schema_version() == SCHEMA_VERSION == 3
        got = store.read(D0, D0, "namespace", per_day=True)
        assert got[["group", "model", "cost"]].values.tolist() == [["ml", "", 9.5]]
        # rows grouped by the workload were written under its old label name "job"
        assert store.group_bys() == ["namespace", "workload"] and store.days("workload") == [D0]
        assert store.read(D0, D0, "workload")[["group", "cost"]].values.tolist() == [["train", 4.0]]
        store.write_day(D0, "namespace", rows_for(["ml", "ml"]).assign(model=["H100", "A100"]))
        assert store.read(D0, D0, "namespace", per_day=True)["model"].tolist() == ["A100", "H100"]


HOSTILE = [
    "'; DROP TABLE truegpu_rollup_values; --",
    "Robert'); DELETE FROM truegpu_rollup_days WHERE ('1'='1",
    'double"quote',
    "%s",
    "%(day)s",
    "?",
    "back\\slash",
    "new\nline\ttab",
    "ns/pod-with-slash",
    "名前-ünïcødé-🚀",
    "",
    "   ",
    "x" * 5000,
]


def test_hostile_group_keys_round_trip(store_url):
    hostile_group_by = "pod'); DROP TABLE truegpu_schema_version; --"
    rows = rows_for(HOSTILE)
    rows = rows.rename(columns={"cost": "cost'; DROP TABLE x; --"})
    with open_store(store_url) as store:
        store.write_day(D0, hostile_group_by, rows)
        store.write_day(D0, "namespace", rows_for(["safe"]))
    with open_store(store_url) as store:  # tables all still there
        assert store.schema_version() == SCHEMA_VERSION
        assert store.days(hostile_group_by) == [D0] and store.days("namespace") == [D0]
        got = store.read(D0, D0, hostile_group_by).set_index("group")
        assert sorted(got.index) == sorted(HOSTILE)
        for _, r in rows.iterrows():
            assert got.loc[r["group"], "cost'; DROP TABLE x; --"] == r["cost'; DROP TABLE x; --"]
            assert got.loc[r["group"], "allocated_gpu_hours"] == r["allocated_gpu_hours"]
        assert store.read(D0, D0, "namespace")["group"].tolist() == ["safe"]
        with pytest.raises(ValueError, match="NUL"):  # PostgreSQL text cannot hold NUL: refused on both
            store.write_day(D0, "pod", rows_for(["bad\x00key"]))


def test_newer_schema_is_refused(store_url):
    with open_store(store_url) as store, store._transaction():
        store._execute("UPDATE truegpu_schema_version SET version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="newer"):
        open_store(store_url)


def test_concurrent_writers_do_not_corrupt(store_url):
    contested = D0
    versions = {
        "A": rows_for([f"a{i}" for i in range(40)], scale=1),
        "B": rows_for([f"b{i}" for i in range(25)], scale=2),
    }
    expected = {name: as_dict(df) for name, df in versions.items()}
    errors: list[BaseException] = []
    stop = threading.Event()
    reads = 0

    def writer(name: str, own_day: date) -> None:
        try:
            with open_store(store_url) as store:
                for i in range(15):
                    store.write_day(contested, "namespace", versions[name])
                    store.write_day(own_day + timedelta(days=i), "namespace", rows_for([name, "x"], scale=i))
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        nonlocal reads
        try:
            with open_store(store_url) as store:
                while not stop.is_set():
                    got = store.read(contested, contested, "namespace")
                    if len(got):
                        assert as_dict(got) in expected.values(), "a read saw a mix of two writes"
                    reads += 1
        except BaseException as exc:
            errors.append(exc)

    with open_store(store_url):  # schema first, as a deployment would
        pass
    threads = [threading.Thread(target=writer, args=(name, D0 + timedelta(days=100 * (n + 1))))
               for n, name in enumerate(["A", "B", "A", "B"])]
    watcher = threading.Thread(target=reader)
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    stop.set()
    watcher.join(timeout=60)
    assert not errors, errors
    assert reads > 0
    with open_store(store_url) as store:
        assert as_dict(store.read(contested, contested, "namespace")) in expected.values()
        days = store.days("namespace")
        assert len(days) == 1 + 4 * 15  # the contested day + each writer's own days
        for day in days[1:]:
            got = store.read(day, day, "namespace", per_day=True)
            assert len(got) == 2 and sorted(got["group"]) in (["A", "x"], ["B", "x"])


# -- kill -9 mid-write ------------------------------------------------------------------------------

N_KEYS = 3000
CHILD = textwrap.dedent("""
    import os, signal, sys
    from datetime import date, timedelta
    import pandas as pd
    from analyzer.finops.store import open_store

    url, first, n_keys, mode = sys.argv[1], date.fromisoformat(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    keys = [f"pod-{k}" for k in range(n_keys)]

    def rows(day, bonus=0.0):
        n = (day - date(2024, 3, 1)).days
        return pd.DataFrame({"key": keys, "gpu_hours": [float(n + 1) + bonus] * n_keys,
                             "cost_usd": [float(k) for k in range(n_keys)]})

    with open_store(url) as store:
        if mode == "die-rewriting":
            # rewrite an already committed day with other values and die in the middle of the
            # transaction: its old rows are deleted and half the new ones inserted, uncommitted
            insert = store._executemany
            def half_then_die(sql, values):
                insert(sql, values[: len(values) // 2])
                print("half", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            store._executemany = half_then_die
            store.write_day(first, "pod", rows(first, bonus=1000.0))
        for i in range(100000):
            day = first + timedelta(days=i)
            print("begin", day.isoformat(), flush=True)
            store.write_day(day, "pod", rows(day))
            print("done", day.isoformat(), flush=True)
""")


def _check_day(store, day: date) -> None:
    n = (day - D0).days
    got = store.read(day, day, "pod", per_day=True)
    assert len(got) == N_KEYS, f"{day}: {len(got)} of {N_KEYS} rows"
    assert set(got["group"]) == {f"pod-{k}" for k in range(N_KEYS)}
    assert got["gpu_hours"].sum() == N_KEYS * (n + 1), day
    assert got["cost_usd"].sum() == N_KEYS * (N_KEYS - 1) / 2, day


def _run_writer(store_url: str, first: date, mode: str, kill_after: int | None, delay_frac: float):
    """Run the writer child; SIGKILL it ``delay_frac`` of a write after its ``kill_after``-th commit."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", CHILD, store_url, first.isoformat(), str(N_KEYS), mode],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    events: list[str] = []
    try:
        if kill_after is not None:
            done: list[float] = []
            while len(done) < kill_after:
                line = proc.stdout.readline()
                if not line:
                    pytest.fail(f"writer exited early ({proc.wait()}): {proc.stderr.read()[-3000:]}")
                events.append(line.strip())
                if line.startswith("done"):
                    done.append(time.monotonic())
            time.sleep((done[-1] - done[0]) / (len(done) - 1) * delay_frac)
    finally:
        if kill_after is not None:
            proc.send_signal(signal.SIGKILL)
        rest, err = proc.communicate(timeout=120)
    events += rest.split("\n")[:-1]  # the piece after the last newline is empty, or a line the kill cut short
    assert proc.returncode == -signal.SIGKILL, err[-3000:]
    return events


def _check_store(store_url: str, committed: set[date]) -> list[date]:
    with open_store(store_url) as store:
        days = store.days("pod")
        assert committed <= set(days), sorted(committed - set(days))  # every commit survived the kill
        assert days == [D0 + timedelta(days=i) for i in range(len(days))]
        for day in days:  # and every day is complete: no partial write is visible
            _check_day(store, day)
    return days


def test_kill_9_mid_write_loses_nothing_committed(store_url):
    with open_store(store_url):
        pass
    first, committed, mid_write = D0, set(), 0
    for round_ in range(3):
        events = _run_writer(store_url, first, "loop", kill_after=4, delay_frac=0.2 + 0.3 * round_)
        done = {date.fromisoformat(e.split()[1]) for e in events if e.startswith("done")}
        mid_write += events[-1].startswith("begin")
        committed |= done
        days = _check_store(store_url, committed)
        assert len(days) - len(committed) in (0, 1)  # the write being killed may have committed, nothing more
        committed, first = set(days), days[-1] + timedelta(days=1)
    print(f"{mid_write} of 3 timed kills landed inside write_day")

    # deterministic: killed inside the transaction rewriting a committed day -> the old day is intact
    events = _run_writer(store_url, days[-1], "die-rewriting", kill_after=None, delay_frac=0)
    assert events == ["half"]
    assert _check_store(store_url, committed) == days

    # the store is writable afterwards (no lock left behind by the killed writers)
    with open_store(store_url) as store:
        store.write_day(days[-1], "pod", pd.DataFrame({"key": ["after"], "gpu_hours": [1.0], "cost_usd": [1.0]}))
        assert store.read(days[-1], days[-1], "pod")["group"].tolist() == ["after"]


# -- opening -------------------------------------------------------------------------------------------

def test_open_store_spellings(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open_store(tmp_path / "a.db") as s:
        assert isinstance(s, SqliteStore) and s.path == tmp_path / "a.db"
    with open_store(f"sqlite:///{tmp_path}/b.db") as s:  # sqlite:/// + absolute path = sqlite:////abs
        assert s.path == tmp_path / "b.db"
    with open_store("sqlite:///rel/c.db") as s:
        assert s.path == Path("rel/c.db") and (tmp_path / "rel" / "c.db").exists()
    with open_store(str(tmp_path / "d.db")) as s:
        mode = s._execute("PRAGMA journal_mode")[0][0]
        sync = s._execute("PRAGMA synchronous")[0][0]
        assert (mode, sync) == ("wal", 2)  # WAL, FULL
    s.close()  # closing twice is fine
    with pytest.raises(StoreError, match="closed"):
        s.days("pod")
    with pytest.raises(StoreError, match="unsupported"):
        open_store("mysql://x/y")
    with pytest.raises(StoreError, match="cannot connect"):
        PostgresStore("postgresql://nobody@127.0.0.1:1/none", connect_timeout_s=2)


def test_bad_rows_are_refused(tmp_path):
    with open_store(tmp_path / "s.db") as store:
        with pytest.raises(ValueError, match="unique"):
            store.write_day(D0, "pod", rows_for(["a", "a"]))
        with pytest.raises(ValueError, match="numeric"):
            store.write_day(D0, "pod", rows_for(["a"]).assign(sku="h100-sxm"))
        with pytest.raises(ValueError, match="key column"):
            store.write_day(D0, "pod", rows_for(["a"]).rename(columns={"group": "job"}))
        with pytest.raises(ValueError, match="2024-03-02"):
            store.write_day(D0, "pod", rows_for(["a"]).assign(day="2024-03-02"))
        with pytest.raises(ValueError, match="group_by"):
            store.write_day(D0, "pod", rows_for(["a"], group_by="namespace"))
        assert store.days("pod") == []


def test_missing_postgresql_fails_with_the_install_command(monkeypatch):
    import tests.pgserver as pgserver

    monkeypatch.setattr(pgserver.shutil, "which", lambda name: None)
    monkeypatch.setattr(pgserver.glob, "glob", lambda pattern: [])
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y postgresql"):
        pgserver.find_pg_bindir()
