#!/usr/bin/env bash
# Keeps a device run's results in the layout of bench/results/: one folder per scenario, holding its latest run.
# Usage: scripts/keep-results.sh OUTDIR
# OUTDIR is what scripts/device-run.sh wrote to $OUT (the run's files, fetched back from the GPU machine):
#   device-run.log                     -> the device log of every scenario below that this run fed
#   migrate-MACHINE.{json,md}          -> bench/results/migrate/MACHINE.{json,md}   (VFABRIC_BENCH_NAME)
#   migrate-MACHINE-sweeps.{json,md}   -> bench/results/migrate-sweeps/MACHINE.{json,md}
#   torch-probe.json                   -> bench/results/migrate/torch-probe.json
#   pager-MACHINE.{json,md}            -> bench/results/pager/MACHINE.{json,md}
#   remote-MACHINE.{json,md}           -> bench/results/remote/MACHINE.{json,md}    (VFABRIC_REMOTE_NAME)
#   local-MACHINE.{json,md}            -> bench/results/local/MACHINE.{json,md}     (VFABRIC_LOCAL_NAME)
#   status-MACHINE.{json,md}           -> bench/results/status/MACHINE.{json,md}
#   sweep-MACHINE.{json,md}            -> bench/results/sweep/MACHINE.{json,md}
#   the demo's section of device-run.log (step `demo`) -> bench/results/demo/device-run.log
# Each scenario folder this run feeds loses the previous run's files first (its README.md stays; git history
# keeps the old files). page_copy.ptx is not kept here: device-run.sh's ptx step says whether it differs from
# transport/kernels/page_copy.ptx. Afterwards: update each fed folder's README.md (date, machine, commit,
# command) and the figures and index of docs/benchmarks.md, and commit them together.
set -euo pipefail
src=${1:?usage: scripts/keep-results.sh OUTDIR}
[ -d "$src" ] || { echo "no such directory: $src" >&2; exit 2; }
cd "$(dirname "$0")/.."
dst=bench/results
fed=()

# Empties a scenario folder (all but its README.md) the first time this run feeds it.
feed() { # SCENARIO
    local s=$1 f
    for f in "${fed[@]:-}"; do [ "$f" = "$s" ] && return 0; done
    mkdir -p "$dst/$s"
    find "$dst/$s" -maxdepth 1 -type f ! -name README.md -delete
    fed+=("$s")
}
keep() { # FILE SCENARIO NAME
    feed "$2"
    cp "$1" "$dst/$2/$3"
    echo "kept $1 -> $dst/$2/$3"
}

shopt -s nullglob
for f in "$src"/migrate-*.json "$src"/migrate-*.md; do
    base=$(basename "$f"); ext=${base##*.}; name=${base%.*}; name=${name#migrate-}
    case $name in
        *-sweeps) keep "$f" migrate-sweeps "${name%-sweeps}.$ext" ;;
        *) keep "$f" migrate "$name.$ext" ;;
    esac
done
[ -f "$src/torch-probe.json" ] && keep "$src/torch-probe.json" migrate torch-probe.json
for kind in pager remote local status sweep; do
    for f in "$src/$kind"-*.json "$src/$kind"-*.md; do
        base=$(basename "$f")
        keep "$f" "$kind" "${base#"$kind"-}"
    done
done
if [ -f "$src/device-run.log" ]; then
    # The demo: the whole log, where its step ran.
    grep -q "^===== demo: rc=" "$src/device-run.log" && keep "$src/device-run.log" demo device-run.log
    for s in "${fed[@]:-}"; do
        [ -n "$s" ] && [ "$s" != demo ] && keep "$src/device-run.log" "$s" device-run.log
    done
fi
if [ ${#fed[@]} -eq 0 ]; then
    echo "nothing of a device run found in $src" >&2
    exit 1
fi
# Each kept result's plot beside its JSON (bench/scripts/plot_results.py; matplotlib from the venv of
# scripts/python-venv.sh, else the system's python3).
py=python3
[ -x target/pyenv/bin/python ] && py=target/pyenv/bin/python
for s in "${fed[@]}"; do
    "$py" bench/scripts/plot_results.py "$dst/$s" || echo "could not draw $dst/$s (is matplotlib installed?)" >&2
done
echo "fed: ${fed[*]}; now update their README.md files and docs/benchmarks.md"
