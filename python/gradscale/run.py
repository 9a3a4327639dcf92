"""`python -m gradscale.run CONFIG.json`: one training run of a PyTorch model through `gradscale.torch.Scaler`,
from the config `gradscale train --config` reads (docs/config.md), writing the same result
(`gradscale.result/1`) and trace (`gradscale.trace/1`) files, so `gradscale ablate` runs PyTorch models
beside the C++ engine's and `gradscale inspect`, the tables and the plots read them unchanged
(docs/ablations.md, "PyTorch models").

    python -m gradscale.run CONFIG.json [--result R.json] [--trace PREFIX] [--threads N] [--name NAME]
    python -m gradscale.run --check CONFIG.json...    # build data and model, check they fit; train nothing
    python -m gradscale.run --check-runs RUNS.json    # the same for [{"name": ..., "config": {...}}, ...]

The config's "model" is {"torchvision": NAME, ...kwargs} or {"python": "file.py:function", ...} (_run_model);
"data" a spec of _run_data. Keys as `gradscale train`'s (_run_config), plus eval_every (steps between test evaluations,
0: at each epoch's end) and eval_examples (the first N test examples, 0: all). Deterministic: the seed
draws the initialisation and the data order; torch.use_deterministic_algorithms(True, warn_only=True);
TF32 off and cuDNN deterministic on CUDA. Not resumable: checkpoint/save_every/resume are refused (an
ablation runs a half-written run again from step 0). Exit status: 0; 3 when the run diverged (the result
says so); 2 for bad input, as one line naming the run and the config key; 1 for anything else.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import stat
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

from ._blas import blas_threads, set_blas_threads
from ._run_config import check_schedule, make_optimizer, resolve_config, schedule_lr
from ._run_load import ConfigProblem, one_line

EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DIVERGED = 1, 2, 3
MAX_JSON_BYTES = 64 << 20  # lib/core/json_read.h kMaxJsonFileBytes
NONFINITE_LOSS_LIMIT = 5  # lib/train/divergence.h kNonFiniteLossLimit


# ---- set-up shared by --check and training ---------------------------------------------------------
def set_deterministic(cfg: dict):
    import torch
    if cfg["device"].startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for determinism
        torch.backends.cuda.matmul.allow_tf32 = False  # so "fp32" rows are fp32
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    if cfg["threads"] > 0:
        torch.set_num_threads(cfg["threads"])
        set_blas_threads(cfg["threads"])  # OpenBLAS's pool, which torch's setting does not reach
    torch.manual_seed(cfg["seed"])


def build(cfg: dict, check_only: bool):
    """(data, model, where, device): the data loaded (or only checked), the model built on the device and
    its output checked against a batch of the data."""
    import torch
    from ._run_data import load_data
    from ._run_model import build_model, check_output, is_torch_model
    if not is_torch_model(cfg["model"]):
        build_model(cfg["model"], None)  # raises the message
    default_shape = (3, 32, 32) if "torchvision" in cfg["model"] else (1, 28, 28)
    data = load_data(cfg["data"], default_shape, check_only=check_only)
    if check_only and len(data.train) == 0:  # files only checked: a stand-in batch of the right shape
        x = torch.zeros((2,) + tuple(data.shape)) if data.shape else None
        y = torch.zeros(2, dtype=torch.long) if data.shape else None
    else:
        x, y = data.train.batch(torch.arange(min(2, len(data.train))))
    if cfg["device"].startswith("cuda") and not torch.cuda.is_available():
        raise ConfigProblem("device", f"'{cfg['device']}': this PyTorch sees no CUDA device")
    device = torch.device(cfg["device"])
    torch.manual_seed(cfg["seed"])  # the initialisation is the seed's first draw
    model, where = build_model(cfg["model"], data)
    model.to(device)
    if x is None and data.kind == "text":
        x = torch.zeros(2, data.context, dtype=torch.long)
        y = torch.zeros(2, data.context, dtype=torch.long)
    if x is not None:
        check_output(model, where, data, x.to(device), y.to(device))
    return data, model, where, device


# ---- training ------------------------------------------------------------------------------------
def evaluate(model, split, cfg: dict, device) -> Tuple[float, float]:
    """(accuracy, mean loss per target) over the test split (the first eval_examples of it)."""
    import torch
    import torch.nn.functional as F
    n = len(split) if cfg["eval_examples"] == 0 else min(len(split), cfg["eval_examples"])
    was = model.training
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    with torch.no_grad():
        for start in range(0, n, cfg["eval_batch"]):
            x, y = split.batch(torch.arange(start, min(n, start + cfg["eval_batch"])))
            x, y = x.to(device), y.to(device)
            out = forward(model, "the model", x, "evaluation")
            if not isinstance(out, torch.Tensor):
                raise ConfigProblem("model", f"the model returned {type(out).__name__} in evaluation, not a "
                                    "tensor of logits")
            logits = out.reshape(-1, out.shape[-1]).float()
            t = y.reshape(-1)
            check_labels(t, logits.shape[-1], None, "test")
            loss_sum += float(F.cross_entropy(logits, t, reduction="sum"))
            correct += int((logits.argmax(1) == t).sum())
            count += t.numel()
    model.train(was)
    return correct / max(1, count), loss_sum / max(1, count)


def forward(model, where: str, x, when: str):
    """model(x); an error the user's model raises is bad input naming the model (one line)."""
    try:
        return model(x)
    except (Exception, SystemExit) as e:
        raise ConfigProblem("model", f"{where} raised {type(e).__name__} at {when} on inputs of shape "
                            f"{tuple(x.shape)}: {one_line(e)}") from e


