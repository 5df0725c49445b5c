// Times the prefill attention kernels alone (plan + attention kernel, no Python, no checks) on
// synthetic bf16 inputs, 32 query / 8 KV heads: the Hopper kernel by default, the mma.sync kernel
// with `mma`. Ragged, and paged with a shuffled block table. TFLOP/s as
// benchmarks/bench_prefill_attention.py counts them. The experiments behind RESULTS.md's
// "Prefill attention, Hopper path" steps: build a copy of kernels/prefill_attention with a change
// and point the include path at it (benchmarks/tuning/ab_prefill.sh does that with KERNELS=1).
//
//   prefill_kernels [mma] [pages | ROW...] [--list]
//
// Rows: a default set; `pages` sweeps block sizes 1 to 256 at head_dim 64/128/256; or rows given
// as HEAD_DIM:causal|full:BATCHxSEQ[:BLOCK_SIZE] (e.g. 128:causal:8x4096:16; no block size or 0:
// ragged). `--list` prints the rows without touching the GPU.
// Run: benchmarks/tuning/prefill_kernels.sh [KERNEL_DIR [ARGS...]]
#include "prefill_attention.cuh"
#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>
using namespace mllm_kernel;
namespace d = gpu::prefill_attention_detail;
namespace h = gpu::prefill_attention_sm90;
using T = device::bf16_t;

__global__ void Fill(T* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t v = (uint32_t)i * 2654435761u ^ seed;
    v ^= v >> 13; v *= 0x5bd1e995; v ^= v >> 15;
    x[i] = __float2bfloat16(((v & 0xFFFF) / 65536.f - 0.5f) * 2.f);
  }
}
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

template <int D>
void Run(int batch, int seq, bool causal, bool sm90, int bs = 0) {
  const int H = 32, KH = 8;
  const int64_t tokens = (int64_t)batch * seq;
  T *q, *k, *v, *out; float* lse; int32_t *cu, *ws; int64_t* err;
  CK(cudaMalloc(&q, tokens * H * D * 2)); CK(cudaMalloc(&k, tokens * KH * D * 2)); CK(cudaMalloc(&v, tokens * KH * D * 2));
  CK(cudaMalloc(&out, tokens * H * D * 2)); CK(cudaMalloc(&lse, tokens * H * 4));
  Fill<<<1024, 256>>>(q, tokens * H * D, 1); Fill<<<1024, 256>>>(k, tokens * KH * D, 2); Fill<<<1024, 256>>>(v, tokens * KH * D, 3);
  std::vector<int32_t> hcu(batch + 1); for (int i = 0; i <= batch; ++i) hcu[i] = i * seq;
  CK(cudaMalloc(&cu, (batch + 1) * 4)); CK(cudaMemcpy(cu, hcu.data(), (batch + 1) * 4, cudaMemcpyHostToDevice));
  CK(cudaMalloc(&ws, d::WorkspaceInts(tokens, batch) * 4 + 64)); CK(cudaMalloc(&err, 64)); CK(cudaMemset(err, 0, 64));
  int32_t *table = nullptr, *lens = nullptr;
  if (bs > 0) {  // paged: k/v reinterpreted as [blocks, bs, KH, D]; request i's pages in a shuffled order
    const int per = (seq + bs - 1) / bs;
    std::vector<int32_t> ht(batch * per), hl(batch, seq);
    for (int i = 0; i < batch * per; ++i) ht[i] = (int32_t)((i * 7919LL) % (batch * per));
    CK(cudaMalloc(&table, ht.size() * 4)); CK(cudaMemcpy(table, ht.data(), ht.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&lens, batch * 4)); CK(cudaMemcpy(lens, hl.data(), batch * 4, cudaMemcpyHostToDevice));
  }
  d::PrefillParams<T> p{};
  p.out = out; p.lse = lse; p.q = q; p.k = k; p.v = v; p.cu_q = cu; p.cu_k = cu; p.workspace = ws; p.error = err;
  p.q_stride = H * D; p.k_stride = KH * D; p.v_stride = KH * D; p.batch = batch; p.total_q = tokens; p.total_k = tokens;
  p.num_heads = H; p.num_kv_heads = KH; p.group = H / KH; p.max_work = d::MaxWork(tokens, batch);
  p.block_size = device::FastDivmod(1); p.q_scale = (1.f / sqrtf(D)) * 1.4426950408889634f; p.logit_scale = 1.f;
  p.causal = causal;
  if (bs > 0) {
    p.paged = true; p.block_table = table; p.seq_lens = lens; p.table_stride = (seq + bs - 1) / bs;
    p.num_blocks = tokens / bs; p.max_blocks = p.table_stride; p.max_keys = (int64_t)p.max_blocks * bs;
    p.k_stride = (int64_t)bs * KH * D; p.v_stride = p.k_stride; p.block_size = device::FastDivmod(bs);
  }
  // Through the library's own dispatch (plan kernel, then the kernel MLLM_KERNEL_PREFILL_BACKEND
  // names, with its grid, threads and shared memory), on the default stream.
  setenv("MLLM_KERNEL_PREFILL_BACKEND", sm90 ? "sm90" : "fa2", 1);
  const DLDevice device{kDLCUDA, 0};
  auto launch = [&] {
    if (bs > 0) d::LaunchPrefill<T, D, true>(p, device);
    else d::LaunchPrefill<T, D, false>(p, device);
  };
  launch(); CK(cudaDeviceSynchronize());
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> ms;
  const int iters = std::max(1, (int)(4e9 / ((double)tokens * seq * D)));
  for (int g = 0; g < 7; ++g) {
    cudaEventRecord(a); for (int i = 0; i < iters; ++i) launch(); cudaEventRecord(b); CK(cudaEventSynchronize(b));
    float t; cudaEventElapsedTime(&t, a, b); ms.push_back(t / iters);
  }
  std::sort(ms.begin(), ms.end());
  const double flops = 4.0 * batch * (double)seq * seq * D * H / (causal ? 2 : 1);
  printf("D=%d %s %dx%d %s bs=%d: %.3f ms %.0f TFLOP/s\n", D, causal ? "causal" : "full", batch, seq, sm90 ? "sm90" : "mma", bs, ms[3], flops / ms[3] / 1e9);
  cudaFree(table); cudaFree(lens); cudaFree(q); cudaFree(k); cudaFree(v); cudaFree(out); cudaFree(lse); cudaFree(cu); cudaFree(ws); cudaFree(err);
}

