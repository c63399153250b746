"""``diviml platforms``: the platform presets, or one platform (a preset, a file, this machine) as JSON."""

from __future__ import annotations

import argparse

from ..detect import LOCAL
from ..errors import DivimlInputError
from ..presets import PRESETS, get_platform
from .output import write_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    described = parser.add_mutually_exclusive_group()
    described.add_argument("--json", metavar="NAME", help="print one preset (or platform file) as JSON")
    described.add_argument(
        "--detect",
        action="store_true",
        help="describe this machine (CPU, CUDA/ROCm GPUs) as a platform file: the same as --json local",
    )
    parser.add_argument("--output", metavar="FILE", help="write the JSON to FILE instead of stdout")


def run(args: argparse.Namespace) -> int:
    if args.json or args.detect:
        platform = get_platform(args.json or LOCAL)
        write_json(platform.to_json(), args.output or "-", "--output")
        if args.output:
            devices = ", ".join(f"{d.name} ({d.device})" for d in platform.devices)
            print(f"wrote {args.output}: {platform.description}\ndevices: {devices}")
            for device, notes in platform.estimates.items():
                print("\n".join(f"{device} {figure}: estimated ({how})" for figure, how in notes.items()))
            print(f"edit it (docs/platform.md), then: diviml plan MODEL --platform {args.output}")
        return 0
    if args.output:
        raise DivimlInputError("--output writes what --detect or --json NAME describes", hint="add one of them")
    for name, make in PRESETS.items():
        platform = make()
        devices = ", ".join(f"{d.name} ({d.device})" for d in platform.devices)
        print(f"{name:<12} {platform.description}\n{'':<12} devices: {devices}")
    print(f"{'cpuN':<12} this machine's CPU as N single-thread devices (N up to its cores, e.g. cpu4)")
    print(f"{'local':<12} this machine as detected: its CPU as one device (local:cores=K: K devices) and its GPUs")
    print(f"{'gpuK':<12} K identical H100-class GPUs on NVLink-class links (e.g. gpu4, gpu16)")
    print(f"{'servers:...':<12} servers of preset kinds on a network (e.g. servers:2xpaper-node+2xh200-node)")
    print(
        "\nOr a platform .json file of your own machine:\n"
        "  diviml platforms --detect --output my_machine.json   this machine (CPU, CUDA/ROCm GPUs), to edit and keep\n"
        "  diviml platforms --json NAME                          a preset in the file format, to start from\n"
        "  the format, field by field, with a CPU + A100 + L4 example: docs/platform.md"
    )
    return 0
