#!/usr/bin/env bash
# Submits an ablation to Slurm as a job array: task K of N runs `gradscale ablate FILE --out DIR
# --shard K/N` (docs/ablations.md, "Over a cluster"), and a last job, started when every task has
# ended (afterany: also after failures, so the table shows them), merges with --table-only.
# DIR must be on a file system every node sees; flock must work there (the run locks).
#   scripts/slurm_ablate.sh FILE.json --out DIR --shards N [--jobs J] [--cpus C] [--time T]
#                           [--partition P] [--gradscale BIN] [--dry-run] [-- SBATCH_ARGS...]
# --jobs: runs at a time inside each task (default 1); --cpus: cores per task (default: J); --time:
# each task's limit (default 12:00:00); --dry-run: print the sbatch commands instead of running them.
set -euo pipefail

die() { echo "slurm_ablate.sh: $*" >&2; exit 2; }
file="" out="" shards="" jobs=1 cpus="" time_limit="12:00:00" partition="" dry_run=0
gradscale="$(cd "$(dirname "$0")/.." && pwd)/build/gradscale"
extra=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="${2:-}"; shift 2 || die "--out needs a directory" ;;
    --shards) shards="${2:-}"; shift 2 || die "--shards needs a number" ;;
    --jobs) jobs="${2:-}"; shift 2 || die "--jobs needs a number" ;;
    --cpus) cpus="${2:-}"; shift 2 || die "--cpus needs a number" ;;
    --time) time_limit="${2:-}"; shift 2 || die "--time needs a Slurm time (e.g. 12:00:00)" ;;
    --partition) partition="${2:-}"; shift 2 || die "--partition needs a name" ;;
    --gradscale) gradscale="${2:-}"; shift 2 || die "--gradscale needs the binary's path" ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [ -z "$file" ] || die "one ablation file, got '$file' and '$1'"; file="$1"; shift ;;
  esac
done
[ -n "$file" ] || die "the ablation file is missing: scripts/slurm_ablate.sh FILE.json --out DIR --shards N"
[ -f "$file" ] || die "the ablation file '$file' does not exist"
[ -n "$out" ] || die "--out DIR is required (on a file system every node sees)"
[[ "$shards" =~ ^[1-9][0-9]*$ ]] || die "--shards must be a whole number >= 1, got '$shards'"
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || die "--jobs must be a whole number >= 1, got '$jobs'"
cpus="${cpus:-$jobs}"
[[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die "--cpus must be a whole number >= 1, got '$cpus'"
[ -x "$gradscale" ] || die "no gradscale binary at '$gradscale' (build it, or give --gradscale BIN)"
file=$(realpath "$file")
out=$(realpath -m "$out")
gradscale=$(realpath "$gradscale")

# Everything is checked before anything is submitted: the file expands (a bad key stops here, not in
# N tasks), and each shard is valid.
"$gradscale" ablate "$file" --dry-run --shard "$shards/$shards" >/dev/null

q() { printf '%q' "$1"; }
common=(--parsable --cpus-per-task="$cpus" --time="$time_limit")
[ -z "$partition" ] || common+=(--partition="$partition")
array_cmd="$(q "$gradscale") ablate $(q "$file") --out $(q "$out") --shard \${SLURM_ARRAY_TASK_ID}/$shards --jobs $jobs"
array=(sbatch "${common[@]}" --job-name=gradscale-ablate --array="1-$shards"
       --output="$out.slurm/shard-%a.log" "${extra[@]}" --wrap="$array_cmd")
merge_cmd="$(q "$gradscale") ablate $(q "$file") --out $(q "$out") --table-only"
if [ "$dry_run" = 1 ]; then
  printf '%q ' "${array[@]}"; echo
  echo "sbatch ${common[*]} --job-name=gradscale-ablate-table --dependency=afterany:<array job id> --output=$(q "$out.slurm/table.log") --wrap=$(q "$merge_cmd")"
  exit 0
fi
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: run this on a Slurm login node (or use --dry-run)"
mkdir -p "$out.slurm"
array_id=$("${array[@]}")
array_id="${array_id%%;*}"
[[ "$array_id" =~ ^[0-9]+$ ]] || die "sbatch did not return a job id (got '$array_id')"
merge_id=$(sbatch "${common[@]}" --job-name=gradscale-ablate-table --dependency="afterany:$array_id" \
                  --output="$out.slurm/table.log" "${extra[@]}" --wrap="$merge_cmd")
merge_id="${merge_id%%;*}"
echo "slurm_ablate.sh: job array $array_id (shards 1-$shards of $file into $out), tables by job $merge_id"
echo "slurm_ablate.sh: logs in $out.slurm/; progress: squeue -j $array_id; a lost shard: rerun it with --shard K/$shards"
