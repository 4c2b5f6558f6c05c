#!/usr/bin/env bash
# Where the last 6-13% of 8-in-flight write throughput goes: old (19be2e8), new (536c868) and new with
# latency_lane = false (no latency lane, no lane thread: the bulk lanes alone, as in old), alternating, 2 MiB
# requests, 8 in flight, each beside iperf3.
set -u
export NCCL_NVLS_ENABLE=0
B=.device-bin
export PATH="$PWD/$B/iperf3:$PATH"
cfg=cluster-configs/h200x1-agents.toml
log=$OUT/session15.log
for run in old:1 new:1 nolat:1 old:2 new:2 nolat:2; do
  bin=${run%%:*}; i=${run##*:}
  dir=$B; [ $bin = old ] && dir=$B/old
  netw=""; [ $bin = nolat ] && netw="latency_lane = false"
  name=h200x1-2m8-$bin-run$i
  VFABRIC_BIN=$dir VFABRIC_NETWORK="$netw" timeout 80 bash scripts/remote-bench-procs.sh config $cfg g0 g1 --home-device gpu0 \
    --sizes 2MiB --streams 8 --total 2GiB --latency-samples 20 --iperf-seconds 3 --out $OUT --name $name >> $log 2>&1
  echo "$name rc=$? $(grep "| 16383 | write | 2MiB" $OUT/$name.md) $(grep "| 16383 | read | 2MiB" $OUT/$name.md | cut -d'|' -f6,7)"
done
cd $OUT && tar czf results.tgz *.md *.json && rm -f *.md *.json; ls $OUT
