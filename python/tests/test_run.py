"""`python -m gradscale.run` (gradscale/run.py): a tiny factory model trains and writes the C++ runner's
result schema and a trace; every bad input is one line naming the run and the key, exit 2."""
import json
import os
import subprocess
import sys

import pytest

from gradscale import run

PYTHON_DIR = os.path.join(os.path.dirname(__file__), "..")

FACTORY = '''
import torch
from torch import nn

def make_model(num_classes=10, width=8, in_channels=1):
    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 28 * 28, width), nn.ReLU(), nn.Linear(width, num_classes))

def raises(**kw):
    raise RuntimeError("no model today")

def not_a_module():
    return 42

def wrong_classes():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 7))

def make_data(n=64):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 1, 28, 28, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return torch.utils.data.TensorDataset(x[:48], y[:48]), torch.utils.data.TensorDataset(x[48:], y[48:])

def exits(**kw):
    raise SystemExit(0)

def raises_in_training(num_classes=10):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(784, num_classes)
        def forward(self, x):
            if self.training:
                raise ValueError("only in training")
            return self.fc(x.flatten(1))
    return M()

def detached(num_classes=10):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(784, num_classes)
        def forward(self, x):
            return self.fc(x.flatten(1)).detach()
    return M()

def labelled(kind="float", n=64):
    x = torch.randn(n, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    y = torch.arange(n) % 10
    train, test = y[:48], y[48:]
    if kind == "float":
        train = train.float()
    elif kind == "negative":
        train = train - 1
    elif kind == "test_too_large":
        test = test + 50
    return torch.utils.data.TensorDataset(x[:48], train), torch.utils.data.TensorDataset(x[48:], test)

def getitem_raises():
    class D:
        def __len__(self):
            return 8
        def __getitem__(self, i):
            raise KeyError(i)
    return D(), D()

def tiny_lm(vocab, context, d=8):
    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.out = nn.Linear(d, vocab)
        def forward(self, idx):
            return self.out(torch.relu(self.emb(idx)))
    return LM()
'''


@pytest.fixture
def factory(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(FACTORY)
    return str(path)


def base(factory, **kw):
    cfg = {"model": {"python": f"{factory}:make_model"}, "data": "synthetic:64", "batch": 16, "max_steps": 4,
           "format": "fp16", "grad_format": "fp8_e5m2", "scaler": "torch", "trace_every": 1, "eval_every": 2,
           "threads": 1, "progress_seconds": 0}
    cfg.update(kw)
    return cfg


def write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return str(path)


def test_trains_and_writes_the_result_schema(tmp_path, factory):
    cfg = base(factory, scaler={"policy": "adaptive", "method": "measured", "init_scale": "auto",
                                "cast_form": "measured"})
    result, trace = tmp_path / "result.json", tmp_path / "trace"
    assert run.main([write(tmp_path, cfg), "--result", str(result), "--trace", str(trace), "--quiet"]) == 0
    r = json.loads(result.read_text())
    # The keys the ablation table and `gradscale inspect` read, as `gradscale train` writes them.
    for key in ("schema", "steps", "skipped_steps", "diverged", "complete", "test_accuracy", "test_loss",
                "train_loss", "train_accuracy", "history", "train_seconds", "final_scale", "config", "trace"):
        assert key in r, key
    assert r["schema"] == "gradscale.result/1" and r["steps"] == 4 and r["complete"] and not r["diverged"]
    assert [h["step"] for h in r["history"]] == [2, 4]
    assert r["engine"]["name"] == "pytorch"
    t = json.loads((tmp_path / "trace.json").read_text())
    assert t["schema"] == "gradscale.trace/1" and t["summary"]["layers"]
    assert t["summary"]["test_accuracy"] == r["test_accuracy"]


def test_threads_reach_openblas(tmp_path, factory):
    """`threads` sets OpenBLAS's pool as well as torch's (torch.set_num_threads does not reach it, so a
    one-thread run ran its GEMMs on every core), and the result says what it was."""
    from gradscale import _blas
    if _blas.blas_threads() is None:
        pytest.skip("torch calls no OpenBLAS in this process")
    _blas.set_blas_threads(2)
    result = tmp_path / "result.json"
    assert run.main([write(tmp_path, base(factory, threads=1)), "--result", str(result), "--quiet"]) == 0
    assert json.loads(result.read_text())["engine"]["blas_threads"] == 1
    assert _blas.blas_threads() == 1
    with pytest.raises(ValueError, match="set_blas_threads"):
        _blas.set_blas_threads(0)


def test_same_seed_same_result(tmp_path, factory):
    out = []
    for k in range(2):
        result = tmp_path / f"r{k}.json"
        assert run.main([write(tmp_path, base(factory), f"c{k}.json"), "--result", str(result), "--quiet"]) == 0
        out.append(json.loads(result.read_text())["history"])
    assert [h["test_loss"] for h in out[0]] == [h["test_loss"] for h in out[1]]


def test_text_and_user_dataset(tmp_path, factory):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 20)
    lm = base(factory, model={"python": f"{factory}:tiny_lm"}, data=f"text:{text}:ctx=8", format="fp32",
              grad_format="fp16")
    result = tmp_path / "lm.json"
    assert run.main([write(tmp_path, lm, "lm.json"), "--result", str(result), "--quiet"]) == 0
    assert json.loads(result.read_text())["test_loss"] > 0
    user = base(factory, data={"python": f"{factory}:make_data", "n": 64})
    assert run.main([write(tmp_path, user, "user.json"), "--result", str(tmp_path / "u.json"), "--quiet"]) == 0


