"""``diviml graph``: a model's kernel graph as extracted, summed up or as OpGraph JSON."""

from __future__ import annotations

import argparse

from ..app.workload import load_graph
from .arguments import model_arguments
from .output import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    model_arguments(parser)
    parser.add_argument("--json", metavar="PATH", help="write the OpGraph JSON to PATH, or - for stdout")


def run(args: argparse.Namespace) -> int:
    found = load_graph(args.model, shapes=args.shape, granularity=args.granularity)
    graph = found.graph
    if args.json:
        write_json(graph.to_json(), args.json)
        if args.json == "-":
            return 0
    width, exact = graph.widest_antichain()
    flops = sum(k.flops for k in graph.kernels.values())
    primfuncs = {k.attrs.get("primfunc_hash") for k in graph.kernels.values()} - {None}
    print(f"model {args.model}" + (f" ({args.granularity} granularity)" if found.loaded is not None else ""))
    print(
        f"kernels: {len(graph)}   edges: {len(graph.edges)}   inputs: {len(graph.inputs)}   "
        f"outputs: {len(graph.outputs)}"
    )
    if primfuncs:
        print(f"distinct PrimFuncs: {len(primfuncs)}")
    print(
        f"GFLOPs: {flops / 1e9:.3f}   weights: {sum(graph.weights.values()) / 1e6:.2f} MB   "
        f"widest antichain: {width}{'' if exact else ' (at least; level width)'}"
    )
    if found.loaded is not None:
        print(f"imported from {found.loaded.built.origin}")
        print(f"extracted in {found.loaded.extract_s:.2f} s")
    return 0
