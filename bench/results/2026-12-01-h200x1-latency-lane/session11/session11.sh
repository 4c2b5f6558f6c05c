#!/usr/bin/env bash
# Why lane threads cost 2 MiB write throughput: the host, then 8 writes/reads of 2 MiB in flight for old
# (19be2e8), new (bulk off the lanes), new without lane threads, new with 8 lanes; 64 KiB latency without lane
# threads and with. ("nothreads" ran with the setting `lane_threads = false` of that build, since replaced by
# `latency_lane`; the 64 KiB files named "lanethreads" are the runs with lane threads.)
set -u
export NCCL_NVLS_ENABLE=0
B=.device-bin
export PATH="$PWD/$B/iperf3:$PATH"
cfg=cluster-configs/h200x1-agents.toml
log=$OUT/session11.log
{ nproc; cat /sys/fs/cgroup/cpu.max 2>/dev/null; lscpu | grep -E "Model name|^CPU\(s\)|Thread|MHz|NUMA node"; } | tee -a $log
for run in old:: new:: new:lane_threads=false: new::8 old::; do
  IFS=: read bin netw lanes <<< "$run"
  dir=$B; [ $bin != new ] && dir=$B/$bin
  name=h200x1-2m8-$bin${netw:+-nothreads}${lanes:+-lanes$lanes}
  [ -e $OUT/$name.md ] && name=$name-again
  echo "=== $name" | tee -a $log
  SECONDS=0
  VFABRIC_BIN=$dir VFABRIC_NETWORK="$netw" VFABRIC_LANES="$lanes" timeout 100 bash scripts/remote-bench-procs.sh config $cfg g0 g1 \
    --home-device gpu0 --sizes 2MiB --streams 8 --total 2GiB --latency-samples 100 --out $OUT --name $name >> $log 2>&1
  echo "$name rc=$? in ${SECONDS}s"
  grep "|" $OUT/$name.md | grep -v "^|---" | head -3 | tail -2
done
for netw in lane_threads=false "" lane_threads=false ""; do
  name=h200x1-64k-${netw:+nothreads}
  [ -e $OUT/$name.md ] && name=$name-again
  VFABRIC_BIN=$B VFABRIC_NETWORK="$netw" VFABRIC_MEMORY='page_size = "64KiB"' timeout 100 bash scripts/remote-bench-procs.sh config $cfg g0 g1 \
    --home-device gpu0 --sizes 64KiB --streams 1 --total 64MiB --latency-samples 2000 --iperf-seconds 0 \
    --out $OUT --name $name >> $log 2>&1
  echo "$name $(grep -A2 'acquire(Read) onto' $OUT/$name.md | tail -1)"
done
cd $OUT && tar czf results.tgz *.md *.json && rm -f *.md *.json; ls $OUT
