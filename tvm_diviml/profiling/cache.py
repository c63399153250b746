"""The persistent profile cache (SQLite, never pickle): a second run of the same model measures nothing.

Kernel times are keyed by what makes them valid (the PrimFunc's hash, the target, the device, the
TVM version, the schedule); link figures by the two devices, the host and the TVM version.

Several processes may profile at once: the journal is WAL, writers wait on a busy timeout, each
batch is one short transaction, and rows go in with INSERT OR REPLACE, so no process loses another's
rows. A cache is never worth a crash: a damaged, foreign or unreadable file is moved aside (kept, not
deleted) with a warning, and an empty cache takes its place.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from ..errors import DivimlInputError

log = logging.getLogger(__name__)

FILE_NAME = "profiles.sqlite"
SCHEMA_VERSION = 1  # PRAGMA user_version; another version is moved aside, not migrated
APPLICATION_ID = 0x44564D4C  # PRAGMA application_id, "DVML": tells our file from other SQLite files
BUSY_TIMEOUT_S = 60.0  # how long a writer waits for another process's transaction
KEYS_PER_QUERY = 199  # 5 parameters a key: under the 999 that older SQLite builds allow
SOURCES = ("measured", "tuned")
TABLES = {"kernel_profile", "link_profile"}
SCHEMA = (
    """CREATE TABLE kernel_profile (
        primfunc_hash TEXT NOT NULL, target TEXT NOT NULL, device TEXT NOT NULL, tvm_version TEXT NOT NULL,
        schedule TEXT NOT NULL,
        median_s REAL NOT NULL, spread_s REAL NOT NULL, repeats INTEGER NOT NULL, source TEXT NOT NULL,
        recorded_at REAL NOT NULL,
        PRIMARY KEY (primfunc_hash, target, device, tvm_version, schedule)) WITHOUT ROWID""",
    """CREATE TABLE link_profile (
        src TEXT NOT NULL, dst TEXT NOT NULL, host TEXT NOT NULL, tvm_version TEXT NOT NULL,
        latency_s REAL NOT NULL, bandwidth_Bps REAL NOT NULL, max_rel_error REAL NOT NULL,
        recorded_at REAL NOT NULL,
        PRIMARY KEY (src, dst, host, tvm_version)) WITHOUT ROWID""",
)
# SQLite result codes that mean "this file cannot serve as the cache", as opposed to "try later" (BUSY)
# or "the disk is full" (FULL, IOERR), which moving the file aside would not cure.
UNUSABLE_CODES = {
    sqlite3.SQLITE_CORRUPT,
    sqlite3.SQLITE_NOTADB,
    sqlite3.SQLITE_CANTOPEN,
    sqlite3.SQLITE_READONLY,
    sqlite3.SQLITE_PERM,
}
# Result codes of a write that the disk refused: moving the file aside would not cure them.
UNWRITABLE_CODES = {sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY}
NOT_WRITABLE_HINT = "set DIVIML_CACHE_DIR to a writable directory"

T = TypeVar("T")


def default_cache_dir() -> str:
    """``$DIVIML_CACHE_DIR``, else ``$XDG_CACHE_HOME/tvm-diviml``, else ``~/.cache/tvm-diviml``
    (a relative XDG_CACHE_HOME is ignored, as the XDG specification says)."""
    if os.environ.get("DIVIML_CACHE_DIR"):
        return os.path.expanduser(os.environ["DIVIML_CACHE_DIR"])
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = xdg if os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tvm-diviml")


def tuning_cache_dir() -> str:
    """Where ``--tune`` keeps its MetaSchedule databases (one folder per target), beside the profiles."""
    return os.path.join(default_cache_dir(), "metaschedule")


@dataclass(frozen=True)
class ProfileKey:
    """Everything a kernel's time depends on; a change in any field is a miss, never a stale hit."""

    primfunc_hash: str
    target: str  # canonical JSON of the target dict, or the tag
    device: str  # e.g. "cpu/threads=1", "cuda"
    tvm_version: str
    schedule: str  # "default", "dlight", "tuned:<digest>"


@dataclass
class Measurement:
    median_s: float
    spread_s: float
    repeats: int
    source: str  # "measured" or "tuned"

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"measurement source must be one of {SOURCES}, got {self.source!r}")
        if not (
            math.isfinite(self.median_s)
            and self.median_s >= 0
            and math.isfinite(self.spread_s)
            and self.spread_s >= 0
            and self.repeats >= 1
        ):
            raise ValueError(f"not a measurement (finite times >= 0, repeats >= 1): {self}")


@dataclass(frozen=True)
class LinkKey:
    src: str  # TVM devices, e.g. "cpu:0", "cuda:1"
    dst: str
    host: str  # e.g. platform.node(): the same device names mean other hardware elsewhere
    tvm_version: str


@dataclass
class LinkMeasurement:
    latency_s: float
    bandwidth_Bps: float
    max_rel_error: float


class _Unusable(Exception):
    """The file at the cache path is damaged, foreign or unreadable."""