def check_labels(target, classes: int, data, part: str) -> None:
    """Class labels in [0, classes): cross_entropy raises an IndexError on others, or reads past the logits."""
    if target.numel() == 0:
        return
    lo, hi = int(target.min()), int(target.max())
    if lo < 0 or hi >= classes:
        source = f" ({data.source})" if data is not None else ""
        raise ConfigProblem("data", f"a {part} label is {lo if lo < 0 else hi}, outside the model's {classes} "
                            f"outputs [0, {classes - 1}]{source}")


def _finite(v: Optional[float]) -> Optional[float]:
    return v if v is not None and math.isfinite(v) else None


def check_result_path(path: str) -> None:
    """--result, checked before training (not after it): its directory is made as `gradscale train` makes it,
    and the path must be a file there that can be written."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigProblem("--result", f"'{path}' is a directory: give the result file's path")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as e:
        raise ConfigProblem("--result", f"cannot create the directory of '{path}': {e.strerror}") from e
    try:  # a file made and removed there: access() says yes to root where a write still fails (/proc)
        fd, probe = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path), dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigProblem("--result", f"cannot write in '{directory}' (the directory of '{path}'): "
                            f"{e.strerror}") from e


def write_atomic(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-" + os.path.basename(path), dir=directory)
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.fchmod(fd, 0o666 & ~umask)  # as a file open() creates (mkstemp's are 0600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def train(cfg: dict, result_path: str, quiet: bool) -> int:
    import torch
    import torch.nn.functional as F
    from . import __version__
    from .torch import Scaler
    set_deterministic(cfg)
    check_schedule(cfg)
    data, model, where, device = build(cfg, check_only=False)
    log = (lambda line: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    log(f"data: {data.source}")
    log(f"model: {where} ({sum(p.numel() for p in set(model.parameters()))} parameters) on {device}")
    trace = cfg["trace"] or None
    try:
        scaler = Scaler(model, scaler=cfg["scaler"], format=cfg["format"], grad_format=cfg["grad_format"],
                        weight_grads=cfg["weight_grads"], trace=trace, trace_every=cfg["trace_every"],
                        trace_hist=cfg["trace_hist"], shadow=cfg["shadow"])
    except (ValueError, TypeError, RuntimeError) as e:
        raise ConfigProblem("scaler", str(e)) from e
    opt = make_optimizer(cfg, model.parameters())
    n, batch = len(data.train), cfg["batch"]
    if n == 0:
        raise ConfigProblem("data", "the training set is empty")
    per_epoch = max(1, n // batch)  # the last partial batch is dropped (a batch of one breaks BatchNorm)
    total = cfg["epochs"] * per_epoch
    if cfg["max_steps"]:
        total = min(total, cfg["max_steps"])
    check_schedule(cfg, total)  # cosine's total_steps: the run's
    eval_every = cfg["eval_every"] or per_epoch
    order_rng = torch.Generator().manual_seed(cfg["seed"])
    history: List[dict] = []
    epoch_seconds: List[float] = []
    step = skipped = overflows = applied_steps = nonfinite_run = 0
    seen = correct = 0
    loss_sum = 0.0
    train_seconds = epoch_time = 0.0
    diverged: Optional[Tuple[int, str]] = None
    last_log = time.time()
    epoch = 0
    model.train()
    while step < total and diverged is None:
        order = torch.randperm(n, generator=order_rng)
        epoch_start = train_seconds
        for b in range(per_epoch):
            if step >= total:
                break
            t0 = time.time()
            x, y = data.train.batch(order[b * batch:(b + 1) * batch])
            x, y = x.to(device), y.to(device)
            for group in opt.param_groups:
                group["lr"] = schedule_lr(cfg, applied_steps, total)
            out = forward(model, where, x, f"step {step + 1}")
            if not isinstance(out, torch.Tensor):
                raise ConfigProblem("model", f"{where} returned {type(out).__name__} in training mode, not a "
                                    "tensor of logits")
            if not out.requires_grad:
                raise ConfigProblem("model", f"{where}'s output in training mode does not require grad (detached, "
                                    "or computed under no_grad): there is nothing to train")
            logits = out.reshape(-1, out.shape[-1])
            target = y.reshape(-1)
            check_labels(target, logits.shape[-1], data, "train")
            loss = F.cross_entropy(logits, target)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            applied = scaler.step(opt)
            scaler.update()
            step += 1
            last = scaler.last_step or {}
            applied_steps += bool(applied)
            skipped += not applied
            overflows += bool(last.get("found_inf"))
            lv = float(loss.detach())
            dt = time.time() - t0
            train_seconds += dt
            epoch_time += dt
            if math.isfinite(lv):
                nonfinite_run = 0
                loss_sum += lv * target.numel()
                correct += int((logits.detach().argmax(1) == target).sum())
                seen += target.numel()
            else:
                nonfinite_run += 1
                if nonfinite_run >= NONFINITE_LOSS_LIMIT:
                    diverged = (step, f"the loss was not finite {nonfinite_run} iterations in a row")
            if applied and diverged is None:
                for name, p in model.named_parameters():
                    if not bool(torch.isfinite(p).all()):
                        diverged = (step, f"parameter '{name}' is not finite after the optimizer step")
                        break
            if diverged is not None:
                break
            now = time.time()
            if cfg["progress_seconds"] and now - last_log >= cfg["progress_seconds"]:
                rate = step / max(1e-9, train_seconds)
                eta = (total - step) / max(1e-9, rate)
                log(f"epoch {epoch + 1}/{cfg['epochs']}  step {step}/{total}  loss {loss_sum / max(1, seen):.4f}  "
                    f"acc {correct / max(1, seen):.4f}  S {scaler.get_scale():.6g}  skipped {skipped}  "
                    f"{rate:.1f} steps/s  ETA {int(eta) // 60}:{int(eta) % 60:02d}")
                last_log = now
            if step % eval_every == 0 or step == total:
                acc, tl = evaluate(model, data.test, cfg, device)
                history.append({"epoch": epoch + 1, "step": step, "scale": _finite(scaler.get_scale()),
                                "seconds": epoch_time, "skipped_steps": skipped, "steps": step,
                                "test_accuracy": acc, "test_loss": _finite(tl),
                                "train_accuracy": correct / max(1, seen), "train_loss": loss_sum / max(1, seen)})
                log(f"step {step} evaluated: train loss {loss_sum / max(1, seen):.4f} acc {correct / max(1, seen):.4f}"
                    f" | test loss {tl:.4f} acc {acc:.4f} | S {scaler.get_scale():.6g} | skipped {skipped}")
                loss_sum, correct, seen = 0.0, 0, 0
                epoch_time = 0.0
        else:
            epoch_seconds.append(train_seconds - epoch_start)
            epoch += 1
            continue
        break
    result: Dict[str, Any] = {"schema": "gradscale.result/1", "version": __version__}
    last_eval = history[-1] if history else {}
    if diverged is not None:
        result.update({"complete": False, "diverged": True, "diverged_step": diverged[0], "divergence": diverged[1]})
        summary = {"train_loss": None, "train_accuracy": None, "test_loss": None, "test_accuracy": None}
    else:
        result.update({"complete": step == total, "diverged": False})
        summary = {k: last_eval.get(k) for k in ("train_loss", "train_accuracy", "test_loss", "test_accuracy")}
    scaler.close(**summary)
    result.update({
        "steps": step, "skipped_steps": skipped, "overflow_steps": overflows,
        "scaler_seconds": None,  # the plug-in's public API does not time its hooks (the trace summary does)
        "applied_steps": applied_steps, "epochs_done": len(epoch_seconds), "epoch_seconds": epoch_seconds,
        "train_seconds": train_seconds, "history": history, "final_scale": _finite(scaler.get_scale()),
        "scaler_state": scaler.state_dict()["core"], "data": data.source,
        "parameters": sum(p.numel() for p in set(model.parameters())),
    })
    if trace:
        result["trace"] = {"jsonl": trace + ".jsonl", "json": trace + ".json"}
    result.update(summary)
    result["engine"] = {"name": "pytorch", "torch": torch.__version__, "model": where,
                        "torchvision": _torchvision_version(),
                        "deterministic": "torch.use_deterministic_algorithms(True, warn_only=True); TF32 off, "
                                         "cuDNN deterministic on CUDA; seeded init and data order",
                        "device": str(device), "threads": torch.get_num_threads(), "blas_threads": blas_threads()}
    result["config"] = cfg
    if result_path:
        write_atomic(result_path, json.dumps(result, indent=2, allow_nan=False) + "\n")
    if diverged is not None:
        print(f"gradscale.run: diverged at step {diverged[0]}: {diverged[1]}", file=sys.stderr)
        return EXIT_DIVERGED
    print(f"test_accuracy {summary['test_accuracy']}  test_loss {summary['test_loss']}  steps {step}  "
          f"skipped {skipped}  final_scale {result['final_scale']}")
    return 0


def _torchvision_version() -> Optional[str]:
    try:
        import torchvision
        return torchvision.__version__
    except ImportError:
        return None


# ---- the command line ------------------------------------------------------------------------------
def _read_json(path: str, what: str) -> Any:
    """A JSON file as lib/core/json_read.h reads one: a regular file (a FIFO is refused, never waited on),
    at most MAX_JSON_BYTES, nesting Python's parser can hold."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise ConfigProblem(what, f"cannot read '{path}': Is a directory")
        if not stat.S_ISREG(st.st_mode):
            raise ConfigProblem(what, f"cannot read '{path}': not a regular file (a FIFO, socket or device)")
        with open(path, "rb") as f:
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise ConfigProblem(what, f"cannot read '{path}': {e.strerror}") from e
    if len(raw) > MAX_JSON_BYTES:
        raise ConfigProblem(what, f"'{path}' is larger than {MAX_JSON_BYTES >> 20} MiB: not a config")
    try:
        return json.loads(raw.decode("utf-8"))
    except RecursionError as e:
        raise ConfigProblem(what, f"'{path}' is not valid JSON: nested too deeply") from e
    except ValueError as e:
        raise ConfigProblem(what, f"'{path}' is not valid JSON: {e}") from e


