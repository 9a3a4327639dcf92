"""Loading a user's factory for `python -m gradscale.run` ("path/file.py:function"), and the error every
bad input becomes: `ConfigProblem(key, message)`, printed by run.py as one line naming the run and the
key (exit 2)."""
from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from typing import Any, Callable, Dict, Tuple


class ConfigProblem(Exception):
    """Bad input for a run: `key` is the config key at fault ("model", "data", "optimizer", ...)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


def one_line(text: str, limit: int = 600) -> str:
    """A message on one line: PyTorch's and the user's errors may span several (a list of overloads)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 3] + "..."


def load_function(ref: str, key: str) -> Tuple[Callable, str]:
    """The function `ref` ("path/to/file.py:name", a path relative to the working directory) names."""
    path, sep, name = ref.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise ConfigProblem(key, f"\"python\": '{ref}' must be \"path/to/file.py:function\"")
    where = f"{path}:{name}"
    if not os.path.isfile(path):
        raise ConfigProblem(key, f"\"python\": '{path}' is not a file")
    module_name = "gradscale_user_" + "".join(c if c.isalnum() else "_" for c in os.path.abspath(path))
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigProblem(key, f"\"python\": '{path}' cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses and pickling look their module up
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # the user's file: any error (sys.exit too) is reported, on one line
        raise ConfigProblem(key, f"importing '{path}' raised {type(e).__name__}: {one_line(e)}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ConfigProblem(key, f"'{path}' has no function '{name}'")
    return fn, where


def fill_from_data(fn: Callable, args: Dict[str, Any], offered: Dict[str, Any]) -> Dict[str, Any]:
    """`args` plus each of `offered` (e.g. num_classes, vocab, context from the data) that `fn` takes by
    name and `args` does not set."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return dict(args)
    out = dict(args)
    for name, value in offered.items():
        if name in params and name not in out and value is not None:
            out[name] = value
    return out


def call_factory(fn: Callable, args: Dict[str, Any], key: str, where: str) -> Any:
    try:
        return fn(**args)
    except (Exception, SystemExit) as e:  # the user's factory: any error (sys.exit too: a run that trained
        shown = ", ".join(f"{k}={v!r}" for k, v in args.items())  # nothing must not exit 0) on one line
        raise ConfigProblem(key, f"{where}({shown}) raised {type(e).__name__}: {one_line(e)}") from e
