
#define FREE 0u
#define REQUEST 1u
#define RESPONSE 2u
#define STOP 3u
#define ALL_LANES 0xffffffffu
#define REQUEST_OFFSET 16u

__device__ __forceinline__ unsigned long long bswap64(unsigned long long x)
{
    const unsigned int lo = (unsigned int)x;
    const unsigned int hi = (unsigned int)(x >> 32);
    return ((unsigned long long)__byte_perm(lo, 0, 0x0123) << 32) | __byte_perm(hi, 0, 0x0123);
}

/* The 16 bytes of the 32 in `a` then `b` (little-endian) that start at byte `r`, reversed. */
__device__ __forceinline__ ulonglong2 reversed_window(ulonglong2 a, ulonglong2 b, unsigned int r)
{
    const unsigned long long x = r < 8 ? a.x : a.y;
    const unsigned long long y = r < 8 ? a.y : b.x;
    const unsigned long long z = r < 8 ? b.x : b.y;
    const unsigned int shift = (r & 7u) * 8u;
    const unsigned long long lo = shift ? (x >> shift) | (y << (64u - shift)) : x;
    const unsigned long long hi = shift ? (y >> shift) | (z << (64u - shift)) : y;
    return make_ulonglong2(bswap64(hi), bswap64(lo));
}

/* Writes the `len` bytes at `in` to `out` in reverse order, 16 bytes at a time; both are
   16-byte aligned. Output chunk j holds input bytes [len - 16 - 16j, len - 16j) reversed: the
   window at byte len % 16 of input chunks c0 - j and c0 - j + 1, c0 = len / 16 - 1. So the
   loads reach from the 16 bytes before `in` to the 16 after its last whole chunk (the slot's
   header and response area; the bytes they feed land past `len` in `out`). */
__device__ void reverse_payload(const unsigned char *in, unsigned char *out, unsigned int len)
{
    const ulonglong2 *src = (const ulonglong2 *)in;
    ulonglong2 *dst = (ulonglong2 *)out;
    const unsigned int chunks = (len + 15u) / 16u;
    const unsigned int r = len & 15u;
    int c = (int)(len / 16u) - 1;
    ulonglong2 above = __ldcv(&src[c + 1]);
    unsigned int j = 0;
    for (; j + 4u <= chunks; j += 4u, c -= 4) {
        const ulonglong2 in0 = __ldcv(&src[c]);
        const ulonglong2 in1 = __ldcv(&src[c - 1]);
        const ulonglong2 in2 = __ldcv(&src[c - 2]);
        const ulonglong2 in3 = __ldcv(&src[c - 3]);
        __stwt(&dst[j], reversed_window(in0, above, r));
        __stwt(&dst[j + 1u], reversed_window(in1, in0, r));
        __stwt(&dst[j + 2u], reversed_window(in2, in1, r));
        __stwt(&dst[j + 3u], reversed_window(in3, in2, r));
        above = in3;
    }
    for (; j < chunks; ++j, --c) {
        const ulonglong2 below = __ldcv(&src[c]);
        __stwt(&dst[j], reversed_window(below, above, r));
        above = below;
    }
}

extern "C" __global__ void reverse_requests(unsigned char *rings,
                                            unsigned long long channel_stride,
                                            unsigned int slot_stride,
                                            unsigned int slots,
                                            unsigned int max_len,
                                            unsigned int response_offset)
{
    const unsigned int lane = threadIdx.x;
    unsigned char *ring = rings + (unsigned long long)blockIdx.x * channel_stride;
    const unsigned int window = slots < 32u ? slots : 32u;
    unsigned int next = 0;
    for (;;) {
        /* Lane 0 alone waits for the oldest slot to be taken. */
        unsigned int first = FREE;
        if (lane == 0) {
            volatile unsigned long long *header =
                (volatile unsigned long long *)(ring + (unsigned long long)next * slot_stride);
            do {
                first = (unsigned int)*header;
            } while (first == FREE);
        }
        first = __shfl_sync(ALL_LANES, first, 0);
        if (first == STOP) {
            return;
        }
        /* Then each lane reads one header from the oldest on, and the run of requests from
           the oldest is answered together, until the oldest is not a request. */
        for (;;) {
            unsigned int at = next + lane;
            if (at >= slots) {
                at -= slots;
            }
            unsigned char *slot = ring + (unsigned long long)at * slot_stride;
            unsigned long long header = 0;
            if (lane < window) {
                header = *(volatile unsigned long long *)slot;
            }
            const unsigned int requests =
                __ballot_sync(ALL_LANES, (unsigned int)header == REQUEST);
            const unsigned int run = requests == ALL_LANES ? 32u : __ffs(~requests) - 1u;
            if (run == 0) {
                break;
            }
            __threadfence_system();
            if (lane < run) {
                const unsigned int len = (unsigned int)(header >> 32);
                reverse_payload(slot + REQUEST_OFFSET, slot + response_offset,
                                len < max_len ? len : max_len);
            }
            __threadfence_system();
            if (lane < run) {
                *(volatile unsigned long long *)slot = (header & ~0xffffffffull) | RESPONSE;
            }
            next += run;
            if (next >= slots) {
                next -= slots;
            }
        }
    }
}
