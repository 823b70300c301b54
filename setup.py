"""The compiled part of rollflow: one optional C extension (the project's metadata is in pyproject.toml).

`rollflow.perf._timing` is the execution-time model's lookups in C. It needs only a C compiler and
the Python headers; where it fails to build, the install goes on and rollflow runs its pure-Python
reference (rollflow/perf/predictor.py), which gives the same times.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rollflow.perf._timing",
            ["rollflow/perf/_timing.c"],
            # No fused multiply-adds: Python rounds every operation, and the two must agree exactly.
            extra_compile_args=["-O2", "-ffp-contract=off"],
            optional=True,
        )
    ]
)