class ProfileCache:
    """Kernel and link measurements in one SQLite file (``profiles.sqlite`` in ``default_cache_dir()``
    unless ``path`` is given). One object per thread, as for any sqlite3 connection."""

    def __init__(self, path: str | None = None):
        directory = default_cache_dir() if path is None else os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as error:
            raise DivimlInputError(
                f"cannot create the profile cache directory: {error.strerror}", source=directory, hint=NOT_WRITABLE_HINT
            ) from None
        self.path = os.path.join(directory, FILE_NAME) if path is None else path
        self._open()

    # ------------------------------------------------------------------ kernels
    def get_many(
        self, keys: Iterable[ProfileKey], *, recorded_after: float | None = None
    ) -> dict[ProfileKey, Measurement]:
        """The cached measurements of ``keys`` (misses are absent), a few hundred keys per query; with
        ``recorded_after`` (a ``time.time()``) only rows recorded since, older ones being misses."""
        wanted = list(dict.fromkeys(keys))
        since = -math.inf if recorded_after is None else recorded_after

        def read(db: sqlite3.Connection) -> dict[ProfileKey, Measurement]:
            found = {}
            for start in range(0, len(wanted), KEYS_PER_QUERY):
                chunk = wanted[start : start + KEYS_PER_QUERY]
                values = ", ".join(["(?, ?, ?, ?, ?)"] * len(chunk))
                query = (
                    "WITH wanted(primfunc_hash, target, device, tvm_version, schedule) AS (VALUES "
                    + values
                    + ") SELECT primfunc_hash, target, device, tvm_version, schedule,"
                    " median_s, spread_s, repeats, source"
                    " FROM wanted JOIN kernel_profile USING (primfunc_hash, target, device, tvm_version,"
                    " schedule) WHERE recorded_at >= ?"
                )
                for row in db.execute(query, [*(field for key in chunk for field in _columns(key)), since]):
                    try:
                        found[ProfileKey(*row[:5])] = Measurement(*row[5:])
                    except (TypeError, ValueError):  # a row written by hand or another tool
                        log.warning(
                            "profile cache %s: ignoring a damaged row (%s); it will be measured again",
                            self.path,
                            row[5:],
                        )
            return found

        return self._run(read)

    def put_many(self, measurements: dict[ProfileKey, Measurement]) -> None:
        """Store ``measurements`` in one transaction, replacing older rows of the same keys."""
        now = time.time()
        rows = [(*_columns(key), m.median_s, m.spread_s, m.repeats, m.source, now) for key, m in measurements.items()]

        def write(db: sqlite3.Connection) -> None:
            with _write_transaction(db):
                db.executemany("INSERT OR REPLACE INTO kernel_profile VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

        self._run(write)

    # ------------------------------------------------------------------ links
    def get_link(self, key: LinkKey) -> LinkMeasurement | None:
        """The cached figures of a link, or None."""

        def read(db: sqlite3.Connection) -> LinkMeasurement | None:
            row = db.execute(
                "SELECT latency_s, bandwidth_Bps, max_rel_error FROM link_profile"
                " WHERE src = ? AND dst = ? AND host = ? AND tvm_version = ?",
                _columns(key),
            ).fetchone()
            if row is None:
                return None
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in row) or row[0] < 0 or row[1] <= 0:
                log.warning(
                    "profile cache %s: ignoring a damaged link row (%s); it will be measured again", self.path, row
                )
                return None
            return LinkMeasurement(*row)

        return self._run(read)

    def put_link(self, key: LinkKey, measurement: LinkMeasurement) -> None:
        """Store a link's figures, replacing an older row of the same key."""
        row = (*_columns(key), measurement.latency_s, measurement.bandwidth_Bps, measurement.max_rel_error, time.time())

        def write(db: sqlite3.Connection) -> None:
            with _write_transaction(db):
                db.execute("INSERT OR REPLACE INTO link_profile VALUES (?, ?, ?, ?, ?, ?, ?, ?)", row)

        self._run(write)

    # ------------------------------------------------------------------ housekeeping
    def clear(self) -> int:
        """Remove every kernel and link row; returns how many rows went."""

        def delete(db: sqlite3.Connection) -> int:
            with _write_transaction(db):
                return sum(db.execute(f"DELETE FROM {table}").rowcount for table in sorted(TABLES))

        return self._run(delete)

    def stats(self) -> dict:
        """``path``, ``kernel_rows`` and ``link_rows``, for ``diviml cache info``."""

        def count(db: sqlite3.Connection) -> dict:
            return {
                "path": self.path,
                "kernel_rows": db.execute("SELECT count(*) FROM kernel_profile").fetchone()[0],
                "link_rows": db.execute("SELECT count(*) FROM link_profile").fetchone()[0],
            }

        return self._run(count)

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> ProfileCache:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    # ------------------------------------------------------------------ damage
    def _open(self) -> None:
        self.in_memory = False
        try:
            self._db = _connect(self.path)
        except _Unusable:
            self._db = self._recover()
        self._file = _file_identity(self.path)

    def _run(self, operation: Callable[[sqlite3.Connection], T]) -> T:
        """``operation(connection)`` on the file now at ``self.path``: if another process moved ours
        aside, reopen (our rows would go to the moved file otherwise); if the file turns out unusable
        midway, recover and run it once more; if it cannot be written (a full disk, a read-only file
        system), go on in memory."""
        if not self.in_memory and _file_identity(self.path) != self._file:
            self._db.close()
            self._open()
        try:
            return operation(self._db)
        except sqlite3.DatabaseError as error:
            if _is_unwritable(error) and not self.in_memory:
                self._db.close()
                self._db = self._in_memory(error)
                return operation(self._db)
            if not _is_unusable(error):
                raise
        self._db.close()
        self._open()
        return operation(self._db)

    def _in_memory(self, problem: object) -> sqlite3.Connection:
        """An empty cache in memory, for a file that cannot be written: the run goes on and measures
        what it needs, keeping nothing for the next one (the warning says how to fix it)."""
        log.warning(
            "profile cache %s cannot be written (%s): this run's measurements are not kept; free space, fix the "
            "permissions or %s",
            self.path,
            problem,
            NOT_WRITABLE_HINT,
        )
        self.in_memory = True
        return _connect(":memory:")

    def _recover(self) -> sqlite3.Connection:
        """Move the unusable file aside and start an empty cache. Under a lock and after checking again,
        so that of two processes that found the same damage, the second uses the first one's new file
        instead of moving it aside too. Where no file can be made there, an empty cache in memory."""
        try:
            with _exclusive_lock(self.path + ".lock"):
                try:
                    return _connect(self.path)
                except _Unusable as problem:
                    if os.path.lexists(self.path):
                        aside = _move_aside(self.path)
                        log.warning(
                            "profile cache %s is unusable (%s): moved it to %s and started an empty cache",
                            self.path,
                            problem,
                            aside,
                        )
                return _connect(self.path)
        except (OSError, _Unusable) as error:
            return self._in_memory(getattr(error, "strerror", None) or error)


