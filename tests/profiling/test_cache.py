"""The profile cache: hits, persistence, two writer processes, and damaged files moved aside, not lost."""

from __future__ import annotations

import logging
import multiprocessing
import os
import random
import sqlite3
import time

import pytest

from tvm_diviml.errors import DivimlInputError
from tvm_diviml.profiling.cache import (
    SCHEMA_VERSION,
    LinkKey,
    LinkMeasurement,
    Measurement,
    ProfileCache,
    ProfileKey,
    _move_aside,
    default_cache_dir,
)

LINK = LinkKey("cpu:0", "cuda:0", "host-1", "0.27.0")


def key(name: str, schedule: str = "default") -> ProfileKey:
    return ProfileKey(name, '{"kind": "llvm"}', "cpu/threads=1", "0.27.0", schedule)


def measurement(seconds: float, source: str = "measured") -> Measurement:
    return Measurement(seconds, seconds / 100, 5, source)


def test_miss_then_hit(tmp_path):
    with ProfileCache(str(tmp_path / "c.sqlite")) as cache:
        assert cache.get_many([key("a")]) == {}
        cache.put_many({key("a"): measurement(1e-3), key("b"): measurement(2e-3, "tuned")})
        assert cache.get_many([key("a"), key("b"), key("c")]) == {
            key("a"): measurement(1e-3),
            key("b"): measurement(2e-3, "tuned"),
        }
        assert cache.get_many([key("a", schedule="dlight")]) == {}  # every field of the key counts
        assert cache.get_link(LINK) is None
        cache.put_link(LINK, LinkMeasurement(1e-5, 1.2e10, 0.01))
        assert cache.get_link(LINK) == LinkMeasurement(1e-5, 1.2e10, 0.01)


def test_rows_older_than_asked_are_misses(tmp_path):
    with ProfileCache(str(tmp_path / "c.sqlite")) as cache:
        cache.put_many({key("old"): measurement(1e-3)})
        cutoff = time.time()
        time.sleep(0.01)
        cache.put_many({key("new"): measurement(2e-3)})
        assert cache.get_many([key("old"), key("new")], recorded_after=cutoff) == {key("new"): measurement(2e-3)}
        assert set(cache.get_many([key("old"), key("new")])) == {key("old"), key("new")}


def test_many_keys_and_replacement(tmp_path):
    """More keys than one query takes, duplicates in the request, and a newer row replacing an older."""
    keys = [key(f"k{i}") for i in range(1000)]
    with ProfileCache(str(tmp_path / "c.sqlite")) as cache:
        cache.put_many({k: measurement(1e-6 * (i + 1)) for i, k in enumerate(keys)})
        cache.put_many({keys[0]: measurement(5.0)})
        found = cache.get_many(keys + keys[:10] + [key("absent")])
    assert len(found) == 1000 and found[keys[0]] == measurement(5.0) and found[keys[999]] == measurement(1e-3)


def test_persists_across_objects_and_is_wal(tmp_path):
    path = str(tmp_path / "c.sqlite")
    with ProfileCache(path) as cache:
        cache.put_many({key("a"): measurement(1e-3)})
        cache.put_link(LINK, LinkMeasurement(1e-5, 1.2e10, 0.01))
    with ProfileCache(path) as cache:
        assert cache.get_many([key("a")]) == {key("a"): measurement(1e-3)}
        assert cache.get_link(LINK) == LinkMeasurement(1e-5, 1.2e10, 0.01)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    db.close()


def test_clear_and_stats(tmp_path):
    path = str(tmp_path / "c.sqlite")
    with ProfileCache(path) as cache:
        cache.put_many({key(f"k{i}"): measurement(1e-3) for i in range(7)})
        cache.put_link(LINK, LinkMeasurement(1e-5, 1.2e10, 0.01))
        assert cache.stats() == {"path": path, "kernel_rows": 7, "link_rows": 1}
        assert cache.clear() == 8
        assert cache.stats() == {"path": path, "kernel_rows": 0, "link_rows": 0}
        assert cache.get_many([key("k0")]) == {} and cache.get_link(LINK) is None


def test_measurement_rejects_what_is_not_one():
    with pytest.raises(ValueError, match="source"):
        Measurement(1e-3, 0.0, 3, "guessed")
    for median, spread, repeats in [(float("nan"), 0.0, 3), (-1.0, 0.0, 3), (1e-3, float("inf"), 3), (1e-3, 0.0, 0)]:
        with pytest.raises(ValueError, match="not a measurement"):
            Measurement(median, spread, repeats, "measured")


# ---------------------------------------------------------------------- where the cache lives
def test_default_dir_honours_diviml_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path / "here"))
    assert default_cache_dir() == str(tmp_path / "here")
    with ProfileCache() as cache:
        assert cache.path == str(tmp_path / "here" / "profiles.sqlite")
        cache.put_many({key("a"): measurement(1e-3)})
    assert os.path.isfile(tmp_path / "here" / "profiles.sqlite")


