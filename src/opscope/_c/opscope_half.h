/* float16 and bfloat16 to float32, exactly: the one definition shared by the dump's statistics
 * kernel (capture/torch/native/_c/fastats_kernel.h, so also the native dump observer) and the
 * monitor's batched kernel (monitor/_c/monstats.c). Both are built with this folder on their
 * include path: setup.py for the C extensions, capture/torch/native/build.py for the C++ ones
 * built at first use. Plain C, valid C++. */
#ifndef OPSCOPE_HALF_H
#define OPSCOPE_HALF_H
#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Without F16C (the portable path; the kernels convert blocks with F16C where they can). */
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}
#endif
