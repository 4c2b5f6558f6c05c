#!/usr/bin/env bash
# The fuzz targets (fuzz/: control frames, chunk headers, configuration files, peers' certificates), each run
# for a while from its committed corpus with cargo-fuzz on nightly. CI runs each briefly; a longer run by hand:
#
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh            # or: FUZZ_RUNS=10000000 bash scripts/fuzz.sh
#   bash scripts/fuzz.sh frame config                 # some targets only
#
# Installs cargo-fuzz when it is missing. A crash fails the run and leaves its input under
# fuzz/artifacts/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(frame chunk_header config certificate)
# With a nightly toolchain, the targets build with AddressSanitizer. Without one (CI's machine has only its
# stable toolchain and can fetch no other), with the stable compiler told to accept the flags cargo-fuzz passes
# (RUSTC_BOOTSTRAP) and no sanitizer: libFuzzer's coverage and Rust's own checks (bounds, overflow in debug
# assertions) still find panics and aborts. FUZZ_STABLE=1 takes that way where nightly is present too.
if [ -z "${FUZZ_STABLE:-}" ] && cargo +nightly --version > /dev/null 2>&1; then
    fuzz=(cargo +nightly fuzz)
    build=(-O -a)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
    build=(-O -a --sanitizer none)
fi
command -v cargo-fuzz > /dev/null || cargo install --locked cargo-fuzz
"${fuzz[@]}" build "${build[@]}"
for t in "${targets[@]}"; do
    limit=(-max_total_time="${FUZZ_SECONDS:-20}")
    [ -n "${FUZZ_RUNS:-}" ] && limit=(-runs="$FUZZ_RUNS")
    echo "fuzz: $t (${limit[*]})"
    mkdir -p "corpus/$t"
    "${fuzz[@]}" run "${build[@]}" "$t" "corpus/$t" -- "${limit[@]}" -print_final_stats=1 2>&1 |
        grep -E "^(Done|#[0-9]+ +DONE)|stat::number_of_executed_units|stat::average_exec_per_sec|ERROR|SUMMARY|panicked" ||
        true
    # grep's status says nothing; cargo fuzz's does.
    [ "${PIPESTATUS[0]}" = 0 ] || { echo "fuzz: $t FAILED (input under fuzz/artifacts/$t/)" >&2; exit 1; }
done
echo "fuzz: every target ran clean"
