"""What gradscale's plot scripts (plot_result.py, plot_trace.py) share: the error a bad input raises,
reported as one line at exit, and how a value read from a JSON file becomes a plotted number."""
import math


class PlotError(Exception):
    pass


def number(v):
    """v as a finite float, or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None
