"""`gradscale ablate` with a PyTorch run that crashes mid-way (its model raises on a later forward): the run is
reported as failed — in the runner's lines with its exit status and its error, and in the table (counted in
its row, not averaged in) — while the ablation goes on; never silently dropped; `--retry-failed` runs it
again."""
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("GRADSCALE_CLI") or os.path.join(ROOT, "build", "gradscale")

FACTORY = '''
from torch import nn

class Breaks(nn.Module):
    """A small classifier whose forward raises on its call number `at` (counted per process)."""
    def __init__(self, at, num_classes):
        super().__init__()
        self.at, self.calls = at, 0
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(784, 8), nn.ReLU(), nn.Linear(8, num_classes))

    def forward(self, x):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("the model broke at forward %d" % self.calls)
        return self.net(x)

def make_model(num_classes=10, at=0):
    return Breaks(at, num_classes)
'''


def _runner_starts_torch_runs() -> bool:
    if not os.access(CLI, os.X_OK):
        return False
    out = subprocess.run([CLI, "ablate", "--help"], capture_output=True, text=True, timeout=60)
    return "--python" in out.stdout + out.stderr


pytestmark = pytest.mark.skipif(not _runner_starts_torch_runs(),
                                reason=f"{CLI} is missing or its ablate has no --python (PyTorch runs)")


def test_a_run_that_crashes_mid_way_is_a_failed_run_in_the_table(tmp_path):
    factory = tmp_path / "factory.py"
    factory.write_text(FACTORY)
    # "at": 3 breaks on the third forward of training (the check at --dry-run time runs in its own process).
    doc = {"base": {"data": "synthetic:64", "batch": 16, "max_steps": 4, "format": "fp16", "grad_format": "fp8_e5m2",
                    "trace_every": 1, "threads": 1},
           "axes": {"model": [{"label": "breaks", "value": {"python": f"{factory}:make_model", "at": 3}}],
                    "scaler": ["torch"]},
           "seeds": [0]}
    path = tmp_path / "ablation.json"
    path.write_text(json.dumps(doc))
    out = tmp_path / "out"
    env = dict(os.environ, GRADSCALE_PYTHON=sys.executable)
    p = subprocess.run([CLI, "ablate", str(path), "--out", str(out), "--no-plots"], capture_output=True, text=True,
                       timeout=300, env=env, cwd=ROOT)
    assert p.returncode == 0, p.stderr  # the ablation goes on (docs/ablations.md, "What runs")
    assert "breaks_torch_seed0: FAILED (exit 2)" in p.stderr and "the model broke at forward 3" in p.stderr
    assert "1 failed" in p.stderr
    rows = json.load(open(out / "table.json"))["rows"]
    assert len(rows) == 1
    broken = rows[0]
    assert (broken["done"], broken["failed"], broken["runs"]) == (0, 1, 1)
    markdown = (out / "table.md").read_text()
    assert "1 failed" in markdown
    # Its own log names the cause.
    logs = "".join(f.read_text(errors="replace") for f in (out / "runs" / "breaks_torch_seed0").iterdir()
                   if f.is_file() and f.suffix in (".log", ".txt", ""))
    assert "the model broke at forward 3" in logs
    # A run again without --retry-failed keeps it failed; with it, it is run again (and fails again).
    again = subprocess.run([CLI, "ablate", str(path), "--out", str(out), "--no-plots", "--retry-failed"],
                           capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert "1 failed, run again" in again.stderr
    assert json.load(open(out / "table.json"))["rows"][0]["failed"] == 1