def run_name(config_path: str) -> str:
    """runs/<name>/config.json (an ablation's layout) → <name>; any other path as it is."""
    if os.path.basename(config_path) == "config.json":
        return os.path.basename(os.path.dirname(os.path.abspath(config_path)))
    return config_path


def check_runs(runs: List[Tuple[str, Any]]) -> List[str]:
    """One line per run whose config is bad; [] when all are good. Each distinct (model, data) is built once."""
    problems, seen = [], {}
    for name, doc in runs:
        try:
            cfg = resolve_config(doc)
            check_schedule(cfg)
            key = json.dumps([cfg["model"], cfg["data"], cfg["device"]], sort_keys=True)
            if key not in seen:
                seen[key] = None
                try:
                    build(cfg, check_only=True)
                except ConfigProblem as e:
                    seen[key] = e
            if seen[key] is not None:
                raise seen[key]
        except ConfigProblem as e:
            problems.append(f"run '{name}': config key '{e.key}': {one_line(e)}")
    return problems


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m gradscale.run", description=__doc__.split("\n")[0])
    ap.add_argument("config", nargs="*", help="the run's config file (JSON)")
    ap.add_argument("--result", default="", help="write the result JSON here (atomically)")
    ap.add_argument("--trace", default=None, help="[trace] the trace goes to PREFIX.jsonl and PREFIX.json")
    ap.add_argument("--threads", type=int, default=None, help="[threads] 0 = PyTorch's default")
    ap.add_argument("--name", default=None, help="the run's name in messages (default: from the config path)")
    ap.add_argument("--quiet", action="store_true", help="no progress lines")
    ap.add_argument("--check", action="store_true", help="check the configs (data, model, output shape); train nothing")
    ap.add_argument("--check-runs", default=None, help="check [{\"name\": ..., \"config\": {...}}, ...] from this file")
    args = ap.parse_args(argv)
    if args.check_runs or args.check:
        runs: List[Tuple[str, Any]] = []
        try:
            if args.check_runs:
                doc = _read_json(args.check_runs, "--check-runs")
                if not isinstance(doc, list) or not all(isinstance(r, dict) and "config" in r for r in doc):
                    raise ConfigProblem("--check-runs", "must hold [{\"name\": ..., \"config\": {...}}, ...]")
                runs += [(str(r.get("name", "?")), r["config"]) for r in doc]
            for path in args.config:
                runs.append((args.name or run_name(path), _read_json(path, "config")))
        except ConfigProblem as e:
            print(f"gradscale.run: {e.key}: {one_line(e)}", file=sys.stderr)
            return EXIT_BAD_INPUT
        try:
            problems = check_runs(runs)
        except Exception as e:  # not bad input (that is a problem line): one line, exit 1
            if os.environ.get("GRADSCALE_DEBUG") == "1":
                traceback.print_exc()
            print(f"gradscale.run: {type(e).__name__}: {one_line(e)}", file=sys.stderr)
            return EXIT_FAILED
        for line in problems:
            print(f"gradscale.run: {line}", file=sys.stderr)
        if not problems:  # the line gradscale ablate waits for (torch_runs.cpp): exit 0 alone is any program's
            print(f"ok: checked {len(runs)} run{'' if len(runs) == 1 else 's'}")
        return EXIT_BAD_INPUT if problems else 0
    if len(args.config) != 1:
        ap.error("give one config file (or --check with several)")
    path = args.config[0]
    name = args.name or run_name(path)
    try:
        doc = _read_json(path, "config")
        if isinstance(doc, dict):
            if args.trace is not None:
                doc["trace"] = args.trace
            if args.threads is not None:
                doc["threads"] = args.threads
        cfg = resolve_config(doc)
        if args.result:
            check_result_path(args.result)
        return train(cfg, args.result, args.quiet)
    except ConfigProblem as e:
        key = e.key if e.key.startswith("--") else f"config key '{e.key}'"
        print(f"gradscale.run: run '{name}': {key}: {one_line(e)}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as e:  # anything else: one line, as the C++ commands print (the traceback on request)
        if os.environ.get("GRADSCALE_DEBUG") == "1":
            traceback.print_exc()
        print(f"gradscale.run: run '{name}': {type(e).__name__}: {one_line(e)}", file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
