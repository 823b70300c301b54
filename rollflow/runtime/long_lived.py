"""For a long-lived server process, once it is up: what startup built leaves the garbage
collector's sight, and freed memory stays with the process."""

from __future__ import annotations

import ctypes
import gc

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
HEAP_KEPT_BYTES = 64 << 20  # free memory at the top of the heap kept rather than given back
MMAP_FROM_BYTES = 4 << 20  # allocations this large or larger are mapped on their own


def settle() -> None:
    """What a server does once it is up, before it serves (`freeze_startup_objects`, `keep_freed_heap`)."""
    freeze_startup_objects()
    keep_freed_heap()


def freeze_startup_objects() -> None:
    """Move everything alive now (modules, the app, sessions and clients, which live as long as the
    process) out of the collector's sight, so that the collections the requests' and streams'
    garbage triggers stay small: they took about 5% of the manager's py-spy samples under
    benchmarks/manager_overhead.py (1% after), and about 4% of a stream process's."""
    gc.collect()
    gc.freeze()


def keep_freed_heap() -> bool:
    """Keep memory freed at the top of the heap (up to HEAP_KEPT_BYTES) rather than give it back to
    the kernel, and serve allocations up to MMAP_FROM_BYTES from the heap. A stream's reads are
    bodies of tens to hundreds of KiB, made and freed many times a second; with glibc's defaults the
    heap shrank and grew again under them (or each was mapped and unmapped), and every page came back
    through a page fault: about one fault per five tokens in a stream process, and ~5-10% of its CPU.
    The process's memory stays at its high-water mark plus at most HEAP_KEPT_BYTES. False where the C
    library is not glibc (nothing changes then)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_TRIM_THRESHOLD, HEAP_KEPT_BYTES)) and bool(
        mallopt(M_MMAP_THRESHOLD, MMAP_FROM_BYTES)
    )
