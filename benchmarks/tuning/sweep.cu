// Standalone sweep of launch shapes and math variants for the gated activations and rms_norm:
// the experiments behind benchmarks/TUNING.md, not library code (the kernels here are reduced
// copies, without argument checks or strides). Run: benchmarks/tuning/run.sh [prefetch]
// PART 0: bf16 activations, 1: fp32 activations, 2/3: bf16 rms/fused, 4/5: fp32 rms/fused.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); exit(1);} } while (0)

using bf16 = __nv_bfloat16;
__device__ __forceinline__ float tf(float v) { return v; }
__device__ __forceinline__ float tf(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float tf(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T ff(float v) {
  if constexpr (std::is_same_v<T, float>) return v;
  else if constexpr (std::is_same_v<T, bf16>) return __float2bfloat16_rn(v);
  else return __float2half_rn(v);
}
template <typename T> struct alignas(16) V { static constexpr int N = 16 / sizeof(T); T v[N]; };

// ------------------------------------------------------------------ activations
// kAct: 0 silu, 1 gelu A&S+normcdff (current), 2 gelu erfcc (NR), 3 gelu 0.5(1+erff), 4 tanh
template <int kAct, bool kHalf>
__device__ __forceinline__ float Act(float x) {
  if constexpr (kAct == 0) return __fdividef(x, 1.0f + __expf(-x));
  if constexpr (kAct == 1) {
    if constexpr (kHalf) {
      if (x > -3.0f) {
        const float z = fabsf(x) * 0.7071067811865476f;
        const float t = __fdividef(1.0f, 1.0f + 0.3275911f * z);
        const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f + t * 1.061405429f))));
        const float h = 0.5f * poly * __expf(-z * z);
        return x * (x < 0.0f ? h : 1.0f - h);
      }
    }
    return x * normcdff(x);
  }
  if constexpr (kAct == 2) {
    const float z = fabsf(x) * 0.7071067811865476f;
    const float t = __fdividef(1.0f, 1.0f + 0.5f * z);
    const float p = -1.26551223f + t * (1.00002368f + t * (0.37409196f + t * (0.09678418f + t * (-0.18628806f + t * (0.27886807f + t * (-1.13520398f + t * (1.48851587f + t * (-0.82215223f + t * 0.17087277f))))))));
    float e;
    if constexpr (kHalf) e = __expf(fmaf(-z, z, p));
    else { const float zz = z * z; e = expf(p - zz) * (1.0f - fmaf(z, z, -zz)); }
    const float h = 0.5f * t * e;  // Phi(-|x|)
    return x * (x < 0.0f ? h : 1.0f - h);
  }
  if constexpr (kAct == 3) return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
  const float inner = 0.7978845608028654f * x * (1.0f + 0.044715f * x * x);
  if constexpr (kHalf) return __fdividef(x, 1.0f + __expf(-2.0f * inner));
  return 0.5f * x * (1.0f + tanhf(inner));
}

template <typename T, int kAct, int U, int kMinBlocks>
__global__ void __launch_bounds__(256, kMinBlocks) ActK(T* __restrict__ out, const T* __restrict__ x, int64_t rows, int64_t d) {
  using Vc = V<T>;
  constexpr int N = Vc::N;
  const int64_t per_row = d / N;
  const int64_t chunk = int64_t{U} * blockDim.x;
  for (int64_t r = int64_t{blockIdx.y} * blockDim.y + threadIdx.y; r < rows; r += int64_t{gridDim.y} * blockDim.y) {
    const Vc* g = reinterpret_cast<const Vc*>(x + r * 2 * d);
    const Vc* u = reinterpret_cast<const Vc*>(x + r * 2 * d + d);
    Vc* o = reinterpret_cast<Vc*>(out + r * d);
    for (int64_t base = int64_t{blockIdx.x} * chunk + threadIdx.x; base < per_row; base += int64_t{gridDim.x} * chunk) {
      Vc gv[U], uv[U];
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t j = base + int64_t{k} * blockDim.x;
        if (j < per_row) { gv[k] = g[j]; uv[k] = u[j]; }
      }
#pragma unroll
      for (int k = 0; k < U; ++k) {
        const int64_t j = base + int64_t{k} * blockDim.x;
        if (j < per_row) {
          Vc res;
#pragma unroll
          for (int i = 0; i < N; ++i) res.v[i] = ff<T>(Act<kAct, sizeof(T) == 2>(tf(gv[k].v[i])) * tf(uv[k].v[i]));
          o[j] = res;
        }
      }
    }
  }
}

