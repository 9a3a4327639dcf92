"""What gradscale's plot scripts (plot_result.py, plot_trace.py) share: the error a bad input raises,
reported as one line at exit, and how a value read from a JSON file becomes a plotted number."""
import math
import sys


class PlotError(Exception):
    pass


def number(v):
    """v as a finite float, or None."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    v = float(v)
    return v if math.isfinite(v) else None


def run_main(main, prog):
    """Runs main(argv) as the script `prog` and exits with its status; a PlotError is one line on
    stderr ("prog: error: ...") and exit status 1."""
    try:
        sys.exit(main(sys.argv[1:]))
    except PlotError as e:
        print("%s: error: %s" % (prog, e), file=sys.stderr)
        sys.exit(1)
