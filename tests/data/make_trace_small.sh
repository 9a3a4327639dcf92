#!/usr/bin/env bash
# Writes tests/data/trace_small.json and trace_small.jsonl, the small trace of a real run that docs/cli.md,
# docs/trace.md and the trace readers' tests use: a 4-layer MLP (flatten, fc1, relu1, fc2) trained for one
# epoch of synthetic:160 (20 steps) in fp16 under the adaptive policy, method measured, with an initial
# loss scale high enough (2^19) to overflow once: traced steps 10 (every 10), 13 (skipped: overflow),
# 14 (S0 halved) and 20. The .jsonl is cut as a run that died while writing step 20's line would leave it:
# the header, steps 10, 13 and 14, and half of step 20's line. The overflow's step depends on the
# floating point of the machine (Eigen's GEMM kernels per CPU): the script checks those four steps and
# exits 1 when the run differs. tests/data/trace_by_hand.json is the hand-written fixture whose numbers
# the tests work out by hand (tests/test_inspect_*.cpp).
#   tests/data/make_trace_small.sh [GRADSCALE]   (default build/gradscale)
set -euo pipefail
cd "$(dirname "$0")/../.."
gradscale=${1:-build/gradscale}
config=$(mktemp --suffix=.json)
trap 'rm -f "$config"' EXIT
cat > "$config" <<'EOF'
{
  "model_spec": {"name": "tiny-mlp", "input": [1, 28, 28],
                 "layers": [{"type": "flatten", "name": "flatten"}, {"type": "linear", "name": "fc1", "out": 4},
                            {"type": "relu", "name": "relu1"}, {"type": "linear", "name": "fc2", "out": 10}]},
  "data": "synthetic:160", "format": "fp16",
  "scaler": {"policy": "adaptive", "method": "measured", "init_scale": 524288},
  "optimizer": "sgd", "lr": 0.1, "epochs": 1, "batch": 8, "seed": 30, "threads": 1
}
EOF
"$gradscale" train --config "$config" --trace tests/data/trace_small --quiet
/usr/bin/python3 - <<'EOF'
import json, sys
path = "tests/data/trace_small"
steps = json.load(open(path + ".json"))["steps"]
got = [(s["step"], s["skipped"]) for s in steps]
if got != [(10, False), (13, True), (14, False), (20, False)]:
    sys.exit(f"make_trace_small.sh: the run traced (step, skipped) {got}, not steps 10, 13 (skipped), 14, 20")
lines = open(path + ".jsonl").read().split("\n")
with open(path + ".jsonl", "w") as out:
    out.write("\n".join(lines[:4]) + "\n" + lines[4][: len(lines[4]) // 2])
EOF
echo "make_trace_small.sh: wrote $PWD/tests/data/trace_small.json and trace_small.jsonl"
