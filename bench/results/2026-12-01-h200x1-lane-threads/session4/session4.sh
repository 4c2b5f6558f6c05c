#!/usr/bin/env bash
# Lane threads: 64 KiB acquire latency, before (old/) and after, default runtime and one-thread agents; the
# 2 MiB throughput beside iperf3 on the default runtime; the GPU tests.
set -u
export NCCL_NVLS_ENABLE=0
B=.device-bin
export PATH="$PWD/$B/iperf3:$PATH"
cfg=cluster-configs/h200x1-agents.toml
log=$OUT/session4.log
echo "=== gpu tests" | tee -a $log
$B/gpu-tests --test-threads=1 >> $log 2>&1; echo "gpu tests rc=$?"; grep "test result" $log
for i in 1 2; do
  for c in new:0 old:0 new:1; do
    bin=${c%%:*}; t=${c##*:}
    dir=$B; [ $bin = old ] && dir=$B/old
    name=h200x1-64k-lanes-$bin-threads$t-run$i
    VFABRIC_BIN=$dir VFABRIC_AGENT_THREADS=$t VFABRIC_MEMORY='page_size = "64KiB"' timeout 120 bash scripts/remote-bench-procs.sh config $cfg g0 g1 \
      --home-device gpu0 --sizes 64KiB --streams 1 --total 64MiB --latency-samples 2000 --iperf-seconds 0 \
      --out $OUT --name $name >> $log 2>&1
    echo "$name $(grep -A2 'acquire(Read) onto' $OUT/$name.md | tail -1)"
  done
done
echo "=== 2MiB, default threads" | tee -a $log
VFABRIC_BIN=$B timeout 200 bash scripts/remote-bench-procs.sh config $cfg g0 g1 --home-device gpu0 --sizes 2MiB --streams 1,8 \
  --total 2GiB --latency-samples 200 --out $OUT --name h200x1-2m-lanes >> $log 2>&1
grep "|" $OUT/h200x1-2m-lanes.md | head -20
cd $OUT && tar czf results.tgz *.md *.json && rm -f *.md *.json; ls $OUT
