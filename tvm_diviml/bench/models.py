"""The ``models`` suite: real models from torchvision and Hugging Face through the whole tool."""

from __future__ import annotations

from collections.abc import Iterator

from ..app.coverage import ROUTES, catalogue, check_model, missing_packages
from ..errors import DivimlInputError
from .common import progress
from .suite import Row

TIME_LIMIT_S = 10.0


def suite_models(quick: bool = False, time_limit_s: float = TIME_LIMIT_S) -> Iterator[Row]:
    """Models from torchvision and Hugging Face, exported with torch.export and through ONNX, each
    imported, extracted, planned on cpu2 and paper-node, built across cpu0/cpu1, run and compared
    with torch (``tvm_diviml/app/coverage.py``); quick: one CNN and one transformer."""
    missing = missing_packages()
    if missing:
        raise DivimlInputError(
            f"suite models needs {', '.join(missing)}, which this environment lacks",
            field="--suite",
            hint="pip install 'tvm-diviml[torch]'",
        )
    models = [m for m in catalogue().values() if m.quick or not quick]
    bar = progress(total=len(models) * len(ROUTES), desc="models suite", unit="row")
    for model in models:
        for route in ROUTES:
            bar.set_postfix_str(f"{model.name} ({route})")
            yield check_model(model, route, time_limit_s=time_limit_s)
            bar.update()
    bar.close()
