#!/usr/bin/env bash
# The training benchmark on the GPU machine: train_offload.py's runs, one process each, in the order given, each
# under its own timeout, skipping what the overall budget leaves no time for. Results: $OUT/train.jsonl (one
# JSON line per run) and $OUT/train.log. bench/scripts/train_report.py makes the table and the plot from them.
#
#   RUNS="small_resident small_vfabric" BUDGET_S=570 OUT=/tmp/out bash bench/scripts/train_bench.sh
#
# The vfabric and allocator runs import the Python package: PYTHONPATH must find the wheel's vfabric (device-run.sh
# installs it). The sizes are the anchors': small = 1.07 B parameters (batch 8), large = 4.16 B (batch 4), seq 2048.
set -uo pipefail
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/train-out}
mkdir -p "$OUT"
BUDGET_S=${BUDGET_S:-570}
T0=$(date +%s)
here=$(dirname "$0")
SMALL="--layers 20 --d 2048 --heads 16 --vocab 32768 --seq 2048 --batch 8"
LARGE="--layers 20 --d 4096 --heads 32 --vocab 32768 --seq 2048 --batch 4"
# The fabric's GPU budget: a third of the model's parameters + gradients + AdamW states or less (small: 16 GiB of
# state, large: 62 GiB), PyTorch's own activations and embedding beside it.
SMALL_FABRIC=${SMALL_FABRIC:-5GiB}
LARGE_FABRIC=${LARGE_FABRIC:-10GiB}
# Blocks whose AdamW step runs on the CPU beside the GPU (the last ones): *_vfabric runs; *_vfabric_gpu runs none.
SMALL_HOST=${SMALL_HOST:-8}
LARGE_HOST=${LARGE_HOST:-10}
declare -A ARGS TMO LAUNCH ENVS
ARGS[small_resident]="$SMALL --mode resident";                                        TMO[small_resident]=90
ARGS[small_fsdp]="$SMALL --mode fsdp";                                                TMO[small_fsdp]=150
ARGS[small_stream]="$SMALL --mode stream --act keep --opt gpu";                       TMO[small_stream]=120
ARGS[small_stream_recompute]="$SMALL --mode stream --act recompute --opt gpu";        TMO[small_stream_recompute]=120
ARGS[small_vfabric]="$SMALL --mode vfabric --fabric-budget $SMALL_FABRIC --host-layers $SMALL_HOST"; TMO[small_vfabric]=150
ARGS[small_vfabric_gpu]="$SMALL --mode vfabric --fabric-budget $SMALL_FABRIC";        TMO[small_vfabric_gpu]=150
ARGS[small_allocator]="$SMALL --mode allocator";                                      TMO[small_allocator]=90
ARGS[large_resident]="$LARGE --mode resident --steps 8 --warmup 2";                   TMO[large_resident]=120
ARGS[large_fsdp]="$LARGE --mode fsdp --steps 6 --warmup 2";                           TMO[large_fsdp]=220
ARGS[large_stream_recompute]="$LARGE --mode stream --act recompute --opt gpu --steps 8 --warmup 2"; TMO[large_stream_recompute]=180
ARGS[large_vfabric]="$LARGE --mode vfabric --fabric-budget $LARGE_FABRIC --host-layers $LARGE_HOST --steps 8 --warmup 2"; TMO[large_vfabric]=240
# The CPU's steps a chunk of 4 Mi parameters at a time (AdamW, then the chunk's compute copy while it is cached).
ARGS[large_vfabric_chunk]="$LARGE --mode vfabric --fabric-budget $LARGE_FABRIC --host-layers $LARGE_HOST --host-chunk 4194304 --steps 8 --warmup 2"; TMO[large_vfabric_chunk]=240
# The CPU's share chosen by the stream from what each step measures (vfabric.balance.HostShare), from half the
# blocks; more warmup steps, in which it settles.
ARGS[small_vfabric_auto]="$SMALL --mode vfabric --fabric-budget $SMALL_FABRIC --host-layers auto --steps 16 --warmup 8"; TMO[small_vfabric_auto]=150
ARGS[large_vfabric_auto]="$LARGE --mode vfabric --fabric-budget $LARGE_FABRIC --host-layers auto --steps 14 --warmup 6"; TMO[large_vfabric_auto]=240
# The CPU's steps on fewer threads than cores (the loop's thread and the fabric's keep some).
ARGS[large_vfabric_t12]="$LARGE --mode vfabric --fabric-budget $LARGE_FABRIC --host-layers $LARGE_HOST --host-threads 12 --steps 8 --warmup 2"; TMO[large_vfabric_t12]=240
ARGS[large_vfabric_t8]="$LARGE --mode vfabric --fabric-budget $LARGE_FABRIC --host-layers $LARGE_HOST --host-threads 8 --steps 8 --warmup 2"; TMO[large_vfabric_t8]=240
ARGS[large_vfabric_gpu]="$LARGE --mode vfabric --fabric-budget $LARGE_FABRIC --steps 8 --warmup 2"; TMO[large_vfabric_gpu]=240
ARGS[large_allocator]="$LARGE --mode allocator --steps 8 --warmup 2";                 TMO[large_allocator]=120
ARGS[large_resident_accum16]="$LARGE --mode resident --accum 16 --steps 4 --warmup 1"; TMO[large_resident_accum16]=150
# The same 16 micro-batches run block by block (StreamedLayers.step_by_blocks): all 16 through a block before the
# next block (their layer inputs and gradients, fp32, take 4 GiB of PyTorch's: a smaller fabric budget, more of
# the AdamW steps on the CPU), 8 or 4 at a time.
BLOCKS_FABRIC=${BLOCKS_FABRIC:-5GiB}
BLOCKS_HOST=${BLOCKS_HOST:-16}
ARGS[large_vfabric_accum16_blocks]="$LARGE --mode vfabric --accum 16 --schedule blocks --fabric-budget $BLOCKS_FABRIC --host-layers $BLOCKS_HOST --steps 4 --warmup 1"; TMO[large_vfabric_accum16_blocks]=240
ARGS[large_vfabric_accum16_blocks8]="$LARGE --mode vfabric --accum 16 --schedule blocks --group 8 --fabric-budget 8GiB --host-layers $LARGE_HOST --steps 4 --warmup 1"; TMO[large_vfabric_accum16_blocks8]=240
ARGS[large_vfabric_accum16_blocks4]="$LARGE --mode vfabric --accum 16 --schedule blocks --group 4 --fabric-budget $LARGE_FABRIC --host-layers $LARGE_HOST --steps 4 --warmup 1"; TMO[large_vfabric_accum16_blocks4]=240
ARGS[large_vfabric_accum16]="$LARGE --mode vfabric --accum 16 --fabric-budget $LARGE_FABRIC --host-layers $LARGE_HOST --steps 4 --warmup 1"; TMO[large_vfabric_accum16]=300
# Data parallel, two ranks (torchrun, and mpirun for one run; bench/scripts/train_ranks.py): one rank a GPU, or both
# sharing the GPU of a one-GPU machine (each rank its own NCCL host then: the all-reduces cross sockets, not
# NVLink). A mid-sized model (0.47 B parameters, batch 4 a rank): DDP, FSDP2 with CPU offload, and the blocks
# streamed through the node's agent.
# A step stuck for a minute prints every thread's Python stack (--watchdog) into the log.
DP="--layers 8 --dim 2048 --heads 16 --vocab 32768 --seq 2048 --batch 4 --steps 6 --warmup 2 --watchdog 60"
DP_FABRIC=${DP_FABRIC:-2GiB}
ARGS[dp2_resident]="$DP --mode resident";                                             TMO[dp2_resident]=120; LAUNCH[dp2_resident]=torchrun
ARGS[dp2_fsdp]="$DP --mode fsdp";                                                     TMO[dp2_fsdp]=150; LAUNCH[dp2_fsdp]=torchrun
ARGS[dp2_vfabric]="$DP --mode vfabric --fabric-budget $DP_FABRIC --host-layers 2";    TMO[dp2_vfabric]=150; LAUNCH[dp2_vfabric]=torchrun
ARGS[dp2_vfabric_gpu]="$DP --mode vfabric --fabric-budget $DP_FABRIC";                TMO[dp2_vfabric_gpu]=150; LAUNCH[dp2_vfabric_gpu]=torchrun
ARGS[dp2_vfabric_mpirun]="$DP --mode vfabric --fabric-budget $DP_FABRIC --host-layers 2"; TMO[dp2_vfabric_mpirun]=150; LAUNCH[dp2_vfabric_mpirun]=mpirun
# The same as dp2_vfabric with the agent inside local rank 0's process (the default is a process of its own).
ARGS[dp2_vfabric_thread]="${ARGS[dp2_vfabric]}";                                      TMO[dp2_vfabric_thread]=150; LAUNCH[dp2_vfabric_thread]=torchrun
ENVS[dp2_vfabric_thread]="VFABRIC_HOST_AGENT=thread"
RANKS_PER_RUN=${RANKS_PER_RUN:-2}
# Each rank's PyTorch takes its share of the cores (torchrun would give it one thread, and Open MPI binds each rank
# to one core unless told not to: the CPU's AdamW would run on one thread).
RANK_THREADS=$(( $(nproc) / RANKS_PER_RUN ))
launcher() { # RUN: the command that starts train_offload.py's ranks
    local threads="env ${ENVS[$1]:-} OMP_NUM_THREADS=$RANK_THREADS"
    case "${LAUNCH[$1]:-}" in
        torchrun) echo "$threads python3 -m torch.distributed.run --standalone --nproc-per-node $RANKS_PER_RUN" ;;
        mpirun) echo "$threads mpirun --allow-run-as-root --oversubscribe --bind-to none --mca plm_rsh_agent false -np $RANKS_PER_RUN -x OMP_NUM_THREADS -x PATH -x PYTHONPATH -x PYTORCH_CUDA_ALLOC_CONF -x NCCL_NVLS_ENABLE -x PYTHONUNBUFFERED python3" ;;
        *) echo "python3" ;;
    esac
}
RUNS=${RUNS:-"small_resident small_vfabric small_vfabric_gpu small_stream small_stream_recompute small_fsdp small_allocator large_resident large_vfabric large_vfabric_gpu large_stream_recompute large_fsdp large_allocator large_resident_accum16 large_vfabric_accum16"}
for r in $RUNS; do
    if [ -z "${ARGS[$r]:-}" ]; then
        echo "unknown run $r (known: ${!ARGS[*]})" | tee -a "$OUT/train.log"
        continue
    fi
    left=$((BUDGET_S - ($(date +%s) - T0)))
    if [ $left -lt 45 ]; then
        echo "SKIP $r: only $left s left" | tee -a "$OUT/train.log"
        continue
    fi
    t=${TMO[$r]}
    [ "$t" -gt "$left" ] && t=$left
    echo "=== $r (timeout $t s, at $(($(date +%s) - T0)) s)" | tee -a "$OUT/train.log"
    read -ra launch <<< "$(launcher "$r")"
    # shellcheck disable=SC2086
    timeout -s INT "$t" "${launch[@]}" "$here/train_offload.py" ${ARGS[$r]} --tag "$r" --json "$OUT/train.jsonl" \
        >> "$OUT/train.log" 2>&1
    rc=$?
    echo "=== $r rc=$rc at $(($(date +%s) - T0)) s" | tee -a "$OUT/train.log"
    grep "^RESULT" "$OUT/train.log" | tail -1 | grep "\"$r\"" | cut -c1-400 || tail -5 "$OUT/train.log"
done
echo "train: done at $(($(date +%s) - T0)) s"
