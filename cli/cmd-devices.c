/* cmd-devices.c: `toy devices`: the compute devices this toy can use (the
 * CPU, and each CUDA GPU when built with CUDA=1). */
#include <stdio.h>
#include <string.h>

#include "toy/toy.h"
#include "commands.h"

int toy_cmd_devices(int argc, char **argv) {
    bool json = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: toy devices [--json]\n\nLists the devices graphs can run on: name (as --device takes it),\n"
                   "memory, compute capability. CUDA devices need a build with make CUDA=1.\n");
            return 0;
        } else {
            fprintf(stderr, "toy devices: unknown flag %s\n", argv[i]);
            return 2;
        }
    }
    struct toy_device_info dev[65];
    int n = 0;
    if (toy_device_list(dev, 65, &n)) {
        fprintf(stderr, "toy devices: %s\n", toy_last_error());
        return 1;
    }
    if (json) {
        printf("{\"cuda_built\":%s,\"devices\":[", toy_cuda_built() ? "true" : "false");
        for (int i = 0; i < n; i++)
            printf("%s{\"name\":\"%s\",\"description\":\"%s\",\"memory_bytes\":%zu,\"free_bytes\":%zu,"
                   "\"compute_capability\":\"%d.%d\",\"multiprocessors\":%d}",
                   i ? "," : "", dev[i].name, dev[i].description, dev[i].total_memory, dev[i].free_memory,
                   dev[i].cc_major, dev[i].cc_minor, dev[i].multiprocessors);
        const char *note = toy_blas_core_note();
        printf("],\"blas_core\":\"%s\",\"blas_note\":%s%s%s,\"bf16_gemm\":\"%s\",\"f32_gemm\":\"%s\"}\n", toy_blas_core(),
               note ? "\"" : "", note ? note : "null", note ? "\"" : "", toy_cpu_bf16_gemm(), toy_cpu_f32_gemm());
        return 0;
    }
    printf("%-8s %-28s %12s %12s %s\n", "device", "name", "memory", "free", "compute");
    for (int i = 0; i < n; i++) {
        if (!dev[i].total_memory) { /* the CPU: its kernels' choices in words, no memory columns */
            printf("%-8s %s\n", dev[i].name, dev[i].description);
            continue;
        }
        printf("%-8s %-28s %9.1f GiB %9.1f GiB %d.%d (%d SMs)\n", dev[i].name, dev[i].description,
               (double)dev[i].total_memory / 1073741824.0, (double)dev[i].free_memory / 1073741824.0,
               dev[i].cc_major, dev[i].cc_minor, dev[i].multiprocessors);
    }
    if (toy_blas_core_note()) printf("\nOpenBLAS %s: %s\n", toy_blas_core(), toy_blas_core_note());
    if (!toy_cuda_built())
        printf("\nCUDA: not built in (rebuild with make CUDA=1 to use NVIDIA GPUs)\n");
    else if (n == 1)
        printf("\nCUDA: built in, but no usable CUDA device was found\n");
    return 0;
}
