"""``diviml profile`` states each kernel class's FLOP/s against the CPU's measured peak, in its text
and in its ``--json``."""

import json
import math

from tvm_diviml import cli


def test_profile_prints_and_writes_the_class_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("DIVIML_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "profile.json"
    assert cli.main(["profile", "twin_branch:depth=2,hidden=64", "--platform", "cpu1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    written = json.loads(path.read_text())
    kernels, classes = written["kernels"], written["classes"]
    assert {row["class"] for row in classes} == {row["schedule"] for row in kernels}
    assert sum(row["kernels"] for row in classes) == len(kernels)
    assert math.isclose(sum(row["share"] for row in classes), 1.0)
    assert all(row["peak_gflops_per_s"] > 0 and row["gflops_per_s"] > 0 for row in classes)
    assert "against this CPU's measured fp32 peak" in out
    lines = out.splitlines()
    for row in classes:
        fraction = "-" if row["peak_fraction"] is None else f"{row['peak_fraction']:.2f}"
        printed = f"{row['device']:<12}{row['class']:<20}{row['kernels']:>8}{row['share']:>8.1%}"
        assert any(line.startswith(printed) and line.endswith(f" {fraction}") for line in lines), printed
