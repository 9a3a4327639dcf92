"""The thread pool of the BLAS that torch calls on the CPU.

`torch.set_num_threads(n)` sets torch's own threads, not OpenBLAS's: OpenBLAS's pthread build (what
Debian's torch calls) starts one thread per core when it loads, and runs its GEMMs on all of them. A
run meant to take one thread (`gradscale.run --threads 1`, the ablation runner's `--jobs 2` on two
cores) then takes two, and two such runs fight over the cores. These set and read OpenBLAS's pool where
the process has OpenBLAS loaded (found in /proc/self/maps; elsewhere they do nothing and read None).
"""
from __future__ import annotations

import ctypes
from typing import List, Optional


def _openblas_libraries() -> List[str]:
    """The loaded shared libraries whose file name says OpenBLAS (Linux); [] where /proc is not there."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.rsplit("/", 1)[-1]}
    except OSError:
        return []
    return sorted(p for p in paths if p.startswith("/"))


def _function(name: str):
    for path in _openblas_libraries():
        try:
            return getattr(ctypes.CDLL(path), name)
        except (OSError, AttributeError):
            continue
    return None


def blas_threads() -> Optional[int]:
    """OpenBLAS's threads in this process, or None where no OpenBLAS is loaded."""
    get = _function("openblas_get_num_threads")
    return int(get()) if get is not None else None


def set_blas_threads(count: int) -> None:
    """OpenBLAS's GEMMs run on `count` threads from now on (nothing where no OpenBLAS is loaded)."""
    if count < 1:
        raise ValueError(f"gradscale: set_blas_threads({count}): the count must be at least 1")
    set_ = _function("openblas_set_num_threads")
    if set_ is not None:
        set_.argtypes = [ctypes.c_int]
        set_(count)
