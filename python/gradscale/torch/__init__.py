"""Per-layer adaptive loss scaling for existing PyTorch modules, on gradscale's C++ core.

    from gradscale.torch import Scaler
    scaler = Scaler(model, scaler={"policy": "adaptive", "method": "measured"}, format="fp16")

See `Scaler` and docs/pytorch.md.
"""
from .scaler import Scaler

__all__ = ["Scaler"]
