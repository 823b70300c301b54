"""The compiled core's tests need it built: a missing extension fails them, it does not skip them.

`make test` builds the core and fails when it did not build (see the Makefile); a user without a C
compiler who wants the rest of the suite sets ROLLFLOW_SKIP_COMPILED=1, and only then do these
tests skip, naming the variable.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest

SKIP_COMPILED_ENV = "ROLLFLOW_SKIP_COMPILED"


def require_compiled(module: str) -> ModuleType:
    """The built extension `module`; a failure saying how to build it, or a skip when opted out."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if os.environ.get(SKIP_COMPILED_ENV) == "1":
            pytest.skip(
                f"{module} is not built; {SKIP_COMPILED_ENV}=1 leaves its tests out", allow_module_level=True
            )
        pytest.fail(
            f"{module} is not built ({exc}): run `make compiled` (a C compiler and the Python headers), "
            f"or set {SKIP_COMPILED_ENV}=1 to leave the compiled core's tests out",
            pytrace=False,
        )
