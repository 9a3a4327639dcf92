"""`gradscale ablate` with PyTorch runs (python -m gradscale.run as each run's process): a two-run ablation of a
factory model in a temporary file (and of a small torchvision model when torchvision is installed) runs,
resumes after the runner is killed, merges shards and gives the table columns a C++ ablation gives; a bad
model stops it at --dry-run, naming the run and the key, exit 2; a run that crashes mid-way (its model raises on
a later forward) is reported as failed — in the runner's lines with its exit status and its error, and in the
table — while the ablation goes on, and --retry-failed runs it again."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
CLI = os.environ.get("GRADSCALE_CLI") or os.path.join(ROOT, "build", "gradscale")

FACTORY = '''
from torch import nn

def make_model(num_classes=10, width=8):
    return nn.Sequential(nn.Flatten(), nn.Linear(784, width), nn.ReLU(), nn.Linear(width, num_classes))

def wrong():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 7))
'''


BREAKING_FACTORY = '''
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


def ablate(*args, check=True):
    env = dict(os.environ, GRADSCALE_PYTHON=sys.executable)
    p = subprocess.run([CLI, "ablate", *args, "--no-plots"], capture_output=True, text=True, timeout=300,
                       env=env, cwd=ROOT)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def ablation(tmp_path, model="make_model", torchvision=False):
    factory = tmp_path / "factory.py"
    factory.write_text(FACTORY)
    models = [{"label": "factory", "value": {"python": f"{factory}:{model}"}}]
    if torchvision:
        models.append({"label": "squeezenet", "set": {"model": {"torchvision": "squeezenet1_1"},
                                                      "data": "synthetic:32:3x32x32"}})
    doc = {"base": {"data": "synthetic:32", "batch": 16, "max_steps": 2, "format": "fp16", "grad_format": "fp8_e5m2",
                    "trace_every": 1, "threads": 1},
           "axes": {"model": models, "scaler": ["none", "torch"]}, "seeds": [0]}
    path = tmp_path / "ablation.json"
    path.write_text(json.dumps(doc))
    return str(path)


def table(out):
    with open(os.path.join(out, "table.json")) as f:
        return json.load(f)


def test_runs_and_gives_the_columns_of_a_cpp_ablation(tmp_path):
    try:
        import torchvision  # noqa: F401
        with_tv = True
    except ImportError:
        with_tv = False
    out = str(tmp_path / "out")
    path = ablation(tmp_path, torchvision=with_tv)
    doc = json.load(open(path))
    doc["base"]["shadow"] = True
    doc["compare_to"] = {"scaler": "none"}
    open(path, "w").write(json.dumps(doc))
    ablate(path, "--out", out, "--jobs", "2")
    t = table(out)
    assert all(r["done"] == 1 for r in t["rows"]), t
    assert len(t["rows"]) == (4 if with_tv else 2)
    result = json.load(open(os.path.join(out, "runs", "factory_torch_seed0", "result.json")))
    assert result["schema"] == "gradscale.result/1" and result["engine"]["name"] == "pytorch"
    # A C++ ablation of the same axes: the same CSV columns.
    cpp = tmp_path / "cpp.json"
    cpp.write_text(json.dumps({"base": {"data": "synthetic:32", "batch": 16, "max_steps": 2, "trace_every": 1},
                               "axes": {"model": ["mlp"], "scaler": ["none", "torch"]}, "seeds": [0]}))
    ablate(str(cpp), "--out", str(tmp_path / "cpp"))
    header = lambda d: open(os.path.join(d, "table.csv")).readline()  # noqa: E731
    assert header(out) == header(str(tmp_path / "cpp"))
    for column in ("shadow_rel_error_mean", "shadow_underflow_mass_mean", "target_accuracy", "steps_to_target_mean",
                   "steps_to_target_reached", "diff_final_accuracy_lo", "diff_final_accuracy_hi"):
        assert column in header(out).rstrip("\n").split(","), column
    # The PyTorch runs' figures: the shadow's means from their traces, a comparison paired by seed (one seed:
    # no interval, and why), no steps to target (no fp32 row: the notes say so).
    factory_none, factory_torch = t["rows"][0], t["rows"][1]
    assert factory_none["shadow_rel_error"]["n"] == 1 and factory_torch["shadow_rel_error"]["mean"] > 0
    assert factory_none["compare"]["reference"] == 0 and factory_torch["compare"]["why"] == "1 pair"
    assert factory_torch["steps_to_target"]["why"] == "no fp32 row" and factory_torch["steps_to_target"]["runs"] == 1
    assert any("no fp32 row" in n for n in t["notes"])


def test_resumes_after_a_kill_and_merges_shards(tmp_path):
    path = ablation(tmp_path)
    out = str(tmp_path / "out")
    env = dict(os.environ, GRADSCALE_PYTHON=sys.executable)
    p = subprocess.Popen([CLI, "ablate", path, "--out", out, "--jobs", "1", "--no-plots"], cwd=ROOT, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    first = os.path.join(out, "runs", "factory_none_seed0", "result.json")
    deadline = time.time() + 120
    while not os.path.exists(first) and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGKILL)  # the runner and its run
    p.wait()
    assert os.path.exists(first)
    again = ablate(path, "--out", out)
    assert "already finished" in again.stderr
    assert all(r["done"] == 1 for r in table(out)["rows"])
    # Two shards into one directory, then the tables.
    shards = str(tmp_path / "shards")
    ablate(path, "--out", shards, "--shard", "1/2")
    ablate(path, "--out", shards, "--shard", "2/2")
    ablate(path, "--out", shards, "--table-only")
    assert [r["done"] for r in table(shards)["rows"]] == [1, 1]


def test_bad_model_stops_the_dry_run(tmp_path):
    p = ablate(ablation(tmp_path, model="wrong"), "--dry-run", check=False)
    assert p.returncode == 2
    assert "run 'factory_none_seed0': config key 'model':" in p.stderr and "(2, 7)" in p.stderr


def test_a_run_that_crashes_mid_way_is_a_failed_run_in_the_table(tmp_path):
    factory = tmp_path / "factory.py"
    factory.write_text(BREAKING_FACTORY)
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
