#!/usr/bin/env bash
# Lane threads, which side: the peer (home) on the default runtime with lane threads and this end on one
# thread, and the other way round; the binary before (old/) alike.
set -u
export NCCL_NVLS_ENABLE=0
B=.device-bin
cfg=cluster-configs/h200x1-agents.toml
log=$OUT/session6.log
for i in 1 2; do
  for c in new:0:0 old:0:0 new:1:1; do
    IFS=: read -r bin peer this <<< "$c"
    dir=$B; [ $bin = old ] && dir=$B/old
    name=h200x1-64k-lanes1-$bin-peer$peer-this$this-run$i
    VFABRIC_LANES=1 VFABRIC_BIN=$dir VFABRIC_PEER_THREADS=$peer VFABRIC_AGENT_THREADS=$this VFABRIC_MEMORY='page_size = "64KiB"' timeout 120 bash scripts/remote-bench-procs.sh config $cfg g0 g1 \
      --home-device gpu0 --sizes 64KiB --streams 1 --total 64MiB --latency-samples 2000 --iperf-seconds 0 \
      --out $OUT --name $name >> $log 2>&1
    echo "$name $(grep -A2 'acquire(Read) onto' $OUT/$name.md | tail -1)"
  done
done
cd $OUT && tar czf results.tgz *.md *.json && rm -f *.md *.json; ls $OUT
