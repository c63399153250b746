"""``python -m tvm_diviml.cli``: the ``diviml`` command."""

from . import entry

entry()
