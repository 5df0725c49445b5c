// The driver's own host cost per launch on this machine, the floor under any Python launcher:
// bursts of 500 back-to-back launches of vector_add (3 pointers + 1 int, 1 block of 128 threads;
// the kernel of benchmarks/bench_runtime_launch.py), no sync inside a burst; median, min and max
// over 40 bursts. Build and run on the GPU machine:
//   nvcc -cubin -arch=sm_90 -o va.cubin va.cu   (va.cu: that kernel's source)
//   gcc -O2 -I/usr/local/cuda/include launch_floor.c -o floor -L/usr/local/cuda/lib64/stubs -lcuda
//   ./floor va.cubin
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#define CK(x) do { CUresult r = (x); if (r != CUDA_SUCCESS) { printf("%s failed: %d\n", #x, r); exit(1); } } while (0)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void* a, const void* b) { double x = *(double*)a, y = *(double*)b; return (x > y) - (x < y); }
int main(int argc, char** argv) {
  CK(cuInit(0)); CUdevice dev; CK(cuDeviceGet(&dev, 0)); CUcontext ctx; CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  FILE* f = fopen(argv[1], "rb"); fseek(f, 0, SEEK_END); long n = ftell(f); fseek(f, 0, SEEK_SET);
  char* image = malloc(n);
  if (fread(image, 1, n, f) != (size_t)n) { printf("short read\n"); return 1; }
  fclose(f);
  CUmodule mod; CK(cuModuleLoadData(&mod, image)); CUfunction fn; CK(cuModuleGetFunction(&fn, mod, "vector_add"));
  CUdeviceptr a, b, o; CK(cuMemAlloc(&a, 512)); CK(cuMemAlloc(&b, 512)); CK(cuMemAlloc(&o, 512));
  int count = 128; void* params[] = {&a, &b, &o, &count};
  CUstream stream; CK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
  const int launches = 500, reps = 40; double t[reps];
  const char* names[] = {"cuLaunchKernel, default stream", "cuLaunchKernel, created stream", "cuLaunchKernelEx, created stream", "cuLaunchKernelEx + cuCtxGetCurrent"};
  for (int mode = 0; mode < 4; ++mode) {
    for (int r = -3; r < reps; ++r) {
      CK(cuCtxSynchronize());
      double s = now();
      for (int i = 0; i < launches; ++i) {
        if (mode == 0) CK(cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, 0, params, 0));
        else if (mode == 1) CK(cuLaunchKernel(fn, 1, 1, 1, 128, 1, 1, 0, stream, params, 0));
        else {
          if (mode == 3) { CUcontext cur; CK(cuCtxGetCurrent(&cur)); }
          CUlaunchConfig cfg = {0}; cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1; cfg.blockDimX = 128; cfg.blockDimY = cfg.blockDimZ = 1;
          cfg.hStream = stream; CK(cuLaunchKernelEx(&cfg, fn, params, 0));
        }
      }
      double e = (now() - s) / launches * 1e6;
      if (r >= 0) t[r] = e;
    }
    CK(cuCtxSynchronize());
    qsort(t, reps, sizeof(double), cmp);
    printf("| %s | %.2f | %.2f | %.2f |\n", names[mode], t[reps / 2], t[0], t[reps - 1]);
  }
  return 0;
}
