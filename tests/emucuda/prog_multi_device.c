/*
 * prog_multi_device: two emulated devices (run with EMUCUDA_DEVICES=2).  cudaSetDevice switches,
 * a free of a device-1 pointer while device 0 is current, peer access enabled both ways, one
 * thread per device allocating concurrently, and VMM physical memory created on device 1 while
 * device 0 is current (then mapped).  Every call logs its op= line (testlog.h).
 */
#include <pthread.h>
#include <string.h>

#include "cuda.h"
#include "cuda_runtime.h"
#include "testlog.h"

static void *on_device(int dev, size_t size)
{
    void *p = NULL;
    MUST(cudaSetDevice(dev));
    ALLOC("cudaMalloc", "device", cudaMalloc(&p, size), p, size, dev, 0);
    return p;
}

static void *worker(void *arg)
{
    int dev = (int)(long)arg;
    MUST(cudaSetDevice(dev));
    for (int i = 0; i < 3; i++) {
        void *p = NULL;
        size_t size = (size_t)(dev + 1) * MiB + (size_t)i * 4096;
        ALLOC("cudaMalloc", "device", cudaMalloc(&p, size), p, size, dev, 0);
        if (i < 2)
            FREE("cudaFree", "device", cudaFree(p), p, 0);
    }
    return NULL;
}

static void vmm_on_device_1(void)
{
    CUmemAllocationProp prop;
    CUmemGenericAllocationHandle h = 0;
    CUdeviceptr va = 0;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 1;
    MUST(cudaSetDevice(0)); /* the physical memory goes to device 1 all the same */
    ALLOC("cuMemCreate", "vmm_physical", cuMemCreate(&h, 4 * MiB, &prop, 0), h, 4 * MiB, 1, 0);
    ALLOC("cuMemAddressReserve", "vmm_reserved", cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0), va, 8 * MiB, -1, 0);
    MAP(cuMemMap(va, 4 * MiB, 0, h, 0), va, 4 * MiB, h, 0);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    int n = 0, can = 0;
    MUST(cudaGetDeviceCount(&n));
    if (n < 2) {
        fprintf(stderr, "EMUCUDA-TEST-FAILURE: needs EMUCUDA_DEVICES=2\n");
        return 1;
    }
    void *a = on_device(0, 10 * MiB);
    void *b = on_device(1, 20 * MiB);
    void *c = on_device(0, 30 * MiB);
    MUST(cudaSetDevice(0));
    FREE("cudaFree", "device", cudaFree(b), b, 0); /* device 1's memory, freed from device 0 */
    MUST(cudaDeviceCanAccessPeer(&can, 0, 1));
    MUST(cudaDeviceEnablePeerAccess(1, 0));
    MUST(cudaSetDevice(1));
    MUST(cudaDeviceEnablePeerAccess(0, 0));
    pthread_t t0, t1;
    pthread_create(&t0, NULL, worker, (void *)0L);
    pthread_create(&t1, NULL, worker, (void *)1L);
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    vmm_on_device_1();
    (void)a;
    (void)c;
    printf("done can_access_peer=%d\n", can);
    return 0;
}
