#!/usr/bin/env bash
# CI's step for the Python package (python/): builds the abi3 wheel in the dev profile with maturin, installs it
# into the venv target/pyenv (scripts/python-venv.sh makes it) and runs pytest on python/tests. Cargo's build
# cache is the workspace's target/, so after the workspace is built this takes a minute or two.
#
#   bash scripts/python-tests.sh
#
# Prints the step that failed, and exits non-zero, if any does.
set -uo pipefail
cd "$(dirname "$0")/.."
venv=target/pyenv
wheels=target/python-wheels

failed() {
    echo "python-tests: FAILED: $1" >&2
    exit 1
}

echo "python-tests: the Python environment ($venv)"
bash scripts/python-venv.sh || failed "setting up $venv (scripts/python-venv.sh)"
"$venv/bin/python" --version

echo "python-tests: building the wheel (maturin, dev profile)"
rm -rf "$wheels"
"$venv/bin/maturin" build --locked -m python/Cargo.toml --profile dev --interpreter "$venv/bin/python" \
    --out "$wheels" || failed "maturin build (the Rust crate python/ did not build)"
wheel=$(ls "$wheels"/vfabric-*.whl 2>/dev/null | head -n 1)
[ -n "$wheel" ] || failed "maturin build made no wheel in $wheels"

echo "python-tests: installing $wheel"
"$venv/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel" ||
    failed "pip install $wheel"

echo "python-tests: pytest python/tests"
# No bytecode or cache files in the source tree; pytest's exit 5 (no tests ran) is a failure too.
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/pytest" -q -p no:cacheprovider python/tests
status=$?
[ "$status" = 0 ] || failed "pytest python/tests (exit $status): the failing tests are listed above"

# The benchmark plots: every committed result the plotter knows is drawn (into a scratch folder).
echo "python-tests: bench/scripts/plot_results.py over bench/results"
plots=$(mktemp -d)
PYTHONDONTWRITEBYTECODE=1 "$venv/bin/python" bench/scripts/plot_results.py --out "$plots" bench/results > "$plots/log" 2>&1
status=$?
tail -n 1 "$plots/log"
grep -q "Traceback" "$plots/log" && status=1
[ "$status" = 0 ] || { cat "$plots/log"; rm -rf "$plots"; failed "plot_results.py could not draw the committed results"; }
rm -rf "$plots"
echo "python-tests: passed"
