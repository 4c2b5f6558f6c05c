#!/usr/bin/env bash
# The final build of the session (536c868: the latency lane, protocol version 2): the GPU tests, 2 MiB
# throughput beside iperf3 (default runtime) for new and old (19be2e8), 64 KiB acquire latency.
set -u
export NCCL_NVLS_ENABLE=0
B=.device-bin
export PATH="$PWD/$B/iperf3:$PATH"
cfg=cluster-configs/h200x1-agents.toml
log=$OUT/session14.log
echo "=== gpu tests" | tee -a $log
$B/gpu-tests --test-threads=1 >> $log 2>&1; echo "gpu tests rc=$?"; grep "test result" $log
for run in new:1 old:1; do
  bin=${run%%:*}; i=${run##*:}
  dir=$B; [ $bin != new ] && dir=$B/$bin
  name=h200x1-2m-$bin-run$i
  echo "=== $name" | tee -a $log
  SECONDS=0
  VFABRIC_BIN=$dir timeout 100 bash scripts/remote-bench-procs.sh config $cfg g0 g1 --home-device gpu0 --sizes 2MiB \
    --streams 1,8 --total 2GiB --latency-samples 200 --out $OUT --name $name >> $log 2>&1
  echo "$name rc=$? in ${SECONDS}s"
  grep "|" $OUT/$name.md | grep -v "^|---" | head -8 | grep -v packet
done
for i in 1 2; do
  name=h200x1-64k-new-run$i
  VFABRIC_BIN=$B VFABRIC_MEMORY='page_size = "64KiB"' timeout 100 bash scripts/remote-bench-procs.sh config $cfg g0 g1 \
    --home-device gpu0 --sizes 64KiB --streams 1 --total 64MiB --latency-samples 2000 --iperf-seconds 0 \
    --out $OUT --name $name >> $log 2>&1
  echo "$name $(grep -A2 'acquire(Read) onto' $OUT/$name.md | tail -1)"
done
cd $OUT && tar czf results.tgz *.md *.json && rm -f *.md *.json; ls $OUT
