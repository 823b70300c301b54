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

# No fused multiply-adds: Python rounds every operation, and the C twins must agree exactly.
EXACT = ("-ffp-contract=off",)
# The capsule through which `_loop` times batches with `_timing`'s lookups.
TIMING_API = ("rollflow/perf/_timing_api.h",)


def extension(module: str, flags: tuple[str, ...] = (), depends: tuple[str, ...] = ()) -> Extension:
    """The optional extension `module`, built from the C file at its path."""
    source = module.replace(".", "/") + ".c"
    return Extension(module, [source], extra_compile_args=["-O2", *flags], depends=[*depends], optional=True)


setup(
    ext_modules=[
        extension("rollflow.perf._timing", EXACT, TIMING_API),
        extension("rollflow.sim._trace"),
        extension("rollflow.sim._loop", EXACT, TIMING_API),
        extension("rollflow.runtime.engines._chunked"),
        extension("rollflow.runtime.engines._trim"),
    ]
)
