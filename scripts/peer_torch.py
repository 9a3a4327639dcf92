#!/usr/bin/python3
"""PyTorch peer for gradscale's built-in `mlp` and `cnn` on Fashion-MNIST.

Trains exactly the architectures of gradscale's built-in models, in plain fp32 PyTorch, on the same
data, normalisation and hyperparameters, and reports the wall-clock training time of every epoch and
the test accuracy. `scripts/compare_peer.sh` runs it side by side with `gradscale train`.

    /usr/bin/python3 scripts/peer_torch.py --model cnn --epochs 1 --lr 0.05 --optimizer sgd \
        --momentum 0.9 --threads 2 --json runs/compare/cnn-torch.json

Run it with /usr/bin/python3: Debian's python3-torch is installed for the system interpreter only
(`scripts/setup.sh --peer` installs python3-torch and libopenblas0-pthread).

What it does, mirroring gradscale's built-in models and `train` options:
  - models: mlp = Flatten, Linear 784->256, ReLU, Linear 256->256, ReLU, Linear 256->10;
            cnn = Conv 1->32 3x3 pad 1, ReLU, MaxPool 2, Conv 32->64 3x3 pad 1, ReLU, MaxPool 2,
                  Flatten, Linear 3136->128, ReLU, Linear 128->10;
  - init: Kaiming-normal weights (fan_in, ReLU gain sqrt(2)), zero biases, from --seed;
  - data: the IDX files read here with gzip + numpy (magic numbers, dimensions and sizes checked),
          pixels / 255 then (x - 0.2860) / 0.3530; mini-batches from a per-epoch permutation seeded by
          --seed; the last, smaller batch of an epoch is kept (469 steps per epoch at batch 128);
  - loss: softmax cross-entropy, mean over the batch; SGD (momentum, no weight decay) or Adam
          (PyTorch defaults: betas 0.9/0.999, eps 1e-8).
What differs by construction: the random streams (initial weights and batch order are drawn from
PyTorch's and NumPy's generators, not gradscale's), so runs agree in distribution, not bit for bit.

Threads. The peer should be PyTorch at its best on the machine, not a mis-tuned one. Debian's
PyTorch has two thread pools: OpenMP (torch.set_num_threads = --threads: PyTorch's own kernels and
the oneDNN convolutions) and OpenBLAS's separate pthread pool (OPENBLAS_NUM_THREADS = --blas-threads:
the Linear GEMMs). Idle OpenMP threads spin by default and then compete with OpenBLAS's threads for
the cores. So, by default:
  - mlp (its time is in the Linear GEMMs): OpenBLAS gets --threads threads and OMP_WAIT_POLICY is
    PASSIVE. On 2 cores this took an epoch from about 4 s (both pools left at their defaults) to
    about 1.1 s; single-threaded OpenBLAS gave about 1.3-1.9 s.
  - cnn (its time is in the oneDNN convolutions, on the OpenMP threads): OpenBLAS runs single-threaded
    in the calling thread and the OpenMP wait policy is left alone; about 23-30 s an epoch against
    about 36 s with a 2-thread OpenBLAS pool.
--blas-threads and --omp-wait-policy override this; the settings used are recorded in the JSON.

Epoch time is the wall clock of the training loop only (batching, forward, backward, optimizer step);
test evaluation after each epoch is not included. train_loss is the mean training loss over the last
epoch (weighted by batch size) and train_accuracy the fraction of its examples classified right as
they were trained on (as gradscale reports them); test_loss and test_accuracy are over the whole
test set. The JSON also has a `history` list in gradscale's per-epoch form, so scripts/plot_result.py
plots peer and gradscale runs together.
"""

import argparse
import gzip
import importlib
import json
import math
import os
import sys
import time

from atomic_file import atomic_open

DEFAULT_DATA_DIR = "/usr/share/datasets/fashion-mnist"
MEAN = 0.2860
STD = 0.3530
IMAGES_MAGIC = 2051  # 0x00000803: unsigned byte, 3 dimensions
LABELS_MAGIC = 2049  # 0x00000801: unsigned byte, 1 dimension
SPLITS = {"train": 60000, "test": 10000}
FILE_STEMS = {"train": "train", "test": "t10k"}
NUM_CLASSES = 10


class PeerError(Exception):
    """An error with a message for the user (no traceback)."""


def fail(message, code=1):
    print("peer_torch.py: error: " + message, file=sys.stderr)
    sys.exit(code)


# --------------------------------------------------------------------------------------------- data

