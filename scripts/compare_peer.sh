#!/usr/bin/env bash
# Side-by-side comparison of gradscale with PyTorch on Fashion-MNIST.
#
# For each model in MODELS (mlp, cnn) it runs, one after the other in this one invocation:
#   1. build/gradscale train --format fp32                       (the accuracy and speed reference)
#   2. build/gradscale train --format fp16 --scaler static:1024  (emulated fp16, static loss scale)
#   3. scripts/peer_torch.py                                     (the same model in PyTorch, fp32)
# with the same epochs, batch, optimizer, learning rate, seed and thread count, then prints a table
# per model: mean epoch seconds of the three runs, the ratios gradscale-fp32/PyTorch and fp16/fp32,
# and the test accuracies with their differences in percentage points. The table is also written to
# OUT/compare.md; every run leaves OUT/<model>-<run>.json and .log.
#
# Usage: scripts/compare_peer.sh [options]   (every option also has an environment variable)
#   option                env          meaning                                    default
#   --models "mlp cnn"    MODELS       models to compare (mlp and/or cnn)         mlp cnn
#   --epochs N            EPOCHS       epochs per run                             1
#   --threads N           THREADS      threads for gradscale and PyTorch          2
#   --build DIR           BUILD        build directory with the gradscale binary  build
#   --out DIR             OUT          where results, logs and the table go       runs/compare
#   --batch N             BATCH        mini-batch size                            128
#   --lr X                LR           learning rate                              0.05
#   --optimizer sgd|adam  OPTIMIZER    optimizer                                  sgd
#   --momentum X          MOMENTUM     SGD momentum (both sides)                  0.9
#   --seed N              SEED         seed                                       1
#   --fp16-scaler S       FP16_SCALER  loss scaler of the fp16 run                static:1024
#   --data-dir DIR        DATA_DIR     Fashion-MNIST IDX files (.gz or plain)     /usr/share/datasets/fashion-mnist
#   --python PATH         PYTHON       interpreter with torch and numpy           /usr/bin/python3
#   --gs-args "ARGS"      GS_ARGS      extra options for both gradscale runs      none
#   --peer-args "ARGS"    PEER_ARGS    extra options for scripts/peer_torch.py    none
#   --table-only                       do not train; print the table from the JSON files in OUT
#   -h, --help
# Relative paths are taken from the repository root. gradscale gets `--data fashion-mnist` with
# GRADSCALE_FASHION_MNIST_DIR=DATA_DIR (so both sides read the same files with Fashion-MNIST's
# normalisation), and for SGD `--optimizer '{"name":"sgd","momentum":MOMENTUM}'` (gradscale's own SGD
# default is momentum 0). The table reports a problem when a gradscale result says it fell back to
# synthetic data or used another momentum. The PyTorch peer sizes its two thread
# pools (OpenMP, OpenBLAS) per model for its best speed on this machine (see scripts/peer_torch.py);
# PEER_ARGS="--blas-threads 2 --omp-wait-policy inherit" leaves both pools at --threads, untuned.
#
# Timings are wall clock on a shared machine: the script warns when the load average is already high
# before it starts, because anything else running on the cores distorts the ratios. docs/results.md quotes
# a 10-epoch run: EPOCHS=10 scripts/compare_peer.sh
set -euo pipefail