template <typename T, int kAct, int U, int kMinBlocks>
void LaunchAct(T* out, const T* x, int64_t rows, int64_t d) {
  constexpr int N = 16 / sizeof(T);
  const int64_t per_row = d / N;
  const int64_t tx = std::min<int64_t>(256, (per_row / U + 31) / 32 * 32);
  const int64_t rpb = 256 / tx;
  dim3 grid((per_row + U * tx - 1) / (U * tx), std::min<int64_t>((rows + rpb - 1) / rpb, 65535));
  ActK<T, kAct, U, kMinBlocks><<<grid, dim3(tx, rpb)>>>(out, x, rows, d);
}

// ------------------------------------------------------------------ rms_norm
__device__ __forceinline__ float RowSum(float v) {
  __shared__ float partials[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const unsigned wpr = blockDim.x / 32;
  const unsigned w = threadIdx.y * wpr + threadIdx.x / 32;
  __syncthreads();
  if (threadIdx.x % 32 == 0) partials[w] = v;
  __syncthreads();
  float s = 0;
  for (unsigned i = 0; i < wpr; ++i) s += partials[threadIdx.y * wpr + i];
  return s;
}

__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" :: "l"(p), "r"(bytes) : "memory");
}
int64_t g_prefetch = 0;
template <typename T, int K, int B, int M, bool kFused>
__global__ void __launch_bounds__(B, M) NormK(T* __restrict__ x, T* __restrict__ res, const T* __restrict__ w, T* __restrict__ out, int64_t rows, int64_t d, float eps, int64_t pf) {
  using Vc = V<T>;
  constexpr int N = Vc::N;
  const int nvec = static_cast<int>(d / N);
  for (int64_t row0 = int64_t{blockIdx.x} * blockDim.y; row0 < rows; row0 += int64_t{gridDim.x} * blockDim.y) {
    const int64_t row = row0 + threadIdx.y;
    const bool active = row < rows;
    if (pf > 0 && threadIdx.x == 0 && row + pf < rows) {
      PrefetchL2(x + (row + pf) * d, static_cast<uint32_t>(d * sizeof(T)));
      if constexpr (kFused) PrefetchL2(res + (row + pf) * d, static_cast<uint32_t>(d * sizeof(T)));
    }
    Vc s[K];
    float ss = 0;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (active && j < nvec) {
        if constexpr (kFused) {
          Vc xv = reinterpret_cast<const Vc*>(x + row * d)[j];
          s[k] = reinterpret_cast<const Vc*>(res + row * d)[j];
#pragma unroll
          for (int i = 0; i < N; ++i) { s[k].v[i] = ff<T>(tf(xv.v[i]) + tf(s[k].v[i])); const float f = tf(s[k].v[i]); ss += f * f; }
          reinterpret_cast<Vc*>(res + row * d)[j] = s[k];
        } else {
          s[k] = reinterpret_cast<const Vc*>(x + row * d)[j];
#pragma unroll
          for (int i = 0; i < N; ++i) { const float f = tf(s[k].v[i]); ss += f * f; }
        }
      }
    }
    const float inv = rsqrtf(RowSum(ss) / d + eps);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (active && j < nvec) {
        Vc wv = reinterpret_cast<const Vc*>(w)[j], o;
#pragma unroll
        for (int i = 0; i < N; ++i) o.v[i] = ff<T>(tf(s[k].v[i]) * inv * tf(wv.v[i]));
        reinterpret_cast<Vc*>((kFused ? x : out) + row * d)[j] = o;
      }
    }
  }
}

template <typename T, int K, int B, int M, bool kFused>
bool LaunchNorm(T* x, T* res, const T* w, T* out, int64_t rows, int64_t d) {
  constexpr int N = 16 / sizeof(T);
  const int64_t nvec = d / N;
  const int64_t threads = (nvec + K - 1) / K;
  if (threads > B || (K > 1 && (nvec + K - 2) / (K - 1) <= B && K != 1 && false)) return false;
  const int64_t tx = (threads + 31) / 32 * 32;
  const int64_t rpb = std::max<int64_t>(1, B / tx);
  const int64_t blocks = (rows + rpb - 1) / rpb;
  int per_sm = 0, sms = 0;
  cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, NormK<T, K, B, M, kFused>, int(tx * rpb), 0);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int64_t pf = g_prefetch * per_sm * sms * rpb;
  NormK<T, K, B, M, kFused><<<blocks, dim3(tx, rpb)>>>(x, res, w, out, rows, d, 1e-6f, pf);
  return true;
}

