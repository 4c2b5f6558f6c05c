#!/usr/bin/env bash
# First look at the GPU machine: topology, tool versions, PTX build of the kernels, the kernel-variant sweep.
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/vfabric-out}; mkdir -p "$OUT"
{
nvidia-smi -L; nvidia-smi topo -m; nvcc --version | tail -2; nproc; free -g | head -2
nvcc -ptx -arch=compute_90 transport/kernels/page_copy.cu -o "$OUT/page_copy.ptx" && echo "ptx ok: $(wc -c < "$OUT/page_copy.ptx") bytes"
nvcc -cubin -arch=sm_90 -Xptxas -v transport/kernels/page_copy.cu -o /tmp/pc.cubin 2>&1 | tail -12
python3 bench/scripts/kernel_sweep.py
} 2>&1 | tee "$OUT/probe.log"
