/* AMX tile plumbing shared by the AMX kernels (gemm_amx.c, conv_amx.c): the CPU and OS check, and the
 * tile configuration (every tile 16 rows x 64 bytes: the kernels pad their operands to that shape). */
#ifndef INTTRAIN_AMX_TILES_H
#define INTTRAIN_AMX_TILES_H

#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* 1 when the CPU has AMX-TILE and AMX-INT8 and Linux lets this process use the tile registers (the
 * permission is per process; oneDNN asks for it too, asking twice is harmless). */
static inline int amx_check(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0;
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

/* Load the all-16x64 configuration into this thread's tile registers (call once per thread and region). */
__attribute__((target("amx-tile"))) static inline void amx_configure_16x64(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    /* not _tile_loadconfig: GCC 12's version tells the compiler it reads only the first 8 bytes, so the
       stores above may be dropped (an invalid configuration: SIGSEGV/SIGILL at LDTILECFG) */
    __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
}

#endif
