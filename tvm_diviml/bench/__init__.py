"""Benchmark suites behind ``diviml bench``: each yields rows (dicts) measured in one run.

Speed targets live here, never in unit tests; ratios are measured side by side in one run. One module
per suite holds its constants, its ``suite_*`` function and its ``SUITE`` declaration (name, one-line
description, options, from which the command line builds its flags); ``common`` holds what several
suites share and ``suite`` the declaration types. Importing this package imports neither TVM nor
torch: the suites that need them (extract, costs, cpu, run, models, frameworks) import them when they
run.
"""

from __future__ import annotations

from . import costs, cpu, extract, frameworks, latency, llm, models, msr_fiddle, pipeline, run, simulator, time_limits
from .common import MSR_FIDDLE_DIR, geomean, markdown_table, row_line, timed_solve, write_markdown
from .costs import suite_costs
from .extract import suite_extract
from .latency import (
    EXACT_SOLVERS,
    LATENCY_RATIOS,
    LATENCY_SOLVERS,
    MSR_FIDDLE_LATENCY,
    latency_summaries,
    latency_workloads,
    suite_latency,
)
from .llm import (
    LLM_FULL_SOLVERS,
    LLM_LAYERS,
    LLM_OBJECTIVES,
    LLM_PLATFORMS,
    LLM_TARGETS,
    llm_models,
    llm_summaries,
    suite_llm,
)
from .models import suite_models
from .msr_fiddle import suite_msr_fiddle
from .pipeline import (
    MSR_FIDDLE_OPERATORS,
    PAPER_PIPELINE_RATIOS,
    PIPELINE_STAGES,
    fiddle_accelerators,
    pipeline_summaries,
    pipeline_workloads,
    suite_pipeline,
)
from .run import RUN_TARGETS, run_workloads, suite_run
from .simulator import suite_simulator
from .suite import Option, Row, Suite, offers_by_flag

# In the order `diviml bench --help` lists them.
SUITES: dict[str, Suite] = {
    module.SUITE.name: module.SUITE
    for module in (
        simulator,
        extract,
        costs,
        cpu,
        latency,
        pipeline,
        msr_fiddle,
        run,
        llm,
        models,
        frameworks,
        time_limits,
    )
}

__all__ = [
    "EXACT_SOLVERS",
    "LATENCY_RATIOS",
    "LATENCY_SOLVERS",
    "LLM_FULL_SOLVERS",
    "LLM_LAYERS",
    "LLM_OBJECTIVES",
    "LLM_PLATFORMS",
    "LLM_TARGETS",
    "MSR_FIDDLE_DIR",
    "MSR_FIDDLE_LATENCY",
    "MSR_FIDDLE_OPERATORS",
    "PAPER_PIPELINE_RATIOS",
    "PIPELINE_STAGES",
    "RUN_TARGETS",
    "SUITES",
    "Option",
    "Row",
    "Suite",
    "fiddle_accelerators",
    "geomean",
    "latency_summaries",
    "latency_workloads",
    "llm_models",
    "llm_summaries",
    "markdown_table",
    "offers_by_flag",
    "pipeline_summaries",
    "pipeline_workloads",
    "row_line",
    "run_workloads",
    "suite_costs",
    "suite_extract",
    "suite_latency",
    "suite_llm",
    "suite_models",
    "suite_msr_fiddle",
    "suite_pipeline",
    "suite_run",
    "suite_simulator",
    "timed_solve",
    "write_markdown",
]
