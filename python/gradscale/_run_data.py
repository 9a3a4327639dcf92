"""The data of `python -m gradscale.run` (gradscale/run.py): the C++ runner's data specs re-read in PyTorch,
plus character-level text and a user's Dataset factory. Each spec gives a train and a test `Split` whose
`batch(indices)` returns (inputs, targets) tensors; the run owns the order (run.py seeds it).

    "fashion-mnist"                Debian's dataset-fashion-mnist (or $GRADSCALE_FASHION_MNIST_DIR), 1x28x28,
                                   normalised as lib/data does ((x/255 - 0.2860) / 0.3530); ":3x32x32" pads
                                   to 32x32 and replicates the channel (torchvision models get it by default)
    "mnist:DIR"                    MNIST-format IDX files in DIR (plain or .gz), normalised as MNIST
    "synthetic" / "synthetic:N"    N (default 1024) class-dependent random images, N/4 test images
    "text:PATH" / "text:PATH:ctx=N" characters of a text file: next-character prediction over windows of
                                   N (default 64), the last 10% of the text held out
    {"python": "file.py:make_data", ...}  make_data(**args) -> (train, test) torch Datasets of (x, y)
"""
from __future__ import annotations

import gzip
import os
import re
import struct
from typing import Any, Optional, Tuple

import torch

from ._run_load import ConfigProblem, call_factory, load_function, one_line

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_ENV = "GRADSCALE_FASHION_MNIST_DIR"  # as lib/data's kFashionMnistDirEnv
FASHION_NORM = (0.2860, 0.3530)  # lib/data/dataset.h kFashionMnistNormalization
MNIST_NORM = (0.1307, 0.3081)
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte")
DEFAULT_CONTEXT = 64
SPEC_FORMS = ("fashion-mnist[:3x32x32], mnist:DIR[:3x32x32], synthetic[:N], text:PATH[:ctx=N], "
              "or {\"python\": \"file.py:function\", ...arguments}")


