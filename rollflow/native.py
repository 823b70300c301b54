"""rollflow's optional C extensions (setup.py): which one a caller may use.

Each extension has a pure-Python reference that gives the same results; an install without a C
compiler runs the references, and `ROLLFLOW_PURE_PYTHON=1` runs them even where the extensions
are built (the tests compare both ways).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

PURE_PYTHON_ENV = "ROLLFLOW_PURE_PYTHON"


def pure_python() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0")


def extension(name: str) -> ModuleType | None:
    """The built extension `name` (e.g. "rollflow.sim._loop"), or None if it is not built or not allowed."""
    if pure_python():
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