@pytest.mark.parametrize("change,key,words", [
    ({"model": {"python": "FACTORY:raises"}}, "model", "raised RuntimeError: no model today"),
    ({"model": {"python": "FACTORY:not_a_module"}}, "model", "returned int, not an nn.Module"),
    ({"model": {"python": "FACTORY:wrong_classes"}}, "model", "output has shape (2, 7)"),
    ({"model": {"python": "FACTORY:nowhere"}}, "model", "has no function 'nowhere'"),
    ({"model": {"python": "/no/such/file.py:f"}}, "model", "is not a file"),
    ({"model": {"torchvision": "resnet_huge"}}, "model", "has no model 'resnet_huge'"),
    ({"model": {"torchvision": "resnet18", "weights": "DEFAULT"}}, "model", "without weights"),
    ({"model": {"torchvision": "resnet18", "pretrained": True}}, "model", "remove 'pretrained'"),
    ({"model": "mlp"}, "model", "must be {\"torchvision\""),
    ({"data": "imagenet"}, "data", "unknown data spec 'imagenet'"),
    ({"data": "text:/no/such/file"}, "data", "is not a file"),
    ({"lr": -1}, "lr", "finite number >= 0"),
    ({"colour": "red"}, "colour", "unknown config key"),
    ({"optimizer": {"name": "sgd", "betas": 1}}, "optimizer", "unknown key 'betas'"),
    ({"resume": "/tmp/x"}, "resume", "do not checkpoint or resume"),
    ({"scaler": {"policy": "no-such-policy"}}, "scaler", "no-such-policy"),
    # The user's code: sys.exit in a factory, errors only in training mode, an output without a graph, an
    # error message over several lines (PyTorch's list of overloads).
    ({"model": {"python": "FACTORY:exits"}}, "model", "raised SystemExit"),
    ({"model": {"python": "FACTORY:raises_in_training"}}, "model", "raised ValueError at step 1"),
    ({"model": {"python": "FACTORY:detached"}}, "model", "does not require grad"),
    ({"model": {"python": "FACTORY:make_model", "width": "wide"}}, "model", "raised TypeError"),
    # A user's Dataset: float, negative or out-of-range labels, a __getitem__ that raises.
    ({"data": {"python": "FACTORY:labelled", "kind": "float"}}, "data", "labels must be integer class indices"),
    ({"data": {"python": "FACTORY:labelled", "kind": "negative"}}, "data", "labels must be class indices >= 0"),
    ({"data": {"python": "FACTORY:labelled", "kind": "test_too_large"}}, "data", "a test label is 5"),
    ({"data": {"python": "FACTORY:getitem_raises"}}, "data", "raised KeyError"),
    ({"data": "synthetic:1000000:3x1024x1024"}, "data", "more than the largest synthetic set"),
    # The optimizer's and schedule's keys as gradscale train checks them (lib/optim).
    ({"optimizer": {"name": "sgd", "momentum": "x"}}, "optimizer", "'momentum'"),
    ({"optimizer": {"name": "sgd", "momentum": float("nan")}}, "optimizer", "finite"),
    ({"optimizer": {"name": "adam", "eps": [1]}}, "optimizer", "'eps'"),
    ({"schedule": {"name": "step", "step_size": 1, "gamma": "x"}}, "schedule", "'gamma'"),
    ({"schedule": {"name": "step", "step_size": True}}, "schedule", "'step_size'"),
    ({"schedule": {"name": "constant", "warmup_steps": -3}}, "schedule", "'warmup_steps'"),
    ({"schedule": {"name": "constant", "warmup_steps": 2.5}}, "schedule", "'warmup_steps'"),
    ({"schedule": {"name": "constant", "lr": -1}}, "schedule", "'lr'"),
    ({"schedule": {"name": "cosine", "total_steps": 0}}, "schedule", "'total_steps'"),
    ({"schedule": {"name": "cosine", "min_lr": "x"}}, "schedule", "'min_lr'"),
])
def test_bad_input_is_one_line_naming_run_and_key(tmp_path, factory, capsys, change, key, words):
    cfg = base(factory)
    for k, v in change.items():
        cfg[k] = json.loads(json.dumps(v).replace("FACTORY", factory))  # NaN stays NaN (Python's json)
    run_dir = tmp_path / "runs" / "bad_seed0"
    run_dir.mkdir(parents=True)
    status = run.main([write(run_dir, cfg), "--result", str(run_dir / "result.json"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert status == 2, err
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"gradscale.run: run 'bad_seed0': config key '{key}': "), err
    assert words in err, err
    assert not (run_dir / "result.json").exists()


def test_missing_torchvision(tmp_path, factory, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import torchvision raises ImportError
    cfg = base(factory, model={"torchvision": "resnet18"})
    assert run.main([write(tmp_path, cfg), "--check"]) == 2
    err = capsys.readouterr().err
    assert "config key 'model': torchvision is not installed" in err


def test_check_runs_lists_every_bad_run(tmp_path, factory, capsys):
    runs = [{"name": "good", "config": base(factory)},
            {"name": "bad", "config": base(factory, model={"python": f"{factory}:wrong_classes"})}]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(runs))
    assert run.main(["--check-runs", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [e for e in err if e.startswith("gradscale.run: run 'bad': config key 'model'")] and len(err) == 1


def test_module_entry_point_exit_status(tmp_path, factory):
    cfg = base(factory, model={"python": f"{factory}:raises"})
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    p = subprocess.run([sys.executable, "-m", "gradscale.run", write(tmp_path, cfg)], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert "config key 'model'" in p.stderr and "Traceback" not in p.stderr


def test_bad_files_are_refused_before_training(tmp_path, factory, capsys):
    """A config nested deeper than Python's parser holds, a FIFO (never waited on), a --result that is a
    directory or under a file: exit 2 with one line, before any training."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100000 + "]" * 100000)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    good = write(tmp_path, base(factory))
    for argv, words in (([str(deep)], "nested too deeply"), ([str(fifo)], "not a regular file"),
                        ([good, "--result", str(tmp_path)], "is a directory"),
                        ([good, "--result", str(tmp_path / "config.json" / "r.json")], "--result"),
                        ([good, "--result", "/proc/gradscale-result.json"], "cannot write in '/proc'")):
        assert run.main(argv + ["--quiet"]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and words in err, err
    runs = tmp_path / "runs.json"
    runs.write_text(json.dumps([{"name": "a", "config": base(factory, optimizer={"name": "sgd", "momentum": "x"})}]))
    assert run.main(["--check-runs", str(runs)]) == 2
    assert "run 'a': config key 'optimizer'" in capsys.readouterr().err


def test_result_is_made_as_open_makes_a_file(tmp_path, factory):
    result = tmp_path / "new" / "dir" / "result.json"  # its directory made, as gradscale train makes it
    old = os.umask(0o022)
    try:
        assert run.main([write(tmp_path, base(factory)), "--result", str(result), "--quiet"]) == 0
    finally:
        os.umask(old)
    assert (result.stat().st_mode & 0o777) == 0o644


def test_an_error_that_is_not_bad_input_is_one_line_exit_1(tmp_path, factory, capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("the step\nfailed")
    monkeypatch.setattr(run, "schedule_lr", broken)
    path = write(tmp_path, base(factory), "c.json")
    assert run.main([path, "--quiet"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"gradscale.run: run '{path}': RuntimeError: the step failed"]
