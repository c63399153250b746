"""Integer inputs stay inside every table they index (``zoo/input_ranges.py``): token ids drawn from
[0, 100) ran off a two-row token-type table (NaN, "DIFFERENT") and made an Embedding(2, 65536)
segfault ``diviml run``, since TVM's ``take`` in fast mode reads out of bounds unchecked."""

from __future__ import annotations

import re

import numpy as np
import pytest
from tvm import relax

from tvm_diviml.cli import main
from tvm_diviml.errors import DivimlInputError
from tvm_diviml.frontends.importers import from_relax, from_torch_export
from tvm_diviml.passes import apply_plan, build, extract
from tvm_diviml.plan import Plan
from tvm_diviml.presets import get_platform
from tvm_diviml.runtime.vm import SingleVMRunner
from tvm_diviml.zoo.input_ranges import FLAG_RANGE, integer_input_ranges

CPU2 = get_platform("cpu2")


def tables_module():
    """Inputs reaching tables of several sizes through reshapes and casts, and inputs that do not."""
    builder = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType([2, 3], "int64"))
    types = relax.Var("types", relax.TensorType([6], "int32"))
    small = relax.Var("small", relax.TensorType([2, 3], "int8"))
    shifted = relax.Var("shifted", relax.TensorType([6], "int64"))
    mask = relax.Var("mask", relax.TensorType([2, 3], "int64"))
    x = relax.Var("x", relax.TensorType([6, 4], "float32"))
    inputs = [ids, types, small, shifted, mask, x]
    big, medium, pair = (relax.const(np.ones(shape, "float32")) for shape in ([50, 4], [7, 4], [2, 4]))
    with builder.function("main", inputs, attrs={"num_input": len(inputs)}):
        with builder.dataflow():
            flat = builder.emit(relax.op.reshape(relax.op.astype(ids, "int32"), [6]))
            words = builder.emit(relax.op.take(big, flat, axis=0))
            rows = builder.emit(relax.op.permute_dims(relax.op.expand_dims(ids, 0), [0, 2, 1]))
            picked = builder.emit(relax.op.take(medium, relax.op.reshape(rows, [6]), axis=0))  # 7 < 50
            typed = builder.emit(relax.op.take(pair, relax.op.strided_slice(types, [0], [0], [6]), axis=0))
            wide = builder.emit(
                relax.op.take(relax.const(np.ones([1000, 4], "float32")), relax.op.reshape(small, [6]), 0)
            )
            moved = builder.emit(relax.op.take(big, relax.op.add(shifted, relax.const(1, "int64")), axis=0))
            masked = builder.emit(relax.op.multiply(x, relax.op.reshape(relax.op.astype(mask, "float32"), [6, 1])))
            total = builder.emit(relax.op.add(relax.op.add(words, picked), relax.op.add(typed, wide)))
            out = builder.emit_output(relax.op.add(total, relax.op.add(moved, masked)))
        builder.emit_func_output(out)
    return builder.get()


def test_an_input_is_bounded_by_the_smallest_table_its_values_reach():
    mod = tables_module()
    built = from_relax(mod)
    assert (
        integer_input_ranges(mod, "main", built.inputs)
        == built.input_ranges
        == {
            "ids": (0, 7),  # tables of 50 and 7 rows, through casts, reshapes and a transpose
            "types": (0, 2),  # through a slice
            "small": (0, 128),  # a 1000-row table, but int8 holds no more
            "shifted": FLAG_RANGE,  # indexes only after arithmetic: a flag's values keep the index small
            "mask": FLAG_RANGE,  # indexes nothing
        }
    )
    for seed in range(3):
        for (name, _, _), array in zip(built.inputs, built.sample_inputs(seed), strict=True):
            if name in built.input_ranges:
                low, high = built.input_ranges[name]
                assert low <= array.min() and array.max() < high, (name, array)


