"""The compiled part of rollflow: five optional C extensions (the project's metadata is in pyproject.toml).

`rollflow.perf._timing` is the execution-time model's lookups in C; `rollflow.sim._loop` is the
serving simulator's loop, timing batches through `_timing`'s capsule; `rollflow.sim._trace`
formats the chrome trace's events; `rollflow.runtime.engines._chunked` takes the whole chunks of
an engine's streamed answer in one pass, and `rollflow.runtime.engines._trim` cuts the output an
SGLang event repeats. They need only a C compiler and the Python headers; where
they fail to build, the install goes on and rollflow runs its pure-Python reference
(rollflow/perf/predictor.py, rollflow/sim/simulator.py, rollflow/sim/report.py,
rollflow/runtime/engines/chunked.py, rollflow/runtime/engines/trim.py), which gives the same results.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rollflow.perf._timing",
            ["rollflow/perf/_timing.c"],
            # No fused multiply-adds: Python rounds every operation, and the two must agree exactly.
            extra_compile_args=["-O2", "-ffp-contract=off"],
            depends=["rollflow/perf/_timing_api.h"],
            optional=True,
        ),
        Extension(
            "rollflow.sim._trace", ["rollflow/sim/_trace.c"], extra_compile_args=["-O2"], optional=True
        ),
        Extension(
            "rollflow.sim._loop",
            ["rollflow/sim/_loop.c"],
            extra_compile_args=["-O2", "-ffp-contract=off"],
            depends=["rollflow/perf/_timing_api.h"],
            optional=True,
        ),
        Extension(
            "rollflow.runtime.engines._chunked",
            ["rollflow/runtime/engines/_chunked.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
        Extension(
            "rollflow.runtime.engines._trim",
            ["rollflow/runtime/engines/_trim.c"],
            extra_compile_args=["-O2"],
            optional=True,
        ),
    ]
)