def test_default_dir_falls_back_to_xdg_then_home(tmp_path, monkeypatch):
    monkeypatch.delenv("DIVIML_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "tvm-diviml")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # the XDG spec: ignore it
    assert default_cache_dir() == str(tmp_path / "home" / ".cache" / "tvm-diviml")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == str(tmp_path / "home" / ".cache" / "tvm-diviml")


def test_uncreatable_directory_names_it_and_says_what_to_do(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DIVIML_CACHE_DIR", str(blocker / "cache"))
    with pytest.raises(DivimlInputError) as error:
        ProfileCache()
    assert str(blocker / "cache") in str(error.value) and "DIVIML_CACHE_DIR" in str(error.value)


# ---------------------------------------------------------------------- two processes at once
def write_keys(path: str, writer: str, start_together) -> None:
    """300 keys of its own and 5 shared with the other writer, in 30 transactions, each read back."""
    start_together.wait()
    with ProfileCache(path) as cache:
        for first in range(0, 300, 10):
            batch = {key(f"{writer}-{i}"): measurement(1e-6 * (i + 1)) for i in range(first, first + 10)}
            batch.update({key(f"shared-{i}"): measurement(1.0 if writer == "a" else 2.0) for i in range(5)})
            cache.put_many(batch)
            assert cache.get_many(batch).keys() == batch.keys()


def test_two_writer_processes_lose_nothing(tmp_path):
    """Both processes also create the file at the same moment."""
    path = str(tmp_path / "c.sqlite")
    context = multiprocessing.get_context("spawn")
    start_together = context.Barrier(2)
    writers = [context.Process(target=write_keys, args=(path, name, start_together)) for name in "ab"]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
    assert [process.exitcode for process in writers] == [0, 0]
    with ProfileCache(path) as cache:
        assert cache.stats()["kernel_rows"] == 605
        found = cache.get_many([key(f"{w}-{i}") for w in "ab" for i in range(300)])
        assert len(found) == 600 and found[key("b-299")] == measurement(3e-4)
        shared = cache.get_many([key(f"shared-{i}") for i in range(5)])
        assert {m.median_s for m in shared.values()} <= {1.0, 2.0} and len(shared) == 5
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    db.close()


def test_follows_the_path_when_another_process_moved_the_file_aside(tmp_path):
    path = str(tmp_path / "c.sqlite")
    with ProfileCache(path) as first:
        first.put_many({key("old"): measurement(1e-3)})
        _move_aside(path)  # as another process's recovery would
        with ProfileCache(path) as second:
            second.put_many({key("new"): measurement(2e-3)})
            first.put_many({key("late"): measurement(3e-3)})
            assert second.get_many([key("old"), key("new"), key("late")]).keys() == {key("new"), key("late")}


# ---------------------------------------------------------------------- damaged files
def random_bytes(path):
    path.write_bytes(random.Random(0).randbytes(8192))


def truncated_cache(path):
    with ProfileCache(str(path)) as cache:
        cache.put_many({key(f"k{i}"): measurement(1e-3) for i in range(2000)})
    with open(path, "r+b") as handle:
        handle.truncate(path.stat().st_size // 2)


def foreign_database(path):
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE users (name TEXT)")
    db.execute("INSERT INTO users VALUES ('ada')")
    db.execute("PRAGMA user_version = 7")
    db.commit()
    db.close()


def directory_in_its_place(path):
    path.mkdir()
    (path / "inside").write_text("kept")


def unreadable_file(path):
    truncated_cache(path)
    path.chmod(0)


@pytest.mark.parametrize(
    "damage",
    [
        random_bytes,
        truncated_cache,
        foreign_database,
        directory_in_its_place,
        pytest.param(unreadable_file, marks=pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")),
    ],
)
def test_damaged_file_is_moved_aside_with_a_warning(tmp_path, caplog, damage):
    path = tmp_path / "c.sqlite"
    damage(path)
    before = path.read_bytes() if path.is_file() and os.access(path, os.R_OK) else None
    with caplog.at_level(logging.WARNING, logger="tvm_diviml.profiling.cache"):
        cache = ProfileCache(str(path))
    with cache:
        cache.put_many({key("a"): measurement(1e-3)})
        assert cache.get_many([key("a")]) == {key("a"): measurement(1e-3)}
    aside = [p for p in tmp_path.glob("c.sqlite.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1
    assert [r.levelno for r in caplog.records] == [logging.WARNING]
    assert str(path) in caplog.records[0].getMessage() and aside[0].name in caplog.records[0].getMessage()
    if before is not None:
        assert aside[0].read_bytes() == before
    if damage is foreign_database:
        db = sqlite3.connect(aside[0])
        assert db.execute("SELECT name FROM users").fetchall() == [("ada",)]
        db.close()
    if damage is directory_in_its_place:
        assert (aside[0] / "inside").read_text() == "kept"


def test_two_processes_recovering_one_damaged_file_both_go_on(tmp_path):
    """Both open the same damaged file at once: each ends with a working cache, the damaged bytes are kept
    aside, and every row both wrote is in the file that stays."""
    path = tmp_path / "c.sqlite"
    random_bytes(path)
    damaged = path.read_bytes()
    context = multiprocessing.get_context("spawn")
    start_together = context.Barrier(2)
    writers = [context.Process(target=write_keys, args=(str(path), name, start_together)) for name in "ab"]
    for process in writers:
        process.start()
    for process in writers:
        process.join(120)
    assert [process.exitcode for process in writers] == [0, 0]
    aside = [p for p in tmp_path.glob("c.sqlite.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert aside and damaged in [p.read_bytes() for p in aside if p.is_file()]
    with ProfileCache(str(path)) as cache:
        found = cache.get_many([key(f"{w}-{i}") for w in "ab" for i in range(300)])
        assert len(found) == 600, len(found)


def test_damage_found_while_a_cache_is_open_is_recovered_and_the_open_cache_follows(tmp_path, caplog):
    """The file is overwritten while one cache has it open: the next to open it moves it aside with a
    warning and starts afresh; the open cache then writes to and reads from the new file."""
    path = tmp_path / "c.sqlite"
    with ProfileCache(str(path)) as first:
        first.put_many({key(f"k{i}"): measurement(1e-3) for i in range(500)})
        with open(path, "r+b") as handle:
            handle.write(random.Random(1).randbytes(200_000))
        with caplog.at_level(logging.WARNING, logger="tvm_diviml.profiling.cache"), ProfileCache(str(path)) as second:
            assert second.get_many([key("k0")]) == {}
            second.put_many({key("second"): measurement(3e-3)})
        assert "is unusable" in caplog.text
        first.put_many({key("first"): measurement(2e-3)})
        assert first.get_many([key("first"), key("second")]).keys() == {key("first"), key("second")}


def test_an_empty_file_becomes_a_cache_without_a_warning(tmp_path, caplog):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"")
    with caplog.at_level(logging.WARNING, logger="tvm_diviml.profiling.cache"), ProfileCache(str(path)) as cache:
        cache.put_many({key("a"): measurement(1e-3)})
    assert caplog.records == [] and not list(tmp_path.glob("*.corrupt-*"))


@pytest.mark.parametrize(
    "refusal",
    [
        "PRAGMA max_page_count = 1",  # no page beyond those it has: "database or disk is full", as on a full disk
        "PRAGMA query_only = 1",  # and as on a read-only file system: "attempt to write a readonly database"
    ],
)
def test_a_cache_that_cannot_be_written_goes_on_in_memory_with_a_warning(tmp_path, caplog, refusal):
    path = tmp_path / "c.sqlite"
    with ProfileCache(str(path)) as cache:
        cache.put_many({key("kept"): measurement(1e-3)})
        cache._db.execute(refusal)
        many = {key(f"a{i}"): measurement(2e-3) for i in range(1000)}  # more than the pages it has
        with caplog.at_level(logging.WARNING, logger="tvm_diviml.profiling.cache"):
            cache.put_many(many)
            cache.put_link(LinkKey("cpu:0", "cpu:1", "host", "0.27"), LinkMeasurement(1e-5, 1e10, 0.01))
        assert cache.in_memory and cache.get_many(many) == many
    assert "cannot be written" in caplog.text and "DIVIML_CACHE_DIR" in caplog.text
    assert caplog.text.count("cannot be written") == 1  # said once
    with ProfileCache(str(path)) as cache:  # the file is as it was before the refusal
        assert cache.get_many([key("kept"), *many]) == {key("kept"): measurement(1e-3)}


def test_a_damaged_cache_that_cannot_be_moved_aside_goes_on_in_memory(tmp_path, caplog, monkeypatch):
    """A damaged file on a read-only file system: it cannot be moved aside nor replaced."""
    from tvm_diviml.profiling import cache as cache_module

    path = tmp_path / "c.sqlite"
    random_bytes(path)

    def read_only(path):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cache_module, "_move_aside", read_only)
    with caplog.at_level(logging.WARNING, logger="tvm_diviml.profiling.cache"):
        with ProfileCache(str(path)) as cache:
            cache.put_many({key("a"): measurement(1e-3)})
            assert cache.in_memory and cache.get_many([key("a")]) == {key("a"): measurement(1e-3)}
    assert "Read-only file system" in caplog.text