def find_idx_file(data_dir, name):
    """Returns the path of `name` (plain) or `name.gz` in data_dir; gz preferred."""
    for candidate in (name + ".gz", name):
        path = os.path.join(data_dir, candidate)
        if os.path.isfile(path):
            return path
    raise PeerError(
        "missing data file %s (or %s) in %s; install the Debian package dataset-fashion-mnist, "
        "which puts the files under %s, or pass --data-dir DIR with the four Fashion-MNIST IDX "
        "files" % (name + ".gz", name, data_dir, DEFAULT_DATA_DIR))


def read_idx(path, expected_magic, expected_ndim):
    """Reads an unsigned-byte IDX file (gzip or plain) and returns a numpy uint8 array."""
    import numpy as np

    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                raw = f.read()
        else:
            with open(path, "rb") as f:
                raw = f.read()
    except (OSError, EOFError) as e:
        raise PeerError("%s: cannot read (%s)" % (path, e))
    if len(raw) < 4:
        raise PeerError("%s: file too short for an IDX header (%d bytes)" % (path, len(raw)))
    magic = int.from_bytes(raw[0:4], "big")
    if magic != expected_magic:
        raise PeerError("%s: bad magic number 0x%08x (expected 0x%08x: unsigned byte, %d dimension%s)"
                        % (path, magic, expected_magic, expected_ndim,
                           "" if expected_ndim == 1 else "s"))
    header = 4 + 4 * expected_ndim
    if len(raw) < header:
        raise PeerError("%s: truncated header (%d bytes, need %d)" % (path, len(raw), header))
    dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(expected_ndim)]
    if any(d == 0 for d in dims):
        raise PeerError("%s: zero dimension in header %s" % (path, dims))
    count = 1
    for d in dims:
        count *= d
    if len(raw) - header != count:
        raise PeerError("%s: %s (header says %s = %d bytes of data, file has %d)"
                        % (path, "truncated" if len(raw) - header < count else "trailing bytes",
                           "x".join(str(d) for d in dims), count, len(raw) - header))
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims)


def load_split(data_dir, split):
    """Returns (images float32 N x 1 x 28 x 28, normalised; labels int64 N) as numpy arrays."""
    import numpy as np

    stem = FILE_STEMS[split]
    images_path = find_idx_file(data_dir, stem + "-images-idx3-ubyte")
    labels_path = find_idx_file(data_dir, stem + "-labels-idx1-ubyte")
    images = read_idx(images_path, IMAGES_MAGIC, 3)
    labels = read_idx(labels_path, LABELS_MAGIC, 1)
    if images.shape[1:] != (28, 28):
        raise PeerError("%s: images are %dx%d, expected 28x28"
                        % (images_path, images.shape[1], images.shape[2]))
    if images.shape[0] != labels.shape[0]:
        raise PeerError("%s has %d images but %s has %d labels"
                        % (images_path, images.shape[0], labels_path, labels.shape[0]))
    if images.shape[0] != SPLITS[split]:
        print("peer_torch.py: warning: %s split has %d examples (Fashion-MNIST has %d)"
              % (split, images.shape[0], SPLITS[split]), file=sys.stderr)
    if labels.size and int(labels.max()) >= NUM_CLASSES:
        raise PeerError("%s: label %d out of range 0..%d"
                        % (labels_path, int(labels.max()), NUM_CLASSES - 1))
    x = images.astype(np.float32) / np.float32(255.0)
    x = (x - np.float32(MEAN)) / np.float32(STD)
    return x.reshape(-1, 1, 28, 28), labels.astype(np.int64)


# ------------------------------------------------------------------------------------------- models

def build_model(torch, name):
    nn = torch.nn
    if name == "mlp":
        model = nn.Sequential(
            nn.Flatten(),
            nn.Linear(784, 256), nn.ReLU(),
            nn.Linear(256, 256), nn.ReLU(),
            nn.Linear(256, 10))
    elif name == "cnn":
        model = nn.Sequential(
            nn.Conv2d(1, 32, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, kernel_size=3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(64 * 7 * 7, 128), nn.ReLU(),
            nn.Linear(128, 10))
    else:
        raise PeerError("unknown model %r (expected mlp or cnn)" % name)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return model


def count_parameters(model):
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------- training

def evaluate(torch, model, x, y, batch=1000):
    """Returns (mean cross-entropy, accuracy) over the whole set."""
    model.eval()
    total_loss = 0.0
    correct = 0
    with torch.no_grad():
        for start in range(0, x.shape[0], batch):
            xb = x[start:start + batch]
            yb = y[start:start + batch]
            logits = model(xb)
            total_loss += float(torch.nn.functional.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(dim=1) == yb).sum())
    model.train()
    n = x.shape[0]
    return total_loss / n, correct / n


