#!/usr/bin/env bash
# Submits an ablation to Slurm as a job array: task K of N runs `gradscale ablate FILE --out DIR
# --shard K/N` (docs/ablations.md, "Over a cluster"), and a last job, started when every task has
# ended (afterany: also after failures, so the table shows them), merges with --table-only.
# DIR must be on a file system every node sees; flock must work there (the run locks).
#   scripts/slurm_ablate.sh FILE.json --out DIR --shards N [--jobs J] [--cpus C] [--time T]
#                           [--partition P] [--gradscale BIN] [--dry-run] [-- SBATCH_ARGS...]
# --jobs: runs at a time inside each task (default 1); --cpus: cores per task (default: J); --time:
# each task's limit (default 12:00:00); --dry-run: print the two sbatch commands, every argument quoted
# for POSIX sh, exactly as they would be submitted, instead of running them.
# Slurm runs --wrap with /bin/sh (dash on Debian): the commands inside it are quoted for POSIX sh, in
# single quotes (a quote as '\''), never bash's $'...'.
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
# realpath's answer in REPLY: its line without the newline realpath adds, but with any the name ends in.
real() {
  local r
  r=$(realpath "$@" && echo x) || die "cannot resolve the path '${*: -1}'"
  r="${r%x}"
  REPLY="${r%$'\n'}"
}
real -- "$file"; file="$REPLY"
real -m -- "$out"; out="$REPLY"
real -- "$gradscale"; gradscale="$REPLY"

# Everything is checked before anything is submitted: the file expands (a bad key stops here, not in
# N tasks), and each shard is valid.
"$gradscale" ablate "$file" --dry-run --shard "$shards/$shards" >/dev/null

# One word for POSIX sh: single-quoted, each ' as '\'' (any byte, a newline included, stands as it is).
q() { local quote="'\\''"; printf "'%s'" "${1//\'/$quote}"; }
common=(--parsable --cpus-per-task="$cpus" --time="$time_limit")
[ -z "$partition" ] || common+=(--partition="$partition")
array_cmd="$(q "$gradscale") ablate $(q "$file") --out $(q "$out") --shard \${SLURM_ARRAY_TASK_ID}/$shards --jobs $jobs"
array=(sbatch "${common[@]}" --job-name=gradscale-ablate --array="1-$shards"
       --output="$out.slurm/shard-%a.log" "${extra[@]}" --wrap="$array_cmd")
merge_cmd="$(q "$gradscale") ablate $(q "$file") --out $(q "$out") --table-only"
# The merge's arguments; its --dependency (afterany: the array's job id) is added at submission.
merge=(sbatch "${common[@]}" --job-name=gradscale-ablate-table --output="$out.slurm/table.log" "${extra[@]}"
       --wrap="$merge_cmd")
if [ "$dry_run" = 1 ]; then
  # What the submission below runs, as sh commands: the array's job id is read into $array_id.
  printf 'mkdir -p %s\n' "$(q "$out.slurm")"
  printf 'array_id=$('; for a in "${array[@]}"; do printf '%s ' "$(q "$a")"; done; printf ') && \\\n'
  printf '%s ' "$(q "${merge[0]}")"
  printf '%s"${array_id%%%%;*}" ' "$(q "--dependency=afterany:")"
  for a in "${merge[@]:1}"; do printf '%s ' "$(q "$a")"; done; echo
  exit 0
fi
command -v sbatch >/dev/null 2>&1 || die "sbatch not found: run this on a Slurm login node (or use --dry-run)"
mkdir -p "$out.slurm"
array_id=$("${array[@]}")
array_id="${array_id%%;*}"
[[ "$array_id" =~ ^[0-9]+$ ]] || die "sbatch did not return a job id (got '$array_id')"
merge_id=$("${merge[0]}" --dependency="afterany:$array_id" "${merge[@]:1}")
merge_id="${merge_id%%;*}"
echo "slurm_ablate.sh: job array $array_id (shards 1-$shards of $file into $out), tables by job $merge_id"
echo "slurm_ablate.sh: logs in $out.slurm/; progress: squeue -j $array_id; a lost shard: rerun it with --shard K/$shards"
