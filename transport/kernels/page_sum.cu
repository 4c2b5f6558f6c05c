// vfabric page checksums on the GPU: one 64-bit sum per page, the same value the CPU's reference gives
// (`transport/src/device/page_sum.rs`), so a page moved GPU to GPU (NCCL) is checked at both ends without
// leaving device memory.
//
// Word i of a page (8 bytes, little-endian) counts mix(w + (i + 1) * GOLDEN), mix being splitmix64's
// finalizer; the page's sum is the wrapping sum of its words' counts. Addition does not care about order, so
// blocks and warps add their parts in any order (atomicAdd) and the result is exact; the position in the mix
// makes a moved or swapped word change it.
//
// `blocks_per_page` blocks share each page: block b sums part b % blocks_per_page of page b / blocks_per_page,
// whose device address is pages[b / blocks_per_page]. `sums` must be zeroed before the launch.
//
// Build: nvcc -ptx -arch=compute_90 page_sum.cu -o page_sum.ptx (scripts/device-run.sh checks the committed
// PTX).

typedef unsigned long long u64;
typedef unsigned int u32;

#define GOLDEN 0x9E3779B97F4A7C15ULL

__device__ __forceinline__ u64 mix(u64 x) {
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return x;
}

extern "C" __global__ void vf_page_sums(const u64* __restrict__ pages, u64 page_bytes, u32 blocks_per_page,
                                        u64* __restrict__ sums) {
    const u64 page = blockIdx.x / blocks_per_page;
    const u64 part = blockIdx.x % blocks_per_page;
    const ulonglong2* w = (const ulonglong2*)pages[page];
    const u64 pairs = page_bytes / 16;
    const u64 step = (u64)blocks_per_page * blockDim.x;
    u64 acc = 0;
    for (u64 i = part * blockDim.x + threadIdx.x; i < pairs; i += step) {
        const ulonglong2 v = __ldg(&w[i]);
        acc += mix(v.x + (2 * i + 1) * GOLDEN) + mix(v.y + (2 * i + 2) * GOLDEN);
    }
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if ((threadIdx.x & 31) == 0) atomicAdd(&sums[page], acc);
}
