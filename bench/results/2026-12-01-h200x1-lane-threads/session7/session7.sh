#!/usr/bin/env bash
# Lane threads with calls on the least busy lane: 64 KiB acquire latency on the default runtime (4 lanes, the
# configuration's), one-thread agents beside; the 2 MiB throughput beside iperf3.
set -u
export NCCL_NVLS_ENABLE=0
B=.device-bin
export PATH="$PWD/$B/iperf3:$PATH"
cfg=cluster-configs/h200x1-agents.toml
log=$OUT/session7.log
for c in 0 1 0 old0; do
  dir=$B; t=$c; [ $c = old0 ] && { dir=$B/old; t=0; }
  name=h200x1-64k-leastbusy-threads$c-$RANDOM
  VFABRIC_BIN=$dir VFABRIC_AGENT_THREADS=$t VFABRIC_MEMORY='page_size = "64KiB"' timeout 120 bash scripts/remote-bench-procs.sh config $cfg g0 g1 \
    --home-device gpu0 --sizes 64KiB --streams 1 --total 64MiB --latency-samples 2000 --iperf-seconds 0 \
    --out $OUT --name $name >> $log 2>&1
  echo "$name $(grep -A2 'acquire(Read) onto' $OUT/$name.md | tail -1)"
done
echo "=== 2MiB, default threads" | tee -a $log
VFABRIC_BIN=$B timeout 200 bash scripts/remote-bench-procs.sh config $cfg g0 g1 --home-device gpu0 --sizes 2MiB --streams 1,8 \
  --total 2GiB --latency-samples 200 --out $OUT --name h200x1-2m-leastbusy >> $log 2>&1
grep "|" $OUT/h200x1-2m-leastbusy.md | head -20
cd $OUT && tar czf results.tgz *.md *.json && rm -f *.md *.json; ls $OUT
