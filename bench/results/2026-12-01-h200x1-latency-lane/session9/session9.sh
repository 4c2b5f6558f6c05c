#!/usr/bin/env bash
# The final build of the lane-threads work (4bb1c26): GPU tests; 2 MiB throughput beside iperf3 on the default
# runtime, against old/ (19be2e8, before lane threads) in the same call; 64 KiB acquire latency.
set -u
export NCCL_NVLS_ENABLE=0
B=.device-bin
export PATH="$PWD/$B/iperf3:$PATH"
cfg=cluster-configs/h200x1-agents.toml
log=$OUT/session9.log
echo "=== gpu tests" | tee -a $log
$B/gpu-tests --test-threads=1 >> $log 2>&1; echo "gpu tests rc=$?"; grep "test result" $log
for run in new:1 old:1 new:2; do
  bin=${run%%:*}; i=${run##*:}
  dir=$B; [ $bin = old ] && dir=$B/old
  name=h200x1-2m-$bin-run$i
  echo "=== $name" | tee -a $log
  SECONDS=0
  VFABRIC_BIN=$dir timeout 170 bash scripts/remote-bench-procs.sh config $cfg g0 g1 --home-device gpu0 --sizes 2MiB \
    --streams 1,8 --total 2GiB --latency-samples 200 --out $OUT --name $name >> $log 2>&1
  echo "$name rc=$? in ${SECONDS}s"
  grep "|" $OUT/$name.md | head -8
done
cd $OUT && tar czf results.tgz *.md *.json && rm -f *.md *.json; ls $OUT