die() {
  echo "compare_peer.sh: error: $*" >&2
  exit 1
}
note() { echo "compare_peer.sh: $*"; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

MODELS="${MODELS:-mlp cnn}"
EPOCHS="${EPOCHS:-1}"
THREADS="${THREADS:-2}"
BUILD="${BUILD:-build}"
OUT="${OUT:-runs/compare}"
BATCH="${BATCH:-128}"
LR="${LR:-0.05}"
OPTIMIZER="${OPTIMIZER:-sgd}"
MOMENTUM="${MOMENTUM:-0.9}"
SEED="${SEED:-1}"
FP16_SCALER="${FP16_SCALER:-static:1024}"
DEFAULT_DATA_DIR=/usr/share/datasets/fashion-mnist
DATA_DIR="${DATA_DIR:-$DEFAULT_DATA_DIR}"
PYTHON="${PYTHON:-/usr/bin/python3}"
GS_ARGS="${GS_ARGS:-}"
PEER_ARGS="${PEER_ARGS:-}"
TABLE_ONLY=0

need_value() { [[ $# -ge 2 && -n "$2" ]] || die "option $1 needs a value (see --help)"; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --models) need_value "$@"; MODELS="$2"; shift 2 ;;
    --epochs) need_value "$@"; EPOCHS="$2"; shift 2 ;;
    --threads) need_value "$@"; THREADS="$2"; shift 2 ;;
    --build) need_value "$@"; BUILD="$2"; shift 2 ;;
    --out) need_value "$@"; OUT="$2"; shift 2 ;;
    --batch) need_value "$@"; BATCH="$2"; shift 2 ;;
    --lr) need_value "$@"; LR="$2"; shift 2 ;;
    --optimizer) need_value "$@"; OPTIMIZER="$2"; shift 2 ;;
    --momentum) need_value "$@"; MOMENTUM="$2"; shift 2 ;;
    --seed) need_value "$@"; SEED="$2"; shift 2 ;;
    --fp16-scaler) need_value "$@"; FP16_SCALER="$2"; shift 2 ;;
    --data-dir) need_value "$@"; DATA_DIR="$2"; shift 2 ;;
    --python) need_value "$@"; PYTHON="$2"; shift 2 ;;
    --gs-args) [[ $# -ge 2 ]] || die "option $1 needs a value"; GS_ARGS="$2"; shift 2 ;;
    --peer-args) [[ $# -ge 2 ]] || die "option $1 needs a value"; PEER_ARGS="$2"; shift 2 ;;
    --table-only) TABLE_ONLY=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done

# ------------------------------------------------------------------------------ validate settings
is_uint() { [[ "$1" =~ ^[0-9]+$ ]] && ((10#$1 > 0)); }
is_number() { [[ "$1" =~ ^[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?$ ]]; }
is_uint "$EPOCHS" || die "EPOCHS must be a positive integer (got '$EPOCHS')"
is_uint "$THREADS" || die "THREADS must be a positive integer (got '$THREADS')"
is_uint "$BATCH" || die "BATCH must be a positive integer (got '$BATCH')"
[[ "$SEED" =~ ^[0-9]+$ ]] || die "SEED must be a non-negative integer (got '$SEED')"
is_number "$LR" || die "LR must be a positive number (got '$LR')"
is_number "$MOMENTUM" || die "MOMENTUM must be a number in [0, 1) (got '$MOMENTUM')"
[[ "$OPTIMIZER" == sgd || "$OPTIMIZER" == adam ]] || die "OPTIMIZER must be sgd or adam (got '$OPTIMIZER')"
read -r -a MODEL_LIST <<<"$MODELS"
((${#MODEL_LIST[@]} > 0)) || die "MODELS is empty (use mlp and/or cnn)"
for m in "${MODEL_LIST[@]}"; do
  [[ "$m" == mlp || "$m" == cnn ]] || die "model '$m' has no PyTorch peer (MODELS may list mlp and cnn)"
done
read -r -a GS_EXTRA <<<"$GS_ARGS"
read -r -a PEER_EXTRA <<<"$PEER_ARGS"

cd "$ROOT"
absolute() { if [[ "$1" == /* ]]; then echo "$1"; else echo "$ROOT/$1"; fi; }
BUILD="$(absolute "$BUILD")"
OUT="$(absolute "$OUT")"
DATA_DIR="$(absolute "$DATA_DIR")"
GRADSCALE="$BUILD/gradscale"
PEER="$ROOT/scripts/peer_torch.py"

[[ -x "$PYTHON" ]] || die "python interpreter '$PYTHON' not found; Debian's python3-torch is installed for /usr/bin/python3 (scripts/setup.sh --peer)"

if ((TABLE_ONLY == 0)); then
  [[ -x "$GRADSCALE" ]] || die "no gradscale binary at $GRADSCALE; build it first (cmake -S . -B $BUILD -DCMAKE_BUILD_TYPE=Release && cmake --build $BUILD -j) or pass --build DIR"
  [[ -f "$PEER" ]] || die "missing $PEER"
  if ! torch_version="$("$PYTHON" -c 'import numpy, torch; print(torch.__version__)' 2>/dev/null)"; then
    die "PyTorch (or numpy) is not importable with $PYTHON; install python3-torch and libopenblas0-pthread with scripts/setup.sh --peer (pyenv or virtualenv interpreters do not see the Debian packages)"
  fi
  for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
    [[ -f "$DATA_DIR/$f.gz" || -f "$DATA_DIR/$f" ]] ||
      die "Fashion-MNIST file $DATA_DIR/$f.gz is missing; install the Debian package dataset-fashion-mnist or pass --data-dir DIR (gradscale would fall back to synthetic data, which makes the comparison meaningless)"
  done
  export GRADSCALE_FASHION_MNIST_DIR="$DATA_DIR"
  if [[ "$OPTIMIZER" == sgd ]]; then
    GS_OPTIMIZER="{\"name\":\"sgd\",\"momentum\":$MOMENTUM}"
  else
    GS_OPTIMIZER="$OPTIMIZER"
  fi
  mkdir -p "$OUT"

  cores="$(nproc 2>/dev/null || echo 1)"
  load1="$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo 0)"
  if awk -v l="$load1" -v c="$cores" 'BEGIN { exit !(l > 0.5 * c) }'; then
    note "warning: load average is $load1 on $cores cores before starting; other work on the machine will distort the timings"
  fi
  note "torch $torch_version, gradscale $GRADSCALE, data $DATA_DIR, results in $OUT"
  note "settings: epochs $EPOCHS, batch $BATCH, $OPTIMIZER lr $LR (momentum $MOMENTUM), seed $SEED, threads $THREADS"
  [[ -z "$GS_ARGS" ]] || note "extra gradscale options: $GS_ARGS"
  [[ -z "$PEER_ARGS" ]] || note "extra PyTorch peer options: $PEER_ARGS"

  # run_logged LOG RESULT CMD... : runs CMD with its output shown and copied to LOG; fails clearly.
  run_logged() {
    local log="$1" result="$2" what="$3"
    shift 3
    rm -f "$result"
    echo
    echo "=== $what"
    echo "+ $(printf '%q ' "$@")"
    if ! "$@" 2>&1 | tee "$log"; then
      die "$what failed; its output is in $log"
    fi
    [[ -s "$result" ]] || die "$what finished but wrote no result file $result (output in $log)"
  }

  for m in "${MODEL_LIST[@]}"; do
    common=(--model "$m" --data fashion-mnist --epochs "$EPOCHS" --batch "$BATCH" --lr "$LR"
      --optimizer "$GS_OPTIMIZER" --seed "$SEED" --threads "$THREADS" "${GS_EXTRA[@]}")
    run_logged "$OUT/$m-gradscale-fp32.log" "$OUT/$m-gradscale-fp32.json" "gradscale fp32, $m" \
      "$GRADSCALE" train "${common[@]}" --format fp32 --result "$OUT/$m-gradscale-fp32.json"
    run_logged "$OUT/$m-gradscale-fp16.log" "$OUT/$m-gradscale-fp16.json" "gradscale fp16 ($FP16_SCALER), $m" \
      "$GRADSCALE" train "${common[@]}" --format fp16 --scaler "$FP16_SCALER" --result "$OUT/$m-gradscale-fp16.json"
    run_logged "$OUT/$m-torch.log" "$OUT/$m-torch.json" "PyTorch, $m" \
      "$PYTHON" "$PEER" --model "$m" --epochs "$EPOCHS" --batch "$BATCH" --lr "$LR" \
      --optimizer "$OPTIMIZER" --momentum "$MOMENTUM" --seed "$SEED" --threads "$THREADS" \
      --data-dir "$DATA_DIR" "${PEER_EXTRA[@]}" --json "$OUT/$m-torch.json"
  done
  echo
fi

# ------------------------------------------------------------------------------------------ table
"$PYTHON" - "$OUT" "$TABLE_ONLY" "$EPOCHS" "$BATCH" "$OPTIMIZER" "$LR" "$MOMENTUM" "$SEED" \
  "$THREADS" "$FP16_SCALER" "${MODEL_LIST[@]}" <<'PY'
import json, math, os, sys, tempfile

out, table_only, epochs, batch, optimizer, lr, momentum, seed, threads, fp16_scaler = sys.argv[1:11]
models = sys.argv[11:]
table_only = table_only == "1"
momentum = float(momentum)
RUNS = [("gradscale-fp32", "gradscale fp32"), ("gradscale-fp16", "gradscale fp16"),
        ("torch", "pytorch fp32")]
problems = []


def num(doc, key, path):
    v = doc.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        problems.append("%s: '%s' is not a number (%r)" % (path, key, v))
        return None
    return float(v)


def load(model, run):
    path = os.path.join(out, "%s-%s.json" % (model, run))
    if not os.path.exists(path):
        if not table_only:
            problems.append("%s is missing" % path)
        return None
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        problems.append("%s: cannot read JSON (%s)" % (path, e))
        return None
    if not isinstance(doc, dict):
        problems.append("%s: not a JSON object" % path)
        return None
    secs = doc.get("epoch_seconds")
    if (not isinstance(secs, list) or not secs
            or not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in secs)):
        problems.append("%s: 'epoch_seconds' must be a non-empty list of numbers" % path)
        return None
    r = {"doc": doc, "path": path, "epochs": len(secs), "mean_s": sum(secs) / len(secs),
         "acc": num(doc, "test_accuracy", path), "test_loss": num(doc, "test_loss", path),
         "train_loss": num(doc, "train_loss", path), "skipped": num(doc, "skipped_steps", path)}
    if r["acc"] is None:
        problems.append("%s: no 'test_accuracy'" % path)
    if run.startswith("gradscale"):
        # "data" says which data was used (e.g. "FALLBACK to synthetic data: ..."); config.optimizer
        # is the resolved optimizer, e.g. {"name": "sgd", "momentum": 0.9, ...}.
        data = doc.get("data")
        if "synthetic" in json.dumps(data):
            problems.append("%s: gradscale did not train on Fashion-MNIST (data: %s)" % (path, data))
        config = doc.get("config")
        opt = config.get("optimizer") if isinstance(config, dict) else None
        if optimizer == "sgd" and isinstance(opt, dict):
            v = opt.get("momentum", 0.0)
            if isinstance(v, (int, float)) and abs(v - momentum) > 1e-12:
                problems.append("%s: gradscale used SGD momentum %g, the PyTorch peer %g"
                                % (path, v, momentum))
    return r


def fmt(v, spec, missing="-"):
    return missing if v is None or (isinstance(v, float) and not math.isfinite(v)) else spec % v


def ratio_line(name, a, b, target):
    if a is None or b is None or b["mean_s"] <= 0:
        return "%-32s      -" % name
    x = a["mean_s"] / b["mean_s"]
    verdict = "met" if x <= target else "NOT met"
    return "%-32s %6.2fx  (target <= %.2fx: %s)" % (name, x, target, verdict)


def points_line(name, a, b, within=None):
    if a is None or b is None or a["acc"] is None or b["acc"] is None:
        return "%-32s      -" % name
    d = 100.0 * (a["acc"] - b["acc"])
    line = "%-32s %+6.2f points" % (name, d)
    if within is not None:
        line += "  (target: within %.1f points: %s)" % (within, "met" if abs(d) <= within
                                                          else "NOT met")
    return line


lines = []
for model in models:
    res = {run: load(model, run) for run, _ in RUNS}
    if all(v is None for v in res.values()):
        problems.append("no results for %s in %s" % (model, out))
        continue
    # With --table-only the settings of the runs come from the peer's result (it records them),
    # not from this invocation's options.
    cfg = (res["torch"] or {}).get("doc", {}).get("config") if table_only else None
    if not isinstance(cfg, dict) or cfg.get("peer") != "pytorch":
        cfg = {}
    m_opt = cfg.get("optimizer", optimizer)
    m_lr = cfg.get("lr", lr)
    opt_desc = ("sgd lr %s momentum %s" % (m_lr, cfg.get("momentum", momentum))
                if m_opt == "sgd" else "%s lr %s" % (m_opt, m_lr))
    ep = sorted({r["epochs"] for r in res.values() if r})
    lines.append("%s: %s epoch%s, batch %s, %s, seed %s, %s threads, fp16 scaler %s"
                 % (model, "/".join(str(e) for e in ep), "" if ep == [1] else "s",
                    cfg.get("batch", batch), opt_desc, cfg.get("seed", seed),
                    cfg.get("threads", threads), fp16_scaler))
    lines.append("  %-16s %8s %7s %10s %10s %11s %8s" % ("run", "epoch s", "epochs", "test acc",
                                                          "test loss", "train loss", "skipped"))
    for run, label in RUNS:
        r = res[run]
        if r is None:
            lines.append("  %-16s %8s" % (label, "(no result)"))
            continue
        lines.append("  %-16s %8.2f %7d %9s%% %10s %11s %8s"
                     % (label, r["mean_s"], r["epochs"], fmt(None if r["acc"] is None else 100 * r["acc"], "%.2f"),
                        fmt(r["test_loss"], "%.4f"), fmt(r["train_loss"], "%.4f"),
                        fmt(r["skipped"], "%d")))
    g32, g16, pt = res["gradscale-fp32"], res["gradscale-fp16"], res["torch"]
    lines.append("  time  " + ratio_line("gradscale fp32 / pytorch", g32, pt, 1.0))
    lines.append("        " + ratio_line("gradscale fp16 / gradscale fp32", g16, g32, 1.3))
    lines.append("  acc   " + points_line("gradscale fp32 - pytorch", g32, pt))
    lines.append("        " + points_line("gradscale fp16 - gradscale fp32", g16, g32, 0.5))
    lines.append("")

text = "\n".join(lines)
if lines:
    print(text)
if problems:
    print("problems:")
    for p in problems:
        print("  - " + p)

if lines:
    os.makedirs(out, exist_ok=True)
    dest = os.path.join(out, "compare.md")
    fd, tmp = tempfile.mkstemp(prefix=".compare.md.", dir=out)
    with os.fdopen(fd, "w") as f:
        f.write("```\n" + text.rstrip("\n") + "\n```\n")
        if problems:
            f.write("\nProblems:\n\n" + "".join("- %s\n" % p for p in problems))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)
    os.replace(tmp, dest)
    print("table written to %s" % dest)
sys.exit(1 if problems else 0)
PY
