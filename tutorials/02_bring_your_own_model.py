"""Bring your own model: import an ONNX file (and a torch.export program when torch is installed),
then place, build and run it on two devices as the quickstart does with a zoo model.

The frontends in ``tvm_diviml.frontends.importers`` turn a user's model into the zoo's form (a
``BuiltModel``: Relax module, inputs, weights kept as parameters so that each weight can be placed
on the device of the kernels that read it):

* ``load_onnx(path)``: an ``.onnx`` file. This script writes one with ``onnx.helper``: two branches of
  MatMul -> Relu -> MatMul that read the same input and are added at the end.
* ``from_torch_export(program)``: a ``torch.export`` program. With ``--frontends onnx torch`` this script
  also exports a small convolutional model with two branches (off by default: torch.export alone takes
  longer than the rest of the script), saves it with ``torch.export.save`` and reads the ``.pt2`` file
  back with ``load_torch_program(path)`` (what ``diviml plan|run|graph model.pt2`` do); without torch
  that part is skipped with a message.
* ``from_relax(mod, entry, params)``: an IRModule of your own (what the other two call).

Each model is checked twice: the placed build against the same model compiled whole
(``run_reference``) and against an implementation outside TVM (numpy for the ONNX graph, torch itself
for the torch model). Exits 0 when all agree, 1 when an output differs, 3 when the onnx extra
is missing (one line says how to install it).

Run:  python tutorials/02_bring_your_own_model.py [--frontends onnx torch] [--hidden 32]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time

import numpy as np

from tvm_diviml import Problem, apply_plan, build, extract, load_platform, plan_model
from tvm_diviml.cost import RooflineCostModel
from tvm_diviml.runtime.vm import SingleVMRunner
from tvm_diviml.zoo import BuiltModel
from tvm_diviml.zoo.reference import run_reference


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--frontends",
        nargs="+",
        default=["onnx"],
        choices=["onnx", "torch"],
        help="the importers to show (torch: when torch is installed)",
    )
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=32, help="width of the ONNX model's layers")
    parser.add_argument("--platform", default="cpu2", help="a platform preset that runs on this machine")
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest relative difference accepted")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the inputs")
    return parser.parse_args()


# ------------------------------------------------------------------------------------------ ONNX
def write_onnx_model(path: str, batch: int, hidden: int, seed: int) -> dict[str, np.ndarray]:
    """Two MatMul -> Relu -> MatMul branches on input X, added into Y; returns the weights by name."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weights = {
        name: (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32)
        for name in ("a1", "a2", "b1", "b2")
    }
    nodes = []
    for branch in ("a", "b"):
        nodes += [
            helper.make_node("MatMul", ["X", f"{branch}1"], [f"{branch}_h"]),
            helper.make_node("Relu", [f"{branch}_h"], [f"{branch}_r"]),
            helper.make_node("MatMul", [f"{branch}_r", f"{branch}2"], [f"{branch}_out"]),
        ]
    nodes.append(helper.make_node("Add", ["a_out", "b_out"], ["Y"]))
    graph = helper.make_graph(
        nodes,
        "two_branches",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [batch, hidden])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [batch, hidden])],
        initializer=[numpy_helper.from_array(w, name) for name, w in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return weights


def onnx_in_numpy(weights: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    return sum(np.maximum(x @ weights[f"{b}1"], 0) @ weights[f"{b}2"] for b in ("a", "b"))


def run_onnx(args: argparse.Namespace) -> bool:
    from tvm_diviml.frontends.importers import load_onnx

    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "two_branches.onnx")
        weights = write_onnx_model(path, args.batch, args.hidden, args.seed)
        print(f"   wrote {path}")
        model = load_onnx(path)
    x = model.sample_inputs(seed=args.seed)[0]
    return place_build_run(model, args, outside_tvm=("numpy", [onnx_in_numpy(weights, x)]))


# ----------------------------------------------------------------------------------------- torch
def run_torch(args: argparse.Namespace) -> bool:
    import torch

    from tvm_diviml.frontends.importers import from_torch_export, load_torch_program

    class TwoBranchConv(torch.nn.Module):
        """Two branches of convolution -> ReLU -> convolution (3x3 and 1x1), added, then flattened."""

        def __init__(self):
            super().__init__()
            self.wide = torch.nn.Sequential(
                torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 3, padding=1)
            )
            self.narrow = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 1), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1))

        def forward(self, x):
            return torch.flatten(self.wide(x) + self.narrow(x), 1)

    torch.manual_seed(args.seed)
    module = TwoBranchConv().eval()
    example = torch.randn(args.batch, 3, 8, 8)
    program = torch.export.export(module, (example,))
    model = from_torch_export(program, name="two_branch_conv")
    with tempfile.TemporaryDirectory() as folder:
        # The standard artefact: a program saved with torch.export.save reads back with its input shapes
        # (the command line takes it too: diviml plan|run|graph two_branch_conv.pt2).
        path = os.path.join(folder, "two_branch_conv.pt2")
        torch.export.save(program, path)
        saved = load_torch_program(path)
        print(f"   saved and read back {os.path.basename(path)}: inputs {saved.inputs}, imported from {saved.origin}")
        if saved.inputs != model.inputs or len(saved.params) != len(model.params):
            print("   the saved program differs from the one in memory")
            return False
    x = model.sample_inputs(seed=args.seed)[0]
    with torch.no_grad():
        expected = module(torch.from_numpy(x)).numpy()
    return place_build_run(model, args, outside_tvm=("torch", [expected]))


