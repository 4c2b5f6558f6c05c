// vfabric SM gather/scatter page copy.
//
// Copies whole pages between two frame arenas that are mapped once (device memory of this GPU, of a peer GPU over
// NVLink, or pinned host memory mapped for the device). Page p goes from frame src_frames[p] of `src` to frame
// dst_frames[p] of `dst`. Each page is split into chunks of `words_per_chunk` 16-byte words; one block copies one
// chunk at a time, so a batch of a few large pages still spreads over every block that the launch was given.
//
// Why a kernel at all: one copy-engine call per scattered page reaches 232 GB/s (2 MiB pages) and 20-62 GB/s
// (64 KiB pages) over NVLink on the H200s; an SM copy reaches the link's rate at any page size. The grid size is
// the mover's SM budget: the launch takes exactly `gridDim.x` blocks of up to 1024 threads.
//
// Build: nvcc -ptx -arch=compute_90 page_copy.cu -o page_copy.ptx (scripts/device-run.sh checks the committed PTX).

typedef unsigned long long u64;
typedef unsigned int u32;

template <int UNROLL>
__device__ __forceinline__ void copy_chunk(const uint4* __restrict__ s, uint4* __restrict__ d, u32 words) {
    u32 i = threadIdx.x;
    const u32 step = blockDim.x;
    // UNROLL independent 16-byte loads in flight per thread before the stores: a peer read over NVLink takes
    // microseconds, so bytes in flight per SM, not instructions, bound the rate.
    for (; i + (UNROLL - 1) * step < words; i += UNROLL * step) {
        uint4 v[UNROLL];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) v[k] = s[i + k * step];
#pragma unroll
        for (int k = 0; k < UNROLL; ++k) d[i + k * step] = v[k];
    }
    for (; i < words; i += step) d[i] = s[i];
}

template <int UNROLL>
__device__ __forceinline__ void page_copy(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                          const u32* __restrict__ src_frames, const u32* __restrict__ dst_frames,
                                          u64 n_items, u32 chunks_per_page, u32 words_per_chunk) {
    const u64 words_per_page = (u64)chunks_per_page * words_per_chunk;
    for (u64 item = blockIdx.x; item < n_items; item += gridDim.x) {
        const u64 p = item / chunks_per_page;
        const u64 c = item - p * chunks_per_page;
        const u64 off_s = (u64)src_frames[p] * words_per_page + c * words_per_chunk;
        const u64 off_d = (u64)dst_frames[p] * words_per_page + c * words_per_chunk;
        copy_chunk<UNROLL>(src + off_s, dst + off_d, words_per_chunk);
    }
}

extern "C" __global__ void __launch_bounds__(1024)
vf_page_copy(const uint4* __restrict__ src, uint4* __restrict__ dst, const u32* __restrict__ src_frames,
             const u32* __restrict__ dst_frames, u64 n_items, u32 chunks_per_page, u32 words_per_chunk) {
    page_copy<4>(src, dst, src_frames, dst_frames, n_items, chunks_per_page, words_per_chunk);
}

// Page index lists short enough to travel in the launch's parameters (4 KiB in all, the limit on every CUDA
// version): no copy of the lists to the device comes before the kernel, which a small batch cannot hide (a
// 16 MiB batch over NVLink takes 45 us). `__grid_constant__` lets the kernel read them where they are, in the
// parameter space, instead of each thread copying them to its own stack.
#define VF_SHORT_PAGES 480
struct ShortLists {
    u32 src[VF_SHORT_PAGES];
    u32 dst[VF_SHORT_PAGES];
};

extern "C" __global__ void __launch_bounds__(1024)
vf_page_copy_short(const uint4* __restrict__ src, uint4* __restrict__ dst, u64 n_items, u32 chunks_per_page,
                   u32 words_per_chunk, const __grid_constant__ ShortLists lists) {
    page_copy<4>(src, dst, lists.src, lists.dst, n_items, chunks_per_page, words_per_chunk);
}

extern "C" __global__ void __launch_bounds__(1024)
vf_page_copy_u1(const uint4* __restrict__ src, uint4* __restrict__ dst, const u32* __restrict__ src_frames,
                const u32* __restrict__ dst_frames, u64 n_items, u32 chunks_per_page, u32 words_per_chunk) {
    page_copy<1>(src, dst, src_frames, dst_frames, n_items, chunks_per_page, words_per_chunk);
}

extern "C" __global__ void __launch_bounds__(1024)
vf_page_copy_u8(const uint4* __restrict__ src, uint4* __restrict__ dst, const u32* __restrict__ src_frames,
                const u32* __restrict__ dst_frames, u64 n_items, u32 chunks_per_page, u32 words_per_chunk) {
    page_copy<8>(src, dst, src_frames, dst_frames, n_items, chunks_per_page, words_per_chunk);
}
