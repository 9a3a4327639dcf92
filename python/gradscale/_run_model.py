"""The model of `python -m gradscale.run` (gradscale/run.py): a torchvision architecture or a user's factory,
built from the config's "model" object, and checked against the data before training.

    {"torchvision": "resnet18", ...keyword arguments}   torchvision.models.<name>(**kwargs); num_classes
                                                        defaults to the data's classes; no weights
    {"python": "path/file.py:make_model", ...arguments} make_model(**arguments) -> nn.Module; arguments it
                                                        takes by name among num_classes, vocab, context,
                                                        in_channels are filled from the data when not set
"""
from __future__ import annotations

from typing import Any, Tuple

import torch
from torch import nn

from ._run_data import Data
from ._run_load import ConfigProblem, call_factory, fill_from_data, load_function, one_line

MODEL_FORMS = '{"torchvision": "NAME", ...kwargs} or {"python": "path/file.py:function", ...arguments}'


def is_torch_model(model: Any) -> bool:
    """Whether a config's "model" is a PyTorch model (an object), not one of the C++ engine's names."""
    return isinstance(model, dict) and ("torchvision" in model or "python" in model)


def _torchvision(spec: dict, data: Data) -> Tuple[nn.Module, str]:
    name = spec["torchvision"]
    try:
        import torchvision
    except ImportError as e:
        raise ConfigProblem("model", f"torchvision is not installed ({e}); install it (Debian: python3-torchvision) "
                            "or use {\"python\": \"file.py:function\"}") from e
    models = torchvision.models
    known = sorted(n for n in dir(models) if n[0].islower() and callable(getattr(models, n))
                   and not n.startswith("get_") and n not in ("list_models", "load_state_dict_from_url"))
    fn = getattr(models, name, None) if isinstance(name, str) and name[:1].islower() else None
    if fn is None or not callable(fn) or name not in known:
        shown = ", ".join(n for n in known if n.startswith(("resnet", "vgg", "mobilenet", "efficientnet", "vit")))
        raise ConfigProblem("model", f"torchvision {torchvision.__version__} has no model '{name}' "
                            f"(some it has: {shown}; see torchvision.models)")
    kwargs = {k: v for k, v in spec.items() if k != "torchvision"}
    fetched = [k for k in ("weights", "pretrained", "weights_backbone", "pretrained_backbone") if k in kwargs]
    if fetched:  # torchvision would download them: the run is then no longer defined by its config alone
        raise ConfigProblem("model", f"torchvision models are built without weights (the seed draws the "
                            f"initialisation); remove '{fetched[0]}'")
    if "num_classes" not in kwargs and data.classes is not None:
        kwargs["num_classes"] = data.classes
    where = f"torchvision.models.{name}"
    return call_factory(fn, kwargs, "model", where), where


def _python(spec: dict, data: Data) -> Tuple[nn.Module, str]:
    ref = spec["python"]
    if not isinstance(ref, str):
        raise ConfigProblem("model", f"\"python\" must be \"path/file.py:function\", got {ref!r}")
    fn, where = load_function(ref, "model")
    args = {k: v for k, v in spec.items() if k != "python"}
    offered = {"num_classes": data.classes, "vocab": data.classes, "context": getattr(data, "context", None),
               "in_channels": data.shape[0] if data.shape else None}
    return call_factory(fn, fill_from_data(fn, args, offered), "model", where), where


def build_model(spec: Any, data: Data) -> Tuple[nn.Module, str]:
    """(the model, what built it). The global RNG must be seeded first: the initialisation is its draw."""
    if not is_torch_model(spec):
        raise ConfigProblem("model", f"must be {MODEL_FORMS}, got {spec!r} (the C++ engine's models run "
                            "with gradscale train)")
    if "torchvision" in spec and "python" in spec:
        raise ConfigProblem("model", "give \"torchvision\" or \"python\", not both")
    model, where = _torchvision(spec, data) if "torchvision" in spec else _python(spec, data)
    if not isinstance(model, nn.Module):
        raise ConfigProblem("model", f"{where} returned {type(model).__name__}, not an nn.Module")
    bad = [n for n, p in model.named_parameters() if p.dtype != torch.float32]
    if bad:
        raise ConfigProblem("model", f"{where}: parameters must be float32 (the fp32 masters), "
                            f"'{bad[0]}' is {model.get_parameter(bad[0]).dtype}")
    if not any(True for _ in model.parameters()):
        raise ConfigProblem("model", f"{where} returned a model without parameters")
    return model, where


def expected_output(data: Data, x: torch.Tensor, y: torch.Tensor) -> str:
    return ("(batch, context, vocabulary)" if y.dim() == 2 else "(batch, classes)")


def check_output(model: nn.Module, where: str, data: Data, x: torch.Tensor, y: torch.Tensor) -> None:
    """The model's output on a batch must fit the targets: (B, C) logits for (B,) labels, (B, T, C) for
    (B, T) tokens, C the data's classes (vocabulary) where known, or more than the largest label.
    Evaluated in eval mode, under no_grad, before the Scaler is attached (no state changes)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    except (Exception, SystemExit) as e:  # the user's model: any error on the data's inputs is a misfit
        raise ConfigProblem("model", f"{where} raised {type(e).__name__} on the data's inputs of shape "
                            f"{tuple(x.shape)}: {one_line(e)}") from e
    finally:
        model.train(was_training)
    if not isinstance(out, torch.Tensor):
        raise ConfigProblem("model", f"{where} returned {type(out).__name__}, not a tensor of logits")
    want_dims = y.dim() + 1
    classes = data.classes if data.classes is not None else int(y.max()) + 1
    fits = (out.dim() == want_dims and tuple(out.shape[:-1]) == tuple(y.shape)
            and (out.shape[-1] == classes if data.classes is not None else out.shape[-1] >= classes))
    if not fits:
        raise ConfigProblem("model", f"{where}'s output has shape {tuple(out.shape)} for inputs of shape "
                            f"{tuple(x.shape)}; the data's targets need {expected_output(data, x, y)} = "
                            f"{tuple(y.shape) + (classes,)}")
    if out.dtype != torch.float32:
        raise ConfigProblem("model", f"{where}'s output is {out.dtype}, expected float32 logits")