# ---------------------------------------------------------------------------- plan, build, run
def place_build_run(model: BuiltModel, args: argparse.Namespace, outside_tvm: tuple[str, list[np.ndarray]]) -> bool:
    """Extract, solve for latency on the platform, build, run; True when every comparison holds."""
    graph = extract(model.mod, model.entry, name=model.name).graph
    platform = load_platform(args.platform)
    costs = RooflineCostModel(graph, platform)
    solved = plan_model(Problem(graph, platform, costs, objective="latency"), time_limit_s=10.0)
    plan = solved.plan
    placed_on = sorted(set(plan.assignment.values()))
    estimate_s = solved.simulation.value_s
    print(
        f"   {model.name}: inputs {[(n, s) for n, s, _ in model.inputs]}, {len(model.params)} weights, "
        f"{len(graph)} kernels on {placed_on}, estimated latency {estimate_s * 1e3:.2f} ms"
    )
    built = build(apply_plan(model.mod, plan, platform, entry=model.entry))
    inputs = model.sample_inputs(seed=args.seed)
    outputs = SingleVMRunner(built, [weight for _, weight in model.params])(inputs)
    ok = True
    for label, expected in (("run_reference", run_reference(model, inputs)), outside_tvm):
        for got, want in zip(outputs, expected, strict=True):
            abs_diff = float(np.abs(got - want).max())
            rel_diff = abs_diff / max(float(np.abs(want).max()), 1e-30)
            within = got.shape == want.shape and rel_diff <= args.tolerance
            print(f"   vs {label}: max |diff| {abs_diff:.3g}, relative {rel_diff:.3g} {'ok' if within else 'DIFFERS'}")
            ok = ok and within
    return ok


def main() -> int:
    args = parse_args()
    began = time.perf_counter()
    ok = True
    if "onnx" in args.frontends and importlib.util.find_spec("onnx") is None:
        print(
            "this tutorial writes and imports an ONNX file, which needs the onnx extra: "
            ".venv/bin/pip install -e '.[onnx]' (or pip install 'tvm-diviml[onnx]')",
            file=sys.stderr,
        )
        return 3
    for frontend in args.frontends:
        print(f"\n== {frontend}", flush=True)
        if frontend == "torch" and importlib.util.find_spec("torch") is None:
            print(
                "   torch is not installed: skipping the torch.export example "
                "(the torch extra: .venv/bin/pip install -e '.[torch]')"
            )
            continue
        ok = (run_onnx if frontend == "onnx" else run_torch)(args) and ok
    print(f"\n{'PASS' if ok else 'FAIL'} in {time.perf_counter() - began:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