struct Row {
  int head_dim, batch, seq, block_size;
  bool causal;
};

// HEAD_DIM:causal|full:BATCHxSEQ[:BLOCK_SIZE]; false unless the whole string is one.
bool ParseRow(const std::string& text, Row* row) {
  char mask[8] = {};
  int used = 0;
  row->block_size = 0;
  const int got = sscanf(text.c_str(), "%d:%7[a-z]:%dx%d%n:%d%n", &row->head_dim, mask, &row->batch, &row->seq, &used,
                         &row->block_size, &used);
  row->causal = std::string(mask) == "causal";
  return got >= 4 && used == (int)text.size() && (row->causal || std::string(mask) == "full") &&
         (row->head_dim == 64 || row->head_dim == 128 || row->head_dim == 256) && row->batch > 0 && row->seq > 0 &&
         row->block_size >= 0;
}

int main(int argc, char** argv) {
  bool mma = false, list = false;
  std::vector<Row> rows;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    Row row;
    if (arg == "mma") {
      mma = true;
    } else if (arg == "--list") {
      list = true;
    } else if (arg == "pages") {  // 1 and 8 copy by cp.async, 32 and up by TMA boxes
      for (int bs : {1, 8, 16, 32, 64, 128, 256}) rows.insert(rows.end(), {{128, 2, 16384, bs, false}, {128, 8, 4096, bs, true}});
      for (int bs : {1, 16, 64}) {
        rows.insert(rows.end(), {{64, 8, 4096, bs, false}, {64, 2, 16384, bs, true}, {256, 8, 4096, bs, false},
                                 {256, 2, 16384, bs, true}});
      }
    } else if (ParseRow(arg, &row)) {
      rows.push_back(row);
    } else {
      fprintf(stderr, "prefill_kernels: expected mma, pages, --list or HEAD_DIM:causal|full:BATCHxSEQ[:BLOCK_SIZE] "
                      "(head_dim 64, 128 or 256), got '%s'\n", argv[i]);
      return 2;
    }
  }
  if (rows.empty()) {
    rows = {{128, 2, 16384, 0, false}, {128, 8, 4096, 0, true}, {128, 2, 16384, 0, true}, {64, 8, 4096, 0, false},
            {64, 2, 16384, 0, true}, {128, 2, 16384, 16, false}, {128, 8, 4096, 16, true}, {128, 2, 16384, 64, false},
            {128, 8, 4096, 64, true}};
  }
  for (const Row& r : rows) {
    if (list) {
      printf("D=%d %s %dx%d %s bs=%d\n", r.head_dim, r.causal ? "causal" : "full", r.batch, r.seq, mma ? "mma" : "sm90",
             r.block_size);
    } else if (r.head_dim == 64) {
      Run<64>(r.batch, r.seq, r.causal, !mma, r.block_size);
    } else if (r.head_dim == 128) {
      Run<128>(r.batch, r.seq, r.causal, !mma, r.block_size);
    } else {
      Run<256>(r.batch, r.seq, r.causal, !mma, r.block_size);
    }
  }
  return 0;
}
