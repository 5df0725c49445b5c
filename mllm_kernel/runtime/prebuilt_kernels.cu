// Kernels the wheel ships precompiled (the cuda_cubin rule: a fatbin with a cubin per configured
// arch), launched by mllm_kernel.runtime.prebuilt_kernels through the driver API alone. They also
// serve as the check that load_cubin works where no compiler exists.

// y[i] = alpha * x[i] + beta * y[i] over n elements, grid-stride.
extern "C" __global__ void mllm_axpby_f32(const float* __restrict__ x, float* __restrict__ y, float alpha, float beta,
                                          long long n) {
  const long long stride = static_cast<long long>(gridDim.x) * blockDim.x;
  for (long long i = static_cast<long long>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    y[i] = alpha * x[i] + beta * y[i];
  }
}
