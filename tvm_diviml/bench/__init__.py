"""Benchmark suites behind ``diviml bench``: each yields rows (dicts) measured in one run.

Speed targets live here, never in unit tests; ratios are measured side by side in one run. One module
per suite holds its constants and its ``suite_*`` function; ``common`` holds what several suites share
and ``suite`` the declaration types. ``SUITES`` declares every suite (name, one-line description,
options, from which the command line builds its flags) and names its function, whose module is
imported only when the suite runs: importing this package imports neither TVM nor torch, and
``diviml bench --suite simulator`` loads no other suite. Each declared default is the function's own
(``tests/bench/test_suites.py``). The suites' functions and constants are this package's attributes
too, each loaded when first used.
"""

from __future__ import annotations

import importlib
import os

from ..bounds.pipeline import DP_IDEALS
from .common import MSR_FIDDLE_DIR
from .suite import QUICK, Option, Suite, offers_by_flag, time_limit

MODELS_LIST = Option("models", str, "", "comma-separated models of the suite (default: all of them)", "--models")

# In the order `diviml bench --help` lists them.
SUITES: dict[str, Suite] = {
    suite.name: suite
    for suite in (
        Suite(
            "simulator",
            "the simulator in every cost mode at 1/10 of the kernels and all of them",
            "simulator:suite_simulator",
            (
                Option("kernels", int, 10_000, "kernels of the larger random DAG"),
                Option("repeats", int, 3, "runs per mode and size; the fastest counts"),
            ),
        ),
        Suite(
            "extract",
            "extraction time, kernels, edges and GFLOPs per zoo model at its default size",
            "extract:suite_extract",
            (Option("models", list, None, "zoo model names (default: the whole zoo)"),),
        ),
        Suite(
            "costs",
            "cost-model accuracy on this CPU: summed kernel times and the roofline against whole runs",
            "costs:suite_costs",
            (
                Option("models", list, None, "zoo model names (default: every model with a small size)"),
                Option("tune_models", tuple, ("resnet18", "bert_base"), "models also timed after MetaSchedule tuning"),
                Option("tune_trials", int, 32, "MetaSchedule trials per kernel for the tuned models"),
            ),
        ),
        Suite(
            "cpu",
            "the fraction of this CPU's attainable peak that scheduled whole models reach "
            "(the presets' CPU efficiency)",
            "cpu:suite_cpu",
            (MODELS_LIST,),
        ),
        Suite(
            "latency",
            "every latency solver against the best lower bound; a geometric-mean row per group",
            "latency:suite_latency",
            (
                time_limit(60.0),
                Option("exact_up_to", int, 80, "the exact solvers skip graphs of more kernels"),
                Option(
                    "solvers",
                    list,
                    None,
                    "solver names (default: fastest_single_device, greedy, heft, split, milp, cpsat)",
                ),
                QUICK,
                Option(
                    "msr_fiddle_dir",
                    str,
                    os.path.join(MSR_FIDDLE_DIR, "latency-inputs"),
                    "folder of the msr-fiddle latency inputs",
                ),
                Option("groups", list, None, "row groups (default: every one of random, msr-fiddle, zoo, randwire)"),
            ),
        ),
        Suite(
            "pipeline",
            "SliceGraph against the best lower bound on K identical GPUs, beside Archer et al.'s ratios",
            "pipeline:suite_pipeline",
            (
                time_limit(10.0, "seconds for SliceGraph per row"),
                Option(
                    "bound_time_limit_s",
                    float,
                    450.0,
                    "ceiling in seconds for the exact MIP, and again for the relaxation MIPs, per row",
                    flag="--bound-time-limit",
                    metavar="S",
                ),
                Option(
                    "mip_nodes",
                    int,
                    50,
                    "branch-and-bound nodes per MIP: its bound repeats run to run unless the ceiling stops it first",
                    flag="--mip-nodes",
                    metavar="N",
                ),
                QUICK,
                Option("stages", tuple, (2, 4, 8, 16, 32, 64), "the stage counts K (those up to kernels / 4 run)"),
                Option("mip_up_to", int, 20_000, "the MIPs run only where kernels x K is at most this"),
                Option("dp_ideals", int, DP_IDEALS, "the downset DP runs where the graph has at most this many ideals"),
                Option(
                    "msr_fiddle_dir",
                    str,
                    os.path.join(MSR_FIDDLE_DIR, "throughput-inputs", "OperatorGraphs"),
                    "folder of the msr-fiddle operator graphs",
                ),
            ),
        ),
        Suite(
            "msr-fiddle",
            "the msr-fiddle max-load problem: downset DP, SliceGraph, bounds, experts' splits",
            "msr_fiddle:suite_msr_fiddle",
            (
                time_limit(300.0, "seconds for the downset DP per graph"),
                Option("slicegraph_time_limit_s", float, 60.0, "seconds for SliceGraph per graph (2 with quick)"),
                Option("max_ideals", int, 50_000, "beyond this many ideals the DP falls back to SliceGraph"),
                QUICK,
                Option(
                    "msr_fiddle_dir", str, MSR_FIDDLE_DIR, "the msr-fiddle folder (throughput-inputs, human-experts)"
                ),
            ),
        ),
        Suite(
            "run",
            "plans built and run on this machine: measured against predicted and the best single device",
            "run:suite_run",
            (
                QUICK,
                time_limit(30.0),
                Option("repeats", int, 10, "timed inferences per plan"),
                Option("platform", str, "cpu2", "a preset whose devices this machine has"),
                Option("candidates", int, 2, "plans timed side by side with the auto plan"),
                Option(
                    "case",
                    str,
                    "",
                    "only the rows of one case: predicted, concurrent, pipeline or throughput",
                    "--case",
                ),
            ),
        ),
        Suite(
            "llm",
            "the symmetric solver against the whole-graph solvers on LLaMA models across servers",
            "llm:suite_llm",
            (
                time_limit(120.0, "seconds for each solve"),
                QUICK,
                Option("models", list, None, "llama MODELs (default: 8, 24 and 48 layers; quick: 8 at hidden 128)"),
                Option(
                    "platforms",
                    tuple,
                    ("servers:2xpaper-node", "servers:4xpaper-node"),
                    "server platforms each model is placed on",
                ),
                Option("objectives", tuple, ("latency", "throughput"), "objectives solved per model and platform"),
            ),
        ),
        Suite(
            "models",
            "torchvision and Hugging Face models imported, placed, built and run, checked against torch",
            "models:suite_models",
            (QUICK, time_limit(10.0)),
        ),
        Suite(
            "frameworks",
            "diviml against torch eager, torch.compile, ONNX Runtime and tvm.compile's default on this CPU, per "
            "inference, with held-out models and diviml's fraction of the measured peak",
            "frameworks:suite_frameworks",
            (
                QUICK,
                Option("tune_minutes", float, 0.0, "also tune each model for this many minutes", "--tune-minutes", "M"),
                MODELS_LIST,
            ),
        ),
        Suite(
            "time_limits",
            "wall time of plan + baselines + bounds against --time-limit, 12-100,000 kernels on 2-1,000 devices",
            "time_limits:suite_time_limits",
            (
                Option("time_limit_s", float, 5.0, "the time limit of every solve", flag="--time-limit", metavar="S"),
                QUICK,
            ),
        ),
    )
}

