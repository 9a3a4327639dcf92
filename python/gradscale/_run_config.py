"""The config of `python -m gradscale.run` (run.py): `gradscale train`'s keys (docs/config.md) with their
defaults, checked key by key as the C++ runner checks them (the optimizer's and the lr schedule's by
lib/optim through the core), and the PyTorch optimizer and learning rate they describe. Bad input is a
`ConfigProblem` naming the key.
"""
from __future__ import annotations

import json
import math
from typing import Any, Dict, Optional, Tuple

from ._run_load import ConfigProblem, one_line

FORMATS = ("fp32", "fp16", "bf16", "fp8_e5m2", "fp8_e4m3")
DEFAULTS: Dict[str, Any] = {
    "model": None, "data": "fashion-mnist", "format": "fp32", "grad_format": None, "weight_grads": "format",
    "scaler": "none", "optimizer": "adam", "schedule": "constant", "lr": 1e-3, "epochs": 1, "batch": 128,
    "eval_batch": 1000, "max_steps": 0, "seed": 0, "threads": 0, "progress_seconds": 5.0, "device": "cpu",
    "trace": "", "trace_every": 10, "trace_hist": False, "shadow": False, "eval_every": 0, "eval_examples": 0,
    "checkpoint": "", "save_every": 0, "resume": "",
}


def _integer(cfg: dict, key: str, lo: int, hi: int) -> int:
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise ConfigProblem(key, f"must be an integer in [{lo}, {hi}], got {json.dumps(v)}")
    return v


def _named(v: Any, key: str, allowed: Tuple[str, ...]) -> dict:
    obj = {"name": v} if isinstance(v, str) else v
    if not isinstance(obj, dict) or obj.get("name") not in allowed:
        raise ConfigProblem(key, f"must be one of {', '.join(allowed)} or an object with \"name\", got {json.dumps(v)}")
    return dict(obj)


def resolve_config(doc: Any) -> dict:
    """The config with every key set (defaults as `gradscale train`'s), checked key by key."""
    if not isinstance(doc, dict):
        raise ConfigProblem("config", "a training config must be a JSON object")
    unknown = [k for k in doc if k not in DEFAULTS]
    if unknown:
        raise ConfigProblem(unknown[0], f"unknown config key (allowed: {', '.join(DEFAULTS)})")
    cfg = dict(DEFAULTS)
    cfg.update(doc)
    for key in ("checkpoint", "resume"):
        if cfg[key]:
            raise ConfigProblem(key, "PyTorch runs do not checkpoint or resume: a run starts from step 0 "
                                "(an ablation runs a half-written run again)")
    if cfg["save_every"]:
        raise ConfigProblem("save_every", "PyTorch runs do not checkpoint")
    if cfg["model"] is None:
        raise ConfigProblem("model", "missing: {\"torchvision\": NAME, ...} or {\"python\": \"file.py:function\", ...}")
    if cfg["grad_format"] is None:
        cfg["grad_format"] = cfg["format"]
    for key in ("format", "grad_format"):
        if cfg[key] not in FORMATS:
            raise ConfigProblem(key, f"must be one of {', '.join(FORMATS)}, got {json.dumps(cfg[key])}")
    if cfg["weight_grads"] not in ("format", "fp32"):
        raise ConfigProblem("weight_grads", f"must be \"format\" or \"fp32\", got {json.dumps(cfg['weight_grads'])}")
    if not isinstance(cfg["scaler"], (str, dict)):
        raise ConfigProblem("scaler", f"must be a policy name, \"static:S\" or an object, got {json.dumps(cfg['scaler'])}")
    cfg["optimizer"] = _named(cfg["optimizer"], "optimizer", ("sgd", "adam", "adamw"))
    cfg["schedule"] = _named(cfg["schedule"], "schedule", ("constant", "step", "cosine"))
    lr = cfg["lr"]
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr < 0:
        raise ConfigProblem("lr", f"must be a finite number >= 0, got {json.dumps(lr)}")
    for key, lo, hi in (("epochs", 1, 100000), ("batch", 1, 1 << 20), ("eval_batch", 1, 1 << 20),
                        ("max_steps", 0, 1 << 40), ("seed", 0, 1 << 62), ("threads", 0, 1024),
                        ("trace_every", 1, 1 << 40), ("eval_every", 0, 1 << 40), ("eval_examples", 0, 1 << 40)):
        _integer(cfg, key, lo, hi)
    for key in ("trace_hist", "shadow"):
        if not isinstance(cfg[key], bool):
            raise ConfigProblem(key, "must be true or false")
    ps = cfg["progress_seconds"]
    if isinstance(ps, bool) or not isinstance(ps, (int, float)) or not math.isfinite(ps) or ps < 0:
        raise ConfigProblem("progress_seconds", f"must be a finite number >= 0, got {json.dumps(ps)}")
    dev = cfg["device"]
    if not isinstance(dev, str) or not (dev in ("cpu", "cuda") or (dev.startswith("cuda:") and dev[5:].isdigit())):
        raise ConfigProblem("device", f"must be cpu, cuda or cuda:N, got {json.dumps(dev)}")
    if not isinstance(cfg["trace"], str):
        raise ConfigProblem("trace", "must be a path prefix (a string)")
    return cfg


