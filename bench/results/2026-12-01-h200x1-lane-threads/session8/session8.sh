#!/usr/bin/env bash
# The least busy lane taken atomically: the 2 MiB throughput beside iperf3 on the default runtime, then a
# 64 KiB acquire latency run.
set -u
export NCCL_NVLS_ENABLE=0
B=.device-bin
export PATH="$PWD/$B/iperf3:$PATH"
cfg=cluster-configs/h200x1-agents.toml
log=$OUT/session8.log
echo "=== 2MiB, default threads" | tee -a $log
VFABRIC_BIN=$B timeout 150 bash scripts/remote-bench-procs.sh config $cfg g0 g1 --home-device gpu0 --sizes 2MiB --streams 1,8 \
  --total 2GiB --latency-samples 200 --out $OUT --name h200x1-2m-leastbusy-cas >> $log 2>&1
grep "|" $OUT/h200x1-2m-leastbusy-cas.md | head -20
name=h200x1-64k-leastbusy-cas-threads0
VFABRIC_BIN=$B VFABRIC_MEMORY='page_size = "64KiB"' timeout 100 bash scripts/remote-bench-procs.sh config $cfg g0 g1 \
  --home-device gpu0 --sizes 64KiB --streams 1 --total 64MiB --latency-samples 2000 --iperf-seconds 0 \
  --out $OUT --name $name >> $log 2>&1
echo "$name $(grep -A2 'acquire(Read) onto' $OUT/$name.md | tail -1)"
cd $OUT && tar czf results.tgz *.md *.json && rm -f *.md *.json; ls $OUT