# The suites' functions and constants, by the module that holds them (loaded when first used).
_EXPORTS = {
    "EXACT_SOLVERS": "latency",
    "LATENCY_RATIOS": "latency",
    "LATENCY_SOLVERS": "latency",
    "MSR_FIDDLE_LATENCY": "latency",
    "latency_summaries": "latency",
    "latency_workloads": "latency",
    "suite_latency": "latency",
    "LLM_FULL_SOLVERS": "llm",
    "LLM_LAYERS": "llm",
    "LLM_OBJECTIVES": "llm",
    "LLM_PLATFORMS": "llm",
    "LLM_TARGETS": "llm",
    "llm_models": "llm",
    "llm_summaries": "llm",
    "suite_llm": "llm",
    "MSR_FIDDLE_OPERATORS": "pipeline",
    "PAPER_PIPELINE_RATIOS": "pipeline",
    "PIPELINE_STAGES": "pipeline",
    "fiddle_accelerators": "pipeline",
    "pipeline_summaries": "pipeline",
    "pipeline_workloads": "pipeline",
    "suite_pipeline": "pipeline",
    "RUN_TARGETS": "run",
    "run_workloads": "run",
    "suite_run": "run",
    "suite_costs": "costs",
    "suite_cpu": "cpu",
    "suite_extract": "extract",
    "suite_frameworks": "frameworks",
    "suite_models": "models",
    "suite_msr_fiddle": "msr_fiddle",
    "suite_simulator": "simulator",
    "suite_time_limits": "time_limits",
    "geomean": "common",
    "markdown_table": "common",
    "row_line": "common",
    "timed_solve": "common",
    "write_markdown": "common",
    "Row": "suite",
}

__all__ = ["MSR_FIDDLE_DIR", "Option", "SUITES", "Suite", "offers_by_flag", *sorted(_EXPORTS)]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value