def make_optimizer(cfg: dict, params) -> Any:
    import torch
    o = dict(cfg["optimizer"])
    name = o.pop("name")
    allowed = {"sgd": ("momentum", "nesterov", "weight_decay"),
               "adam": ("beta1", "beta2", "eps", "weight_decay"), "adamw": ("beta1", "beta2", "eps", "weight_decay")}[name]
    bad = [k for k in o if k not in allowed]
    if bad:
        raise ConfigProblem("optimizer", f"'{name}' has no parameter '{bad[0]}' (allowed: {', '.join(allowed)})")
    lr = float(cfg["lr"])
    try:
        if name == "sgd":
            return torch.optim.SGD(params, lr=lr, momentum=o.get("momentum", 0.0), nesterov=o.get("nesterov", False),
                                   weight_decay=o.get("weight_decay", 0.0))
        betas = (o.get("beta1", 0.9), o.get("beta2", 0.999))
        if name == "adam":
            return torch.optim.Adam(params, lr=lr, betas=betas, eps=o.get("eps", 1e-8),
                                    weight_decay=o.get("weight_decay", 0.0))
        return torch.optim.AdamW(params, lr=lr, betas=betas, eps=o.get("eps", 1e-8),
                                 weight_decay=o.get("weight_decay", 0.01))
    except ValueError as e:
        raise ConfigProblem("optimizer", str(e)) from e


def schedule_lr(cfg: dict, applied: int, total: int) -> float:
    """lib/optim/lr_schedule.cpp's rates, by applied steps (cosine's total_steps defaults to the run's)."""
    s = cfg["schedule"]
    lr = float(s.get("lr", cfg["lr"]))
    warm = int(s.get("warmup_steps", 0))
    if applied < warm:
        start = float(s.get("warmup_start_factor", 1 / 3))
        return lr * (start + (1 - start) * applied / warm)
    j = applied - warm
    if s["name"] == "step":
        return lr * float(s.get("gamma", 0.1)) ** (j // int(s["step_size"]))
    if s["name"] == "cosine":
        span = int(s.get("total_steps", total)) - warm
        lo = float(s.get("min_lr", 0.0))
        return lo if j >= span else lo + (lr - lo) * (1 + math.cos(math.pi * j / span)) / 2
    return lr


def check_schedule(cfg: dict, total: Optional[int] = None) -> None:
    """The optimizer and the lr schedule, checked by lib/optim as `gradscale train` checks them (every key's
    type and range: a momentum of "x" or NaN, a warm-up of -3 or 2.5, a gamma of 2). `total`: the run's steps,
    cosine's default total_steps (None before the data is loaded: any count the warm-up allows)."""
    from . import _core
    s = dict(cfg["schedule"])
    s.setdefault("lr", cfg["lr"])
    if s["name"] == "cosine" and "total_steps" not in s:
        warmup = s.get("warmup_steps", 0)
        s["total_steps"] = total if total is not None else (warmup + 1 if isinstance(warmup, int) else 1)
    for key, check, value in (("optimizer", _core.optimizer_config, cfg["optimizer"]),
                              ("schedule", _core.lr_schedule_config, s)):
        try:
            text = json.dumps(value, allow_nan=False)
        except ValueError as e:  # NaN or infinity, which Python's json reads in a config but JSON has not
            raise ConfigProblem(key, f"numbers must be finite, got {value!r}") from e
        try:
            check(text)
        except ValueError as e:  # the core's ConfigError, naming the key and its range
            raise ConfigProblem(key, one_line(e)) from e
