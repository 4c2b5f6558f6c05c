// vfabric lossy page codec: bf16 or fp32 pages packed to fp8 (e4m3) or int8 codes with one fp32 scale per group
// of 256 elements, and expanded back.
//
// A packed page of n elements is [n one-byte codes][n / 256 fp32 scales], from the start of its frame. The scale
// of a group is its largest magnitude over the code's largest value (448 for e4m3, 127 for int8); a group whose
// largest magnitude is at most 2^-100 (zeros among them) has scale 0 and codes 0. Values are multiplied by 448 / max (127 / max) and rounded to nearest, ties to
// even (e4m3: saturating; int8: clamped to [-127, 127]); expanding multiplies the code by the scale and rounds to
// the page's element type (bf16: to nearest even). The CPU reference (`transport/src/device/lossy.rs`) makes the
// same operations in the same order, so both give the same bytes.
//
// One warp handles one group: each lane 8 consecutive elements (16 bytes of bf16, 32 of fp32), the group's
// largest magnitude by a butterfly reduction, then 8 codes (one 8-byte store) per lane. Pages go from frame
// src_frames[p] of `src` to frame dst_frames[p] of `dst`, either of which may be pinned host memory mapped for
// the device, like the page copy kernel. Frames are `src_stride` and `dst_stride` bytes apart: a page on the
// values' side, a page or a slot of the packed tier (shorter than a page) on the packed side.
//
// Build: nvcc -ptx -arch=compute_90 page_codec.cu -o page_codec.ptx (scripts/device-run.sh checks the committed
// PTX).

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define GROUP 256
#define PER_LANE 8

// Element types and codes, as the mover passes them.
#define ELEM_BF16 0
#define ELEM_F32 1
#define CODE_FP8 0
#define CODE_INT8 1

__device__ __forceinline__ float bf16_to_f32(u16 b) { return __uint_as_float(((u32)b) << 16); }

// Round to nearest even; NaN stays NaN (quiet).
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (u16)(u >> 16);
}

__device__ __forceinline__ void load8(const unsigned char* page, u64 e, u32 elem, float v[PER_LANE]) {
    if (elem == ELEM_BF16) {
        uint4 w = *reinterpret_cast<const uint4*>(page + e * 2);
        u32 words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            v[2 * k] = bf16_to_f32((u16)(words[k] & 0xffffu));
            v[2 * k + 1] = bf16_to_f32((u16)(words[k] >> 16));
        }
    } else {
        const float4* p = reinterpret_cast<const float4*>(page + e * 4);
        float4 a = p[0], b = p[1];
        v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
        v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
}

__device__ __forceinline__ void store8(unsigned char* page, u64 e, u32 elem, const float v[PER_LANE]) {
    if (elem == ELEM_BF16) {
        uint4 w;
        w.x = (u32)f32_to_bf16(v[0]) | ((u32)f32_to_bf16(v[1]) << 16);
        w.y = (u32)f32_to_bf16(v[2]) | ((u32)f32_to_bf16(v[3]) << 16);
        w.z = (u32)f32_to_bf16(v[4]) | ((u32)f32_to_bf16(v[5]) << 16);
        w.w = (u32)f32_to_bf16(v[6]) | ((u32)f32_to_bf16(v[7]) << 16);
        *reinterpret_cast<uint4*>(page + e * 2) = w;
    } else {
        float4* p = reinterpret_cast<float4*>(page + e * 4);
        p[0] = make_float4(v[0], v[1], v[2], v[3]);
        p[1] = make_float4(v[4], v[5], v[6], v[7]);
    }
}

__device__ __forceinline__ unsigned char encode(float q, u32 code) {
    if (code == CODE_FP8) {
        unsigned short pair;
        // Two values at once; the upper byte takes the first operand, so the code of `q` is the lower one.
        asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(0.0f), "f"(q));
        return (unsigned char)(pair & 0xff);
    }
    float r = fminf(fmaxf(rintf(q), -127.0f), 127.0f);
    return (unsigned char)(signed char)(int)r;
}

__device__ __forceinline__ float decode(unsigned char c, u32 code) {
    if (code == CODE_FP8) {
        // Every e4m3 value is exact in fp16, and every fp16 in fp32.
        u32 halves;
        float f;
        asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(halves) : "h"((unsigned short)c));
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"((unsigned short)(halves & 0xffff)));
        return f;
    }
    return (float)(signed char)c;
}

extern "C" __global__ void __launch_bounds__(1024)
vf_lossy_pack(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
              const u32* __restrict__ src_frames, const u32* __restrict__ dst_frames, u64 page_bytes, u64 n_groups,
              u32 elem, u32 code, u64 src_stride, u64 dst_stride) {
    const u32 lane = threadIdx.x & 31;
    const u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    const u64 elem_bytes = elem == ELEM_BF16 ? 2 : 4;
    const u64 n = page_bytes / elem_bytes;
    const u64 groups_per_page = n / GROUP;
    const float top = code == CODE_FP8 ? 448.0f : 127.0f;
    for (u64 g = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < n_groups; g += warps) {
        const u64 p = g / groups_per_page;
        const u64 gi = g - p * groups_per_page;
        const unsigned char* s = src + (u64)src_frames[p] * src_stride;
        unsigned char* d = dst + (u64)dst_frames[p] * dst_stride;
        const u64 e = gi * GROUP + lane * PER_LANE;
        float v[PER_LANE];
        load8(s, e, elem, v);
        float m = 0.0f;
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) m = fmaxf(m, fabsf(v[k]));
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        // A group at most 2^-100 (LOSSY_TINY) is zeros: `top / m` would overflow.
        const bool tiny = !(m > __int_as_float(0x0d800000));
        const float inv = tiny ? 0.0f : top / m;
        u64 packed = 0;
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) packed |= (u64)encode(v[k] * inv, code) << (8 * k);
        *reinterpret_cast<u64*>(d + e) = packed;
        if (lane == 0) reinterpret_cast<float*>(d + n)[gi] = tiny ? 0.0f : m / top;
    }
}

extern "C" __global__ void __launch_bounds__(1024)
vf_lossy_unpack(const unsigned char* __restrict__ src, unsigned char* __restrict__ dst,
                const u32* __restrict__ src_frames, const u32* __restrict__ dst_frames, u64 page_bytes, u64 n_groups,
                u32 elem, u32 code, u64 src_stride, u64 dst_stride) {
    const u32 lane = threadIdx.x & 31;
    const u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    const u64 elem_bytes = elem == ELEM_BF16 ? 2 : 4;
    const u64 n = page_bytes / elem_bytes;
    const u64 groups_per_page = n / GROUP;
    for (u64 g = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); g < n_groups; g += warps) {
        const u64 p = g / groups_per_page;
        const u64 gi = g - p * groups_per_page;
        const unsigned char* s = src + (u64)src_frames[p] * src_stride;
        unsigned char* d = dst + (u64)dst_frames[p] * dst_stride;
        const u64 e = gi * GROUP + lane * PER_LANE;
        const float scale = reinterpret_cast<const float*>(s + n)[gi];
        const u64 packed = *reinterpret_cast<const u64*>(s + e);
        float v[PER_LANE];
#pragma unroll
        for (int k = 0; k < PER_LANE; ++k) v[k] = decode((unsigned char)(packed >> (8 * k)), code) * scale;
        store8(d, e, elem, v);
    }
}
