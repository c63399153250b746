"""What a command reads and writes: no output replaces or lands inside an input (links and hard links
included), every output path is checked before any work, outputs are written whole or not at all, and
what is read is bounded (no endless file, no zip bomb, JSON alone on stdout with ``--json -``)."""

from __future__ import annotations

import json
import os
import stat
import zipfile

import pytest

from tvm_diviml.app.files import Read, Written, check_files
from tvm_diviml.cli import main
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.jsonio import read_json
from tvm_diviml.presets import get_platform
from tvm_diviml.synthetic import random_dag
from tvm_diviml.writes import write_text, written_whole


@pytest.fixture
def inputs(tmp_path):
    """A graph, a platform and a cost table on disk, as a user has them."""
    graph = random_dag(kernels=5, seed=1)
    platform = get_platform("cpu2")
    paths = {"graph": tmp_path / "graph.json", "platform": tmp_path / "platform.json", "costs": tmp_path / "c.json"}
    graph.save(str(paths["graph"]))
    platform.save(str(paths["platform"]))
    costs = {"kernels": {k: {d: 1e-3 for d in platform.device_names} for k in graph.kernels}}
    paths["costs"].write_text(json.dumps(costs))
    return paths


def refused(capsys, argv: list, *fragments: str) -> None:
    """The command exits 2 with one line that says each fragment."""
    assert main([str(a) for a in argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("diviml: error:"), err
    for fragment in fragments:
        assert fragment in err, err


def contents(paths: dict) -> dict:
    return {name: path.read_bytes() for name, path in paths.items()}


@pytest.mark.parametrize(
    "argv, over",
    [
        (["graph", "{graph}", "--json", "{graph}"], "MODEL"),
        (["plan", "{graph}", "--platform", "{platform}", "--json", "{graph}"], "MODEL"),
        (["plan", "{graph}", "--platform", "{platform}", "--json", "{platform}"], "--platform"),
        (["plan", "{graph}", "--platform", "{platform}", "--cost", "{costs}", "--json", "{costs}"], "--cost"),
        (["plan", "{graph}", "--platform", "servers:2x{platform}", "--json", "{platform}"], "--platform"),
        (["plan", "{graph}", "--gantt", "{graph}"], "MODEL"),
        (["profile", "twin_branch", "--platform", "{platform}", "--export", "{platform}"], "--platform"),
        (["profile", "twin_branch", "--platform", "{platform}", "--json", "{platform}"], "--platform"),
        (["run", "twin_branch", "--platform", "{platform}", "--export", "{platform}"], "--platform"),
    ],
)
def test_an_output_over_an_input_is_refused_before_any_work_and_the_input_kept(inputs, capsys, argv, over):
    before = contents(inputs)
    refused(capsys, [a.format(**inputs) for a in argv], f"over {over}", "which this command reads")
    assert contents(inputs) == before


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_an_output_that_is_an_input_by_another_name_is_refused(inputs, tmp_path, capsys, link):
    other = tmp_path / "other-name.json"
    (os.symlink if link == "symlink" else os.link)(inputs["graph"], other)
    before = contents(inputs)
    refused(capsys, ["plan", inputs["graph"], "--json", other], "over MODEL")
    assert contents(inputs) == before


def test_an_exported_model_file_and_its_placement_are_outputs_too(tmp_path, capsys):
    model = tmp_path / "m.onnx"
    model.write_bytes(b"not read: refused first")
    refused(capsys, ["run", model, "--export", model], "--export would write over MODEL")
    refused(
        capsys,
        ["run", "twin_branch", "--export", tmp_path / "x.so", "--json", tmp_path / "x.so.placement.json"],
        "--json and --export's placement name the same file",
    )
    assert model.read_bytes() == b"not read: refused first"


def test_an_output_inside_the_tuning_database_folder_is_refused(tmp_path, capsys):
    database = tmp_path / "db"
    database.mkdir()
    refused(capsys, ["plan", "twin_branch", "--tuning-db", database, "--json", database / "row.json"], "inside")


def test_an_export_whose_placement_cannot_be_written_is_refused_before_the_build(tmp_path, capsys):
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")
    library = tmp_path / ("x" * (longest - 3) + ".so")  # fits; its placement's name does not
    refused(capsys, ["run", "twin_branch", "--export", library], "--export's placement", "too long")
    (tmp_path / "y.so.placement.json").mkdir()
    refused(capsys, ["run", "twin_branch", "--export", tmp_path / "y.so"], "--export's placement", "folder")


def test_a_per_server_export_over_a_file_is_refused_before_servers_start(tmp_path, capsys):
    existing = tmp_path / "builds"
    existing.write_text("a file")
    refused(
        capsys,
        ["run", "twin_branch", "--platform", "servers:2xcpu1", "--rpc", "local", "--export", existing],
        "it is a file",
    )
    assert existing.read_text() == "a file"


def test_check_files_names_what_it_refuses():
    check_files([Read("a.json", "MODEL")], [Written("b.json", "--json")])  # distinct: fine
    with pytest.raises(DivimlInputError, match="--json and --gantt name the same file"):
        check_files([], [Written("b.json", "--json"), Written("./b.json", "--gantt")])


# ---------------------------------------------------------------------- written whole
def test_a_write_that_fails_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("old")
    path.chmod(0o640)
    with pytest.raises(RuntimeError), written_whole(str(path)) as temporary:
        with open(temporary, "w") as handle:
            handle.write("half of the new")
        raise RuntimeError("interrupted")
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]
    write_text(str(path), "new")
    assert path.read_text() == "new" and os.listdir(tmp_path) == ["out.json"]
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # the mode of the file it replaced


def test_a_device_is_written_in_place_never_replaced():
    write_text(os.devnull, "nothing")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_json_on_stdout_carries_the_json_alone(capsys, monkeypatch):
    """Whatever a command prints beside ``--json -`` (run's and profile's reports, bench's rows) goes to stderr."""
    from tvm_diviml.cli import graph as graph_command
    from tvm_diviml.cli.output import write_json

    def report_and_json(args):
        print("a human report")
        write_json({"value": 1}, args.json)
        return 0

    monkeypatch.setattr(graph_command, "run", report_and_json)
    assert main(["graph", "twin_branch", "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == {"value": 1} and "a human report" in err


# ---------------------------------------------------------------------- bounded reads
@pytest.mark.parametrize("kind", ["device", "pipe"])
def test_an_endless_file_is_refused_before_it_is_read(tmp_path, kind):
    path = tmp_path / "endless.json"
    if kind == "device":
        os.symlink("/dev/zero", path)
    else:
        os.mkfifo(path)  # opening it would wait for a writer forever
    with pytest.raises(DivimlInputError, match="not a regular file"):
        read_json(str(path))


def test_a_json_file_past_the_limit_is_refused_unread(tmp_path, monkeypatch):
    from tvm_diviml import jsonio

    path = tmp_path / "large.json"
    path.write_text(json.dumps({"kernels": ["k" * 100] * 100}))
    monkeypatch.setattr(jsonio, "MAX_JSON_BYTES", 1 << 10)
    with pytest.raises(DivimlInputError, match="more than the"):
        read_json(str(path))


def test_a_pt2_member_that_inflates_like_a_zip_bomb_is_refused_from_the_directory(tmp_path, monkeypatch):
    from tvm_diviml.frontends import importers as frontends

    bomb = tmp_path / "bomb.pt2"
    with zipfile.ZipFile(bomb, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("bomb/data/weights/weight_0", bytes(8 << 20))  # 8 MiB of zeros: about 8 KiB stored
    monkeypatch.setattr(frontends, "BOMB_MIN_BYTES", 1 << 20)
    read = []
    monkeypatch.setattr(zipfile.ZipFile, "read", lambda *a, **k: read.append(a))
    with pytest.raises(DivimlInputError, match="inflates from"):
        frontends.check_archive_sizes(str(bomb))
    assert not read


def test_a_pt2_larger_than_the_memory_free_is_refused(tmp_path, monkeypatch):
    from tvm_diviml.frontends import importers as frontends

    archive_path = tmp_path / "large.pt2"
    with zipfile.ZipFile(archive_path, "w") as archive:
        archive.writestr("large/data/weights/weight_0", bytes(1 << 16))
    monkeypatch.setattr(frontends, "available_memory_bytes", lambda: 1 << 10)
    with pytest.raises(DivimlInputError, match="this machine has 1.0 KiB free"):
        frontends.check_archive_sizes(str(archive_path))
