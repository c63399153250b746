"""``diviml models``: the model zoo with each model's options, and the synthetic generators."""

from __future__ import annotations

import argparse

from ..app.workload import GENERATORS
from ..zoo import ZOO, zoo_names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command takes no flags."""


def run(args: argparse.Namespace) -> int:
    for name in zoo_names():
        entry = ZOO[name]
        options = ",".join(f"{k}={v}" for k, v in entry.defaults().items())
        print(f"{name:<14} {entry.description}\n{'':<14} options: {options}")
    for name, (_, description) in GENERATORS.items():
        print(f"{name:<14} synthetic: {description}")
    print(
        "\nAlso: an .onnx file or a .pt2 program saved with torch.export.save (--shape NAME=VALUE binds "
        "symbolic dimensions), an OpGraph .json, or an msr-fiddle .json."
    )
    return 0