def test_an_input_indexing_a_table_of_no_rows_is_refused_when_sampled():
    builder = relax.BlockBuilder()
    ids = relax.Var("ids", relax.TensorType([3], "int64"))
    with builder.function("main", [ids], attrs={"num_input": 1}):
        with builder.dataflow():
            out = builder.emit_output(relax.op.take(relax.const(np.ones([0, 4], "float32")), ids, axis=0))
        builder.emit_func_output(out)
    with pytest.raises(DivimlInputError, match="integer input 'ids' indexes a table of no rows"):
        from_relax(builder.get()).sample_inputs()


def test_gather_one_hot_and_advanced_indexing_bound_their_indices():
    """torch's one_hot imports as comparisons checked by an assertion; x[g] as index_tensor."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")

    class Indexing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(9, 4))

        def forward(self, hot, rows, picks):
            scores = self.table[rows]  # (5, 4)
            return torch.nn.functional.one_hot(hot, 6), torch.gather(scores, 1, picks)

    inputs = (torch.zeros(5, dtype=torch.long), torch.ones(5, dtype=torch.long), torch.zeros(5, 3, dtype=torch.long))
    built = from_torch_export(torch.export.export(Indexing(), inputs))
    assert built.input_ranges == {"hot": (0, 6), "rows": (0, 9), "picks": (0, 4)}


def embedding_model(torch, rows: int, width: int):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(rows, width), torch.nn.Linear(width, 4)).eval()


def assert_placed_equals_torch(torch, model, built, seeds=range(3)):
    """The build placed across cpu0 and cpu1 of cpu2, run on the sample inputs, equals torch on them."""
    extraction = extract(built.mod, built.entry)
    order = extraction.graph.topo_order
    plan = Plan({kernel: ("cpu0", "cpu1")[i % 2] for i, kernel in enumerate(order)})
    runner = SingleVMRunner(
        build(apply_plan(built.mod, plan, CPU2, extraction=extraction)), [w for _, w in built.params]
    )
    for seed in seeds:
        inputs = built.sample_inputs(seed)
        want = model(*(torch.from_numpy(a) for a in inputs))
        want = getattr(want, "last_hidden_state", want)
        np.testing.assert_allclose(runner(inputs)[0], want.detach().numpy(), rtol=1e-4, atol=1e-5)


def test_ids_of_a_two_row_embedding_stay_in_it_and_equal_torch():
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    model = embedding_model(torch, 2, 64)
    built = from_torch_export(torch.export.export(model, (torch.zeros(4, 8, dtype=torch.long),)))
    assert all(set(np.unique(built.sample_inputs(seed)[0])) <= {0, 1} for seed in range(5))
    assert_placed_equals_torch(torch, model, built)


def test_a_bert_with_token_types_and_a_mask_equals_torch():
    """BERT's token types index a table of two rows; its attention mask is a flag."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    hf = pytest.importorskip("transformers", reason="transformers is not installed (pip install 'tvm-diviml[torch]')")
    config = hf.BertConfig(
        vocab_size=300, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64
    )
    torch.manual_seed(0)
    bert = hf.BertModel(config).eval()

    class WithTypes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            return self.bert(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)

    ids = torch.arange(16).reshape(2, 8)
    built = from_torch_export(torch.export.export(WithTypes(), (ids, torch.ones_like(ids), ids % 2)))
    assert_placed_equals_torch(torch, WithTypes(), built)
    assert built.input_ranges == {"input_ids": (0, 300), "attention_mask": (0, 2), "token_type_ids": (0, 2)}


def test_diviml_run_keeps_the_ids_of_a_wide_two_row_embedding_inside_it(tmp_path, capsys):
    """Embedding(2, 16384): ids up to 99 read 6 MB past the table, and ``diviml run`` segfaulted."""
    torch = pytest.importorskip("torch", reason="torch is not installed (pip install 'tvm-diviml[torch]')")
    path = str(tmp_path / "embedding.pt2")
    model = embedding_model(torch, 2, 16384)
    torch.export.save(torch.export.export(model, (torch.zeros(4, 8, dtype=torch.long),)), path)
    argv = ["run", path, "--platform", "cpu2", "--cost", "roofline", "--objective", "latency"]
    code = main([*argv, "--repeats", "2", "--time-limit", "5", "--candidates", "0"])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert re.search(r"^outputs against the single-device build: .*: equal$", out, re.MULTILINE), out