def _columns(key: ProfileKey | LinkKey) -> tuple[str, ...]:
    """The key's fields in column order (``dataclasses.astuple`` deep-copies: many times slower)."""
    return tuple(getattr(key, field.name) for field in dataclasses.fields(key))


def _file_identity(path: str) -> tuple[int, int] | None:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return status.st_dev, status.st_ino


def _is_unusable(error: sqlite3.DatabaseError) -> bool:
    return (getattr(error, "sqlite_errorcode", 0) or 0) & 0xFF in UNUSABLE_CODES


def _is_unwritable(error: sqlite3.DatabaseError) -> bool:
    """A write the disk refused: full, an I/O error, or a file system mounted read-only."""
    return (getattr(error, "sqlite_errorcode", 0) or 0) & 0xFF in UNWRITABLE_CODES


def _connect(path: str) -> sqlite3.Connection:
    """Open the cache at ``path``: checked, with the schema created if the file is new, in WAL mode;
    raises _Unusable if the file is damaged, foreign or unreadable, without changing it."""
    try:
        db = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
    except sqlite3.DatabaseError as error:
        raise _Unusable(str(error)) from None
    try:
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise _Unusable(f"damaged: {check}")
        with _write_transaction(db):
            _create_or_check_schema(db)
        # Only now, so that a foreign file moved aside is the user's file unchanged.
        _switch_to_wal(db)
        db.execute("PRAGMA synchronous = NORMAL")  # safe under WAL; a power cut may drop the last batch
    except sqlite3.DatabaseError as error:
        db.close()
        if _is_unusable(error):
            raise _Unusable(str(error)) from None
        raise
    except _Unusable:
        db.close()
        raise
    return db


def _switch_to_wal(db: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode = WAL``, retried while another process holds the file: the switch needs
    the file to itself, and SQLite answers "database is locked" at once instead of using the busy
    timeout (two processes opening a new cache together hit it)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as error:
            busy = (getattr(error, "sqlite_errorcode", 0) or 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            if not busy or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _create_or_check_schema(db: sqlite3.Connection) -> None:
    """Make an empty file ours; accept only our own tables and schema version in any other."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    application = db.execute("PRAGMA application_id").fetchone()[0]
    tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables and version == 0 and application == 0:
        for statement in SCHEMA:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    elif (application, version, tables) != (APPLICATION_ID, SCHEMA_VERSION, TABLES):
        raise _Unusable(
            f"not a tvm-diviml profile cache of schema version {SCHEMA_VERSION}"
            f" (application_id {application:#x}, user_version {version}, tables {sorted(tables)})"
        )


@contextlib.contextmanager
def _write_transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE takes the write lock up front, so the busy timeout applies and two writers
    never deadlock upgrading a read lock."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


@contextlib.contextmanager
def _exclusive_lock(path: str) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _move_aside(path: str) -> str:
    """Rename ``path`` (and its WAL files, which belong to it) to ``<path>.corrupt-<timestamp>``."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside, n = f"{path}.corrupt-{stamp}", 1
    while os.path.lexists(aside):
        n += 1
        aside = f"{path}.corrupt-{stamp}-{n}"
    for suffix in ("-wal", "-shm", ""):
        if os.path.lexists(path + suffix):
            os.replace(path + suffix, aside + suffix)
    return aside
