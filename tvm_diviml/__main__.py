"""``python -m tvm_diviml``: the ``diviml`` command."""

from .entry import main

main()
