"""The TVM target a platform device's kernels are compiled for.

A CPU target that names no ``mcpu`` is compiled for this machine's CPU when the device is one of this
machine's (``measure`` is true): TVM's plain ``llvm`` target is generic x86-64 (SSE, no FMA), 10x
slower than the same schedule for the host's AVX-512. A device that describes another machine keeps
its target as written (name its ``mcpu`` to build for it). Every CPU target carries the device's
threads as ``num-cores``, which the schedules read: a one-thread device gets no parallel loops.
"""

from __future__ import annotations

import os

import tvm
from tvm.target.codegen import llvm_get_system_cpu

from ..platform import Device


def device_target(device: Device) -> tvm.target.Target:
    spec = dict(device.target) if isinstance(device.target, dict) else device.target
    if device.kind != "cpu":
        return tvm.target.Target(spec)
    target = tvm.target.Target(spec)
    if target.kind.name != "llvm":
        return target
    exported = dict(target.export())
    if device.measure and not exported.get("mcpu"):
        exported["mcpu"] = llvm_get_system_cpu()
    exported["num-cores"] = device.num_threads or os.cpu_count() or 1
    return tvm.target.Target({key: value for key, value in exported.items() if key not in ("tag", "keys")})