def blas_library():
    """Best effort: the BLAS shared object mapped into this process (Linux), else None."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                base = os.path.basename(line.split()[-1]) if line.split() else ""
                if "blas" in base.lower() and ".so" in base:
                    return os.path.realpath(line.split()[-1])
    except OSError:
        pass
    return None


def finite_or_none(v):
    return v if (v is not None and math.isfinite(v)) else None


def write_json_atomic(path, doc):
    with atomic_open(path, "w") as f:
        json.dump(doc, f, indent=2, allow_nan=False)
        f.write("\n")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="peer_torch.py",
        description="Train gradscale's built-in mlp/cnn in PyTorch (fp32) on Fashion-MNIST and "
                    "report per-epoch training time and test accuracy.")
    p.add_argument("--model", choices=["mlp", "cnn"], required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    p.add_argument("--momentum", type=float, default=0.9, help="SGD momentum (ignored for adam)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=2,
                   help="torch.set_num_threads: OpenMP threads of PyTorch's own kernels and oneDNN "
                        "convolutions (default %(default)s)")
    p.add_argument("--blas-threads", type=int, default=None, metavar="N",
                   help="OpenBLAS threads for the Linear GEMMs (default: --threads for mlp, 1 for "
                        "cnn; see the module documentation)")
    p.add_argument("--omp-wait-policy", choices=["auto", "passive", "active", "inherit"],
                   default="auto",
                   help="OMP_WAIT_POLICY of PyTorch's OpenMP threads; auto (the default): passive "
                        "when OpenBLAS has threads of its own, else the environment's; inherit: "
                        "leave the environment alone")
    p.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                   help="directory with the Fashion-MNIST IDX files, .gz or plain "
                        "(default %(default)s)")
    p.add_argument("--json", metavar="OUT.json", help="write the result document here (atomically)")
    p.add_argument("--progress", type=float, default=5.0, metavar="SECONDS",
                   help="print a progress line every SECONDS during an epoch (0: never)")
    a = p.parse_args(argv)
    if a.epochs < 1:
        p.error("--epochs must be >= 1 (got %d)" % a.epochs)
    if a.batch < 1:
        p.error("--batch must be >= 1 (got %d)" % a.batch)
    if not (a.lr > 0 and math.isfinite(a.lr)):
        p.error("--lr must be a positive finite number (got %r)" % a.lr)
    if not (0.0 <= a.momentum < 1.0):
        p.error("--momentum must be in [0, 1) (got %r)" % a.momentum)
    if a.threads < 1:
        p.error("--threads must be >= 1 (got %d)" % a.threads)
    if a.blas_threads is None:
        a.blas_threads = a.threads if a.model == "mlp" else 1
    if a.blas_threads < 1:
        p.error("--blas-threads must be >= 1 (got %d)" % a.blas_threads)
    if a.seed < 0:
        p.error("--seed must be >= 0 (got %d)" % a.seed)
    if a.progress < 0:
        p.error("--progress must be >= 0 (got %r)" % a.progress)
    return a


def import_torch(threads, blas_threads, omp_wait_policy):
    # OpenBLAS and OpenMP read these when the libraries load, so they must be set before the import;
    # torch.set_num_threads alone does not reach OpenBLAS's own (pthread) thread pool.
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["MKL_NUM_THREADS"] = str(threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(blas_threads)
    if omp_wait_policy == "auto":
        omp_wait_policy = "passive" if blas_threads > 1 else "inherit"
    if omp_wait_policy != "inherit":
        os.environ["OMP_WAIT_POLICY"] = omp_wait_policy.upper()
    try:
        import torch
    except ImportError as e:
        raise PeerError("PyTorch is not importable with %s (%s). Install Debian's python3-torch and "
                        "libopenblas0-pthread with `scripts/setup.sh --peer` and run this script with "
                        "/usr/bin/python3 (a pyenv or virtualenv python3 does not see the Debian "
                        "package)" % (sys.executable, e))
    try:
        importlib.import_module("numpy")
    except ImportError as e:
        raise PeerError("numpy is not importable with %s (%s); run this script with /usr/bin/python3 "
                        "after scripts/setup.sh --peer" % (sys.executable, e))
    torch.set_num_threads(threads)
    return torch


def main(argv):
    args = parse_args(argv)
    torch = import_torch(args.threads, args.blas_threads, args.omp_wait_policy)
    import numpy as np

    x_train, y_train = load_split(args.data_dir, "train")
    x_test, y_test = load_split(args.data_dir, "test")
    x_train = torch.from_numpy(np.ascontiguousarray(x_train))
    y_train = torch.from_numpy(y_train)
    x_test = torch.from_numpy(np.ascontiguousarray(x_test))
    y_test = torch.from_numpy(y_test)

    torch.manual_seed(args.seed)
    model = build_model(torch, args.model)
    if args.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = torch.nn.CrossEntropyLoss()
    rng = np.random.default_rng(args.seed)

    n = x_train.shape[0]
    steps_per_epoch = (n + args.batch - 1) // args.batch
    opt_desc = ("sgd lr %g momentum %g" % (args.lr, args.momentum) if args.optimizer == "sgd"
                else "adam lr %g" % args.lr)
    print("peer_torch: torch %s, %d thread%s (BLAS %d, OMP_WAIT_POLICY %s), model %s "
          "(%d parameters), %s, batch %d, seed %d, %d train / %d test examples from %s"
          % (torch.__version__, torch.get_num_threads(), "" if args.threads == 1 else "s",
             args.blas_threads, os.environ.get("OMP_WAIT_POLICY", "unset"), args.model,
             count_parameters(model), opt_desc, args.batch, args.seed, n, x_test.shape[0],
             args.data_dir), flush=True)

    epoch_seconds = []
    history = []
    steps = 0
    train_loss = train_acc = test_loss = test_acc = None
    model.train()
    for epoch in range(1, args.epochs + 1):
        order = torch.from_numpy(rng.permutation(n))
        loss_sum = 0.0
        correct = 0
        t0 = time.perf_counter()
        next_report = t0 + args.progress if args.progress > 0 else math.inf
        for step in range(steps_per_epoch):
            idx = order[step * args.batch:(step + 1) * args.batch]
            xb = x_train.index_select(0, idx)
            yb = y_train.index_select(0, idx)
            opt.zero_grad(set_to_none=True)
            logits = model(xb)
            loss = loss_fn(logits, yb)
            loss.backward()
            opt.step()
            correct += int((logits.detach().argmax(dim=1) == yb).sum())
            lv = float(loss)
            if not math.isfinite(lv):
                raise PeerError("training diverged: loss %r at epoch %d step %d; try a lower --lr "
                                "(now %g)" % (lv, epoch, step + 1, args.lr))
            loss_sum += lv * idx.shape[0]
            steps += 1
            if args.progress > 0:
                now = time.perf_counter()
                if now >= next_report:
                    rate = (step + 1) / (now - t0)
                    print("  epoch %d step %d/%d loss %.4f  %.1f steps/s  ETA %.0f s"
                          % (epoch, step + 1, steps_per_epoch, lv, rate,
                             (steps_per_epoch - step - 1) / rate), flush=True)
                    next_report = now + args.progress
        seconds = time.perf_counter() - t0
        train_loss = loss_sum / n
        train_acc = correct / n
        test_loss, test_acc = evaluate(torch, model, x_test, y_test)
        epoch_seconds.append(seconds)
        history.append({"epoch": epoch, "train_loss": finite_or_none(train_loss),
                        "train_accuracy": train_acc, "test_loss": finite_or_none(test_loss),
                        "test_accuracy": test_acc, "seconds": seconds, "steps": steps,
                        "skipped_steps": 0, "scale": 1.0})
        print("epoch %d/%d  time %.2f s  train_loss %.4f  test_loss %.4f  test_accuracy %.4f"
              % (epoch, args.epochs, seconds, train_loss, test_loss, test_acc), flush=True)

    mean_s = sum(epoch_seconds) / len(epoch_seconds)
    print("peer_torch: %s mean epoch %.2f s over %d epoch%s, final test_accuracy %.4f"
          % (args.model, mean_s, len(epoch_seconds), "" if len(epoch_seconds) == 1 else "s",
             test_acc), flush=True)

    if args.json:
        doc = {
            "model": args.model,
            "epoch_seconds": epoch_seconds,
            "test_accuracy": test_acc,
            "test_loss": finite_or_none(test_loss),
            "train_loss": finite_or_none(train_loss),
            "train_accuracy": train_acc,
            "torch_version": torch.__version__,
            "threads": torch.get_num_threads(),
            "steps": steps,
            "skipped_steps": 0,
            "history": history,
            "config": {
                "peer": "pytorch",
                "model": args.model, "epochs": args.epochs, "batch": args.batch, "lr": args.lr,
                "optimizer": args.optimizer,
                "momentum": args.momentum if args.optimizer == "sgd" else None,
                "seed": args.seed, "threads": args.threads, "blas_threads": args.blas_threads,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "data_dir": args.data_dir,
                "normalisation": {"mean": MEAN, "std": STD},
                "parameters": count_parameters(model),
                "blas": blas_library(),
            },
        }
        write_json_atomic(args.json, doc)
        print("peer_torch: wrote %s" % args.json, flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except PeerError as e:
        fail(str(e))
    except KeyboardInterrupt:
        fail("interrupted", 130)