class Split:
    """Examples addressed by index: tensors (fast batches), or a torch Dataset (collated per batch)."""

    def __init__(self, inputs: Optional[torch.Tensor] = None, targets: Optional[torch.Tensor] = None,
                 dataset: Any = None, windows: int = 0, where: str = "", part: str = ""):
        self.inputs, self.targets, self.dataset, self.windows = inputs, targets, dataset, windows
        self.where, self.part = where, part  # a user's Dataset: its factory and "train" / "test", for messages

    def __len__(self) -> int:
        if self.windows:
            return self.windows
        if self.dataset is not None:
            return len(self.dataset)
        return 0 if self.targets is None else int(self.targets.shape[0])

    def batch(self, index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        if self.dataset is not None:
            return self._dataset_batch(index)
        return self.inputs[index], self.targets[index]

    def _dataset_batch(self, index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """A user's Dataset collated: (x, y) tensors with class labels y >= 0, else ConfigProblem("data")
        naming the examples (a raising __getitem__, items of unequal shapes, float or negative labels)."""
        from torch.utils.data import default_collate
        first = int(index[0]) if len(index) else 0
        what = f"{self.where}: examples {first}.. of its {self.part} set"
        try:
            items = [self.dataset[int(i)] for i in index]
            if not all(isinstance(it, (tuple, list)) and len(it) >= 2 for it in items):
                bad = next(it for it in items if not (isinstance(it, (tuple, list)) and len(it) >= 2))
                raise ConfigProblem("data", f"{what}: an example must be (input, label), got {type(bad).__name__}")
            x, y = default_collate([tuple(it)[:2] for it in items])
        except ConfigProblem:
            raise
        except (Exception, SystemExit) as e:  # the user's Dataset: any error is reported, on one line
            raise ConfigProblem("data", f"{what} raised {type(e).__name__}: {one_line(e)}") from e
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise ConfigProblem("data", f"{what}: inputs and labels must collate to tensors, got "
                                f"{type(x).__name__} and {type(y).__name__}")
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise ConfigProblem("data", f"{what}: labels must be integer class indices, got {y.dtype}")
        if y.numel() and int(y.min()) < 0:
            raise ConfigProblem("data", f"{what}: labels must be class indices >= 0, got {int(y.min())}")
        return x, y.long()


class PaddedSplit(Split):
    """1x28x28 images given as CxHxW per batch: padded with the background's value, the channel
    replicated (kept small in memory: 60000 images of 3x32x32 would take 740 MB per run)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, shape: tuple, background: float):
        super().__init__(inputs, targets)
        self.shape, self.background = shape, background

    def batch(self, index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        x, y = self.inputs[index], self.targets[index]
        if tuple(x.shape[1:]) != self.shape:
            h, w = self.shape[1], self.shape[2]
            top, left = (h - x.shape[2]) // 2, (w - x.shape[3]) // 2
            pad = (left, w - x.shape[3] - left, top, h - x.shape[2] - top)
            x = torch.nn.functional.pad(x, pad, value=self.background).expand(-1, self.shape[0], -1, -1).contiguous()
        return x, y


class TextSplit(Split):
    """Windows of a character sequence: example i is text[i*stride : i*stride + ctx + 1]."""

    def __init__(self, codes: torch.Tensor, ctx: int, stride: int):
        n = (len(codes) - ctx - 1) // stride + 1
        super().__init__(windows=max(0, n))
        self.codes, self.ctx, self.stride = codes, ctx, stride

    def batch(self, index: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        starts = index.long() * self.stride
        seq = self.codes[starts.unsqueeze(1) + torch.arange(self.ctx + 1)]
        return seq[:, :-1], seq[:, 1:]


class Data:
    """A resolved data spec: the splits and what a model needs to fit them."""

    def __init__(self, train: Split, test: Split, kind: str, classes: Optional[int], shape: Optional[tuple],
                 source: str):
        self.train, self.test = train, test
        self.kind = kind  # "images", "text" (next-token: targets shaped as inputs), "dataset"
        self.classes = classes  # output classes (vocabulary for text); None: unknown (a user's Dataset)
        self.shape = shape  # one input's shape (images), or None
        self.source = source  # one line, as lib/data's: what was loaded from where


def _read_idx(path: str) -> torch.Tensor:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 8:
        raise ConfigProblem("data", f"{path} is not an IDX file of unsigned bytes")
    dims = data[3]
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    body = data[4 + 4 * dims:]
    count = 1
    for s in shape:
        count *= s
    if len(body) != count:
        raise ConfigProblem("data", f"{path}: {len(body)} bytes of data, its header says {count}")
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(shape)


def _idx_file(directory: str, base: str) -> str:
    for name in (base, base + ".gz"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            return path
    return ""


def _idx_dir(directory: str, norm: Tuple[float, float], name: str, shape: tuple, check_only: bool) -> Data:
    paths = [_idx_file(directory, b) for b in IDX_FILES]
    missing = [b for b, p in zip(IDX_FILES, paths) if not p]
    if missing:
        raise ConfigProblem("data", f"'{name}': {directory} lacks {', '.join(missing)} (plain or .gz)"
                            + (" (Debian: apt install dataset-fashion-mnist, or set $" + FASHION_ENV + ")"
                               if name == "fashion-mnist" else ""))
    if check_only:
        return Data(Split(), Split(), "images", 10, shape, f"{name} from {directory}")

    def images(path):
        return ((_read_idx(path).float() / 255 - norm[0]) / norm[1]).unsqueeze(1)

    train = PaddedSplit(images(paths[0]), _read_idx(paths[1]).long(), shape, -norm[0] / norm[1])
    test = PaddedSplit(images(paths[2]), _read_idx(paths[3]).long(), shape, -norm[0] / norm[1])
    source = (f"{name} from {directory}: {len(train)} train / {len(test)} test images of "
              f"{'x'.join(map(str, shape))}, 10 classes, normalised (x/255 - {norm[0]:.4f}) / {norm[1]:.4f}")
    return Data(train, test, "images", 10, shape, source)


def _image_shape(text: str, spec: str, default: tuple) -> tuple:
    if not text:
        return default
    m = re.fullmatch(r"([13])x(\d+)x(\d+)", text)
    if not m or int(m.group(2)) < 28 or int(m.group(3)) < 28 or int(m.group(2)) > 1024 or int(m.group(3)) > 1024:
        raise ConfigProblem("data", f"'{spec}': the image shape must be CxHxW with C 1 or 3 and H, W in "
                            f"[28, 1024], got '{text}'")
    return tuple(int(g) for g in m.groups())


# The largest synthetic set, in numbers: lib/data's (10,000,000 + 2,500,000 test images of 1x28x28).
MAX_SYNTHETIC_NUMBERS = 12_500_000 * 28 * 28


def _check_synthetic_size(n: int, shape: tuple, spec: str) -> None:
    total = n + max(1, n // 4)
    numbers = total * shape[0] * shape[1] * shape[2]
    if numbers > MAX_SYNTHETIC_NUMBERS:
        raise ConfigProblem("data", f"'{spec}': {total} images of {'x'.join(map(str, shape))} are {numbers} "
                            f"numbers ({numbers * 4 / 2**30:.1f} GiB), more than the largest synthetic set "
                            f"({MAX_SYNTHETIC_NUMBERS}: 12500000 images of 1x28x28); choose a smaller N")


def _synthetic(n: int, shape: tuple) -> Data:
    g = torch.Generator().manual_seed(0)  # the data is fixed by its spec, as lib/data's synthetic set
    total = n + max(1, n // 4)
    y = torch.randint(0, 10, (total,), generator=g)
    protos = torch.randn(10, *shape, generator=g)
    x = protos[y] * 0.5 + torch.randn(total, *shape, generator=g)
    return Data(Split(x[:n], y[:n]), Split(x[n:], y[n:]), "images", 10, shape,
                f"synthetic (PyTorch's generator, seed 0): {n} train / {total - n} test images of "
                f"{'x'.join(map(str, shape))}, 10 classes")


def _text(spec: str, rest: str, check_only: bool) -> Data:
    ctx = DEFAULT_CONTEXT
    m = re.fullmatch(r"(.*):ctx=(\d+)", rest)
    if m:
        rest, ctx = m.group(1), int(m.group(2))
        if not 1 <= ctx <= 4096:
            raise ConfigProblem("data", f"'{spec}': ctx must be in [1, 4096], got {ctx}")
    if not rest or not os.path.isfile(rest):
        raise ConfigProblem("data", f"'{spec}': '{rest}' is not a file")
    with open(rest, "rb") as f:
        raw = f.read()
    text = raw.decode("utf-8", errors="replace")
    chars = sorted(set(text))
    split = int(len(text) * 0.9)
    if split - ctx - 1 < 1 or len(text) - split - ctx - 1 < 0:
        raise ConfigProblem("data", f"'{spec}': {len(text)} characters are too few for windows of {ctx} "
                            "(10% are held out for the test)")
    lookup = {c: i for i, c in enumerate(chars)}
    codes = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    source = (f"text from {rest}: {len(text)} characters, vocabulary {len(chars)}, windows of {ctx}; "
              f"train {split} characters (every window), test {len(text) - split} (disjoint windows)")
    if check_only:
        train, test = Split(), Split()
    else:
        train, test = TextSplit(codes[:split], ctx, 1), TextSplit(codes[split:], ctx, ctx)
    data = Data(train, test, "text", len(chars), None, source)
    data.context = ctx
    return data


def _user(spec: dict, check_only: bool) -> Data:
    fn, where = load_function(spec["python"], "data")
    args = {k: v for k, v in spec.items() if k != "python"}
    out = call_factory(fn, args, "data", where)
    if isinstance(out, dict) and "train" in out and "test" in out:
        out = (out["train"], out["test"])
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise ConfigProblem("data", f"{where} must return (train, test) Datasets, got {type(out).__name__}")
    for part, ds in zip(("train", "test"), out):
        try:
            size = len(ds) if hasattr(ds, "__getitem__") and hasattr(ds, "__len__") else 0
        except (Exception, SystemExit) as e:  # a __len__ that raises or is negative
            raise ConfigProblem("data", f"{where}: len() of its {part} set raised {type(e).__name__}: "
                                f"{one_line(e)}") from e
        if size == 0:
            raise ConfigProblem("data", f"{where}: its {part} set is not a non-empty Dataset "
                                f"(__len__ and __getitem__), got {type(ds).__name__}")
    classes = getattr(out[0], "classes", None)
    classes = len(classes) if isinstance(classes, (list, tuple)) else classes if isinstance(classes, int) else None
    if classes is not None and (isinstance(classes, bool) or classes < 1):
        raise ConfigProblem("data", f"{where}: its train set's 'classes' must be a count >= 1 or a list of "
                            f"names, got {getattr(out[0], 'classes', None)!r}")
    return Data(Split(dataset=out[0], where=where, part="train"), Split(dataset=out[1], where=where, part="test"),
                "dataset", classes, None, f"{where}: {len(out[0])} train / {len(out[1])} test examples")


def load_data(spec: Any, default_shape: tuple, check_only: bool = False) -> Data:
    """The data a spec names (module docstring). `default_shape`: the images' shape when the spec gives
    none (3x32x32 for torchvision models). `check_only`: check that the files are there, load nothing
    large (text is read: its vocabulary sizes the model)."""
    if isinstance(spec, dict):
        if "python" not in spec or not isinstance(spec["python"], str):
            raise ConfigProblem("data", f"an object must have \"python\": \"file.py:function\"; allowed: {SPEC_FORMS}")
        return _user(spec, check_only)
    if not isinstance(spec, str):
        raise ConfigProblem("data", f"must be a string or an object, got {spec!r}; allowed: {SPEC_FORMS}")
    head, _, rest = spec.partition(":")
    if head == "fashion-mnist":
        directory = os.environ.get(FASHION_ENV) or FASHION_DIR
        return _idx_dir(directory, FASHION_NORM, "fashion-mnist", _image_shape(rest, spec, default_shape), check_only)
    if head == "mnist":
        directory, _, shape = rest.partition(":") if re.search(r":[13]x\d+x\d+$", rest) else (rest, "", "")
        if not directory or not os.path.isdir(directory):
            raise ConfigProblem("data", f"'{spec}' names no directory")
        return _idx_dir(directory, MNIST_NORM, "mnist", _image_shape(shape, spec, default_shape), check_only)
    if head == "synthetic":
        n, _, shape = rest.partition(":")
        if n and not (n.isdigit() and 1 <= int(n) <= 10_000_000):
            raise ConfigProblem("data", f"'{spec}': N must be an integer in [1, 10000000]")
        shape = _image_shape(shape, spec, default_shape)
        _check_synthetic_size(int(n or 1024), shape, spec)
        if check_only:
            return Data(Split(), Split(), "images", 10, shape, "synthetic")
        return _synthetic(int(n or 1024), shape)
    if head == "text":
        return _text(spec, rest, check_only)
    raise ConfigProblem("data", f"unknown data spec '{spec}' (allowed: {SPEC_FORMS})")
