"""gradscale: layer-wise adaptive loss scaling for mixed-precision training.

`gradscale.torch` brings the C++ core's scalers to PyTorch models (docs/pytorch.md). The core itself
is the compiled module `gradscale._core`, built by `pip install .` (pyproject.toml) from the repository.
"""
try:
    from . import _core
except ImportError as e:  # pragma: no cover - the message is the point
    raise ImportError("gradscale: the compiled core (gradscale._core) was not found; install the package "
                      "with `pip install .` from the repository (or scripts/setup.sh --torch, then "
                      ".venv/bin/python)") from e

__version__ = _core.__version__