// ------------------------------------------------------------------ timing
float TimeMs(const std::function<void()>& f, int iters = 30) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a)); CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  CK(cudaGetLastError());
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a)); f(); CK(cudaEventRecord(b)); CK(cudaEventSynchronize(b));
    float ms; CK(cudaEventElapsedTime(&ms, a, b)); t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double g_copy_gbs = 0;
void Report(const char* what, const char* dtype, const char* shape, double bytes, float ms) {
  const double gbs = bytes / (ms * 1e-3) / 1e9;
  printf("%-34s %-5s %-11s %9.2f us %7.1f GB/s %5.1f%%\n", what, dtype, shape, ms * 1e3, gbs, 100 * gbs / g_copy_gbs);
}

template <typename T> const char* Name() { return std::is_same_v<T, float> ? "fp32" : "bf16"; }

template <typename T>
void Fill(T* p, size_t n) {
  std::vector<T> h(n);
  uint32_t s = 12345;
  for (size_t i = 0; i < n; ++i) { s = s * 1664525u + 1013904223u; float f = ((s >> 8) / 16777216.0f - 0.5f) * 6.0f; h[i] = static_cast<T>(f); }
  CK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T, int kAct, int U, int M>
void RunAct(const char* tag, T* out, T* x, int64_t rows, int64_t d2) {
  const int64_t d = d2 / 2;
  const double bytes = double(rows) * (d2 + d) * sizeof(T);
  char shape[32]; snprintf(shape, 32, "%ldx%ld", (long)rows, (long)d2);
  char what[64]; snprintf(what, 64, "%s U=%d M=%d", tag, U, M);
  Report(what, Name<T>(), shape, bytes, TimeMs([&] { LaunchAct<T, kAct, U, M>(out, x, rows, d); }));
}

template <typename T, int K, int B, int M, bool F>
void RunNorm(T* x, T* r, T* w, T* out, int64_t rows, int64_t d) {
  const double bytes = double(rows) * d * sizeof(T) * (F ? 4 : 2);
  char shape[32]; snprintf(shape, 32, "%ldx%ld", (long)rows, (long)d);
  char what[64]; snprintf(what, 64, "%s K=%d B=%d M=%d pf=%ld", F ? "fused" : "rms", K, B, M, (long)g_prefetch);
  bool ok = true;
  const float ms = TimeMs([&] { ok = LaunchNorm<T, K, B, M, F>(x, r, w, out, rows, d); }, 20);
  if (ok) Report(what, Name<T>(), shape, bytes, ms);
}

bool g_prefetch_sweep = false;  // argv[1] == "prefetch"

template <typename T, bool F>
void NormSweep(T* x, T* r, T* w, T* out, int64_t rows, int64_t d) {
  if (!g_prefetch_sweep) {  // kVecs x block threads x min blocks per SM (register cap)
#define NS(K) RunNorm<T, K, 256, 1, F>(x, r, w, out, rows, d); RunNorm<T, K, 256, 2, F>(x, r, w, out, rows, d); \
  RunNorm<T, K, 256, 4, F>(x, r, w, out, rows, d); RunNorm<T, K, 512, 1, F>(x, r, w, out, rows, d); \
  RunNorm<T, K, 512, 2, F>(x, r, w, out, rows, d); RunNorm<T, K, 1024, 1, F>(x, r, w, out, rows, d);
    NS(2) NS(4) NS(8) NS(16)
#undef NS
    return;
  }
  // The chosen shape, with an L2 bulk prefetch of the row that a block pf waves later reads.
  const int64_t nvec = d / (16 / sizeof(T));
  for (int64_t p : {0, 1, 2}) {
    g_prefetch = p;
    if (nvec <= 2048) { RunNorm<T, 4, 512, 2, F>(x, r, w, out, rows, d); }
    else if (sizeof(T) == 2) { RunNorm<T, 8, 512, 1, F>(x, r, w, out, rows, d); }
    else { RunNorm<T, 8, 512, 2, F>(x, r, w, out, rows, d); }
  }
  g_prefetch = 0;
}

int main(int argc, char** argv) {
  g_prefetch_sweep = argc > 1 && std::strcmp(argv[1], "prefetch") == 0;
  const size_t kBig = size_t{1} << 30;
  char *a, *b, *c, *dd;
  CK(cudaMalloc(&a, kBig)); CK(cudaMalloc(&b, kBig)); CK(cudaMalloc(&c, kBig)); CK(cudaMalloc(&dd, 1 << 20));
  {
    const float ms = TimeMs([&] { CK(cudaMemcpyAsync(b, a, kBig, cudaMemcpyDeviceToDevice)); }, 20);
    g_copy_gbs = 2.0 * kBig / (ms * 1e-3) / 1e9;
    printf("copy roof: %.1f GB/s (%.1f us for 1 GiB)\n", g_copy_gbs, ms * 1e3);
  }
#if PART == 0 || PART == 1
  // activations: x [rows, 2d]
  for (auto [rows, d2] : {std::pair<int64_t, int64_t>{16384, 8192}, {4096, 28672}, {128, 22016}}) {
    {
      using T = bf16;
      T* x = reinterpret_cast<T*>(a); T* o = reinterpret_cast<T*>(b);
      Fill(x, rows * d2);
#if PART == 0
      RunAct<T, 0, 1, 1>("silu", o, x, rows, d2); RunAct<T, 0, 2, 1>("silu", o, x, rows, d2); RunAct<T, 0, 4, 1>("silu", o, x, rows, d2);
      RunAct<T, 1, 1, 1>("gelu-AS", o, x, rows, d2); RunAct<T, 1, 2, 1>("gelu-AS", o, x, rows, d2); RunAct<T, 1, 4, 1>("gelu-AS", o, x, rows, d2);
      RunAct<T, 2, 1, 1>("gelu-erfcc", o, x, rows, d2); RunAct<T, 2, 2, 1>("gelu-erfcc", o, x, rows, d2); RunAct<T, 2, 4, 1>("gelu-erfcc", o, x, rows, d2);
      RunAct<T, 3, 1, 1>("gelu-erff", o, x, rows, d2); RunAct<T, 3, 2, 1>("gelu-erff", o, x, rows, d2); RunAct<T, 3, 4, 1>("gelu-erff", o, x, rows, d2);
      RunAct<T, 4, 1, 1>("tanh", o, x, rows, d2); RunAct<T, 4, 2, 1>("tanh", o, x, rows, d2); RunAct<T, 4, 4, 1>("tanh", o, x, rows, d2);
#endif
    }
#if PART == 1
    {
      using T = float;
      T* x = reinterpret_cast<T*>(a); T* o = reinterpret_cast<T*>(b);
      Fill(x, rows * d2);
      RunAct<T, 0, 1, 1>("silu", o, x, rows, d2); RunAct<T, 0, 2, 1>("silu", o, x, rows, d2); RunAct<T, 0, 4, 1>("silu", o, x, rows, d2);
      RunAct<T, 0, 1, 6>("silu", o, x, rows, d2); RunAct<T, 0, 2, 6>("silu", o, x, rows, d2);
      RunAct<T, 1, 1, 1>("gelu-AS", o, x, rows, d2); RunAct<T, 1, 2, 1>("gelu-AS", o, x, rows, d2); RunAct<T, 1, 4, 1>("gelu-AS", o, x, rows, d2);
      RunAct<T, 2, 1, 1>("gelu-erfcc", o, x, rows, d2); RunAct<T, 2, 2, 1>("gelu-erfcc", o, x, rows, d2); RunAct<T, 2, 4, 1>("gelu-erfcc", o, x, rows, d2);
      RunAct<T, 2, 2, 6>("gelu-erfcc", o, x, rows, d2);
      RunAct<T, 3, 1, 1>("gelu-erff", o, x, rows, d2); RunAct<T, 3, 2, 1>("gelu-erff", o, x, rows, d2);
      RunAct<T, 4, 1, 1>("tanh", o, x, rows, d2); RunAct<T, 4, 2, 1>("tanh", o, x, rows, d2); RunAct<T, 4, 4, 1>("tanh", o, x, rows, d2);
    }
#endif
  }
#endif
#if PART >= 2
  for (auto [rows, d] : {std::pair<int64_t, int64_t>{16384, 8192}, {4096, 16384}, {4096, 4096}, {16384, 4096}, {2048, 32768}}) {
#if PART == 2 || PART == 3
    using T = bf16;
#else
    using T = float;
#endif
    T* x = reinterpret_cast<T*>(a); T* r = reinterpret_cast<T*>(b); T* o = reinterpret_cast<T*>(c); T* w = reinterpret_cast<T*>(dd);
    Fill(x, rows * d); Fill(r, rows * d); Fill(w, d);
#if PART == 2 || PART == 4
    NormSweep<T, false>(x, r, w, o, rows, d);
#else
    NormSweep<T, true>(x, r, w, o, rows, d);
#endif
  }
#endif
  CK(cudaDeviceSynchronize());
  return 0;
}
