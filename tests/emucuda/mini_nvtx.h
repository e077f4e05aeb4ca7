/*
 * mini_nvtx.h: the smallest NVTX client that follows NVTX's injection protocol, written for
 * gpumemtrace's tests (not NVIDIA's header; same ABI for the parts used here).
 *
 * At the first NVTX call: dlopen($NVTX_INJECTION64_PATH), dlsym("InitializeInjectionNvtx2"),
 * call it with our nvtxGetExportTable. Export table 1 (callbacks) has GetModuleFunctionTable,
 * which hands the tool, per module (1 = CORE, 5 = CORE2/domains), an array whose entry i is
 * the address of the function-pointer slot of callback id i. The tool overwrites slots; the
 * ones it leaves stay no-ops. Without an injection library every call is a no-op.
 */
#ifndef MINI_NVTX_H
#define MINI_NVTX_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

typedef void (*mnvtx_fn)(void);
typedef struct {
    uint16_t version, size;
    uint32_t category;
    int32_t colorType;
    uint32_t color;
    int32_t payloadType, reserved0;
    uint64_t payload;
    int32_t messageType;
    const void *message;
} nvtxEventAttributes_t;
#define NVTX_MESSAGE_TYPE_ASCII 1
#define NVTX_MESSAGE_TYPE_REGISTERED 3

typedef int (*mnvtx_push_a)(const char *);
typedef int (*mnvtx_push_ex)(const nvtxEventAttributes_t *);
typedef int (*mnvtx_pop)(void);
typedef void (*mnvtx_mark_a)(const char *);
typedef int (*mnvtx_dpush_ex)(void *, const nvtxEventAttributes_t *);
typedef int (*mnvtx_dpop)(void *);
typedef const void *(*mnvtx_register_a)(void *, const char *);

/* Slots (callback ids): CORE MarkA=2, RangePushEx=8, RangePushA=9, RangePop=11;
 * CORE2 DomainRangePushEx=4, DomainRangePop=5, DomainRegisterStringA=10. */
#define MNVTX_CORE_SIZE 16
#define MNVTX_CORE2_SIZE 16
static mnvtx_fn mnvtx_core[MNVTX_CORE_SIZE];
static mnvtx_fn mnvtx_core2[MNVTX_CORE2_SIZE];
static mnvtx_fn *mnvtx_core_table[MNVTX_CORE_SIZE + 1];
static mnvtx_fn *mnvtx_core2_table[MNVTX_CORE2_SIZE + 1];
static int mnvtx_state; /* 0 fresh, 1 initialized */

static int mnvtx_get_module_table(int module, mnvtx_fn ***table, unsigned *size)
{
    if (module == 1) {
        *table = mnvtx_core_table;
        *size = MNVTX_CORE_SIZE - 1;
        return 1;
    }
    if (module == 5) {
        *table = mnvtx_core2_table;
        *size = MNVTX_CORE2_SIZE - 1;
        return 1;
    }
    return 0;
}

static struct {
    size_t struct_size;
    int (*GetModuleFunctionTable)(int, mnvtx_fn ***, unsigned *);
} mnvtx_callbacks = {sizeof(mnvtx_callbacks), mnvtx_get_module_table};

static const void *mnvtx_get_export_table(uint32_t id) { return id == 1 ? (const void *)&mnvtx_callbacks : NULL; }

static void mnvtx_init(void)
{
    const char *path;
    void *lib;
    int (*init)(const void *(*)(uint32_t));
    int i;
    if (mnvtx_state)
        return;
    mnvtx_state = 1;
    for (i = 0; i < MNVTX_CORE_SIZE; i++)
        mnvtx_core_table[i] = i ? &mnvtx_core[i] : NULL;
    for (i = 0; i < MNVTX_CORE2_SIZE; i++)
        mnvtx_core2_table[i] = i ? &mnvtx_core2[i] : NULL;
    path = getenv("NVTX_INJECTION64_PATH");
    if (!path || !(lib = dlopen(path, RTLD_LAZY)))
        return;
    *(void **)&init = dlsym(lib, "InitializeInjectionNvtx2");
    if (!init || !init(mnvtx_get_export_table)) {
        for (i = 0; i < MNVTX_CORE_SIZE; i++)
            mnvtx_core[i] = NULL;
        for (i = 0; i < MNVTX_CORE2_SIZE; i++)
            mnvtx_core2[i] = NULL;
    }
}

static inline int nvtxRangePushA(const char *m)
{
    mnvtx_init();
    return mnvtx_core[9] ? ((mnvtx_push_a)mnvtx_core[9])(m) : -1;
}
static inline int nvtxRangePushEx(const nvtxEventAttributes_t *a)
{
    mnvtx_init();
    return mnvtx_core[8] ? ((mnvtx_push_ex)mnvtx_core[8])(a) : -1;
}
static inline int nvtxRangePop(void)
{
    mnvtx_init();
    return mnvtx_core[11] ? ((mnvtx_pop)mnvtx_core[11])() : -1;
}
static inline void nvtxMarkA(const char *m)
{
    mnvtx_init();
    if (mnvtx_core[2])
        ((mnvtx_mark_a)mnvtx_core[2])(m);
}
static inline const void *nvtxDomainRegisterStringA(void *d, const char *s)
{
    mnvtx_init();
    return mnvtx_core2[10] ? ((mnvtx_register_a)mnvtx_core2[10])(d, s) : NULL;
}
static inline int nvtxDomainRangePushEx(void *d, const nvtxEventAttributes_t *a)
{
    mnvtx_init();
    return mnvtx_core2[4] ? ((mnvtx_dpush_ex)mnvtx_core2[4])(d, a) : -1;
}
static inline int nvtxDomainRangePop(void *d)
{
    mnvtx_init();
    return mnvtx_core2[5] ? ((mnvtx_dpop)mnvtx_core2[5])(d) : -1;
}

#endif
