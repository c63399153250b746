"""Packaging for tvm-diviml: every package under ``tvm_diviml/`` (each folder has an ``__init__.py``;
tests/test_packaging.py checks that a regular wheel ships them all and works installed alone)."""

from setuptools import find_packages, setup

setup(
    name="tvm-diviml",
    version="0.1.0",
    description="Place a neural network's kernels across heterogeneous devices with TVM Relax, "
    "with lower bounds that say how close to optimal the placement is.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["tvm_diviml", "tvm_diviml.*"]),
    # The platform file's JSON Schema (docs/platform.md), for editors and validators beside the loader.
    package_data={"tvm_diviml": ["platform.schema.json"]},
    install_requires=[
        "apache-tvm>=0.27,<0.28",
        # 0.1.15.post2 segfaults in tvm.ir.save_json (and MetaSchedule's JSON database); 0.1.14.post0 works.
        "apache-tvm-ffi==0.1.14.post0",
        "mip>=2.0,<2.1",
        # HiGHS for python-mip: 1.4-9x faster than CBC on our latency MILPs. highsbox, not highspy: the
        # highspy wheel's library does not export the C API python-mip loads (it warns on every run).
        "highsbox>=1.10,<2",
        "networkx>=3.0",
        "numpy>=1.24",
        "tqdm>=4",  # progress bars for profiling and long solves
        "matplotlib>=3.7",  # --gantt schedule pictures
        # CP-SAT: split's windows and the cpsat solver; with the MILP instead, split's plans were 1-13%
        # worse on 32-kernel DAGs. It runs in a subprocess (OR-Tools and CBC clash in one process).
        "ortools>=9.10,<10",
        # MetaSchedule's LocalBuilder and LocalRunner send candidates to worker processes with it: tuning
        # builds on every core, and a candidate that crashes fails its trial, not the process.
        "cloudpickle>=2",
        # TVM's worker pools kill a timed-out or recycled worker with it (apache-tvm does not require it):
        # without it that kill raises, and the build or run on that worker fails with "No module named psutil".
        "psutil>=5",
    ],
    extras_require={
        "test": [
            "pytest>=7",
            # `make test` runs the suite on every core (pytest -n auto): serially it took 12-13 min on 2 cores,
            # half of that time one core idle (CLI subprocesses importing TVM, single-threaded solvers).
            "pytest-xdist>=3.5",
            "hypothesis>=6",
            "setuptools>=68",  # build tools: the packaging test builds a wheel offline
            "wheel",
            "ruff==0.17.6",  # `make lint`; pinned: a new release adds rules and reformats
            "jsonschema>=4.18",  # checks platform.schema.json is a valid schema that the presets and docs meet
            # an exported build and `run --reference onnxruntime` are tested against ONNX Runtime (CPU wheel, ~15 MB)
            "onnxruntime>=1.17",
        ],
        "onnx": ["onnx>=1.14"],
        # MetaSchedule's XGBoost cost model for --tune/--tune-minutes (without it, candidates are ranked at
        # random); onnxruntime is a baseline of `diviml bench --suite frameworks`.
        "tune": ["xgboost>=1.6"],
        "onnxruntime": ["onnxruntime>=1.17"],
        # torch.export programs and .pt2 files; torchvision, transformers and onnxscript (torch.onnx.export)
        # for the model-coverage suite (`diviml bench --suite models`, tests/app/test_coverage.py).
        "torch": ["torch>=2.4", "torchvision>=0.19", "transformers>=4.45", "onnx>=1.14", "onnxscript>=0.2"],
    },
    entry_points={"console_scripts": ["diviml=tvm_diviml.entry:main"]},
)
