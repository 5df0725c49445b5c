// Tests of include/mllm_kernel/row_plan.hpp, the launch plans of the row kernels: the shapes the
// benchmarks chose (benchmarks/RESULTS.md), the rules at their edges, and invariants the kernels
// rely on over sweeps of shapes.
//  - plan_rows (norms, softmax): rms_norm's one-wave rule;
//  - plan_row_cluster_on (sampling, long-row softmax): clusters of 8 to fill the GPU, 16 for
//    few-pass ops and for slices that fit shared memory no other way.
#include "mllm_kernel/row_plan.hpp"

#include <cstdint>
#include <cstdio>
#include <initializer_list>

namespace {

using mllm_kernel::host::ClusterDevice;
using mllm_kernel::host::plan_row_cluster_on;
using mllm_kernel::host::plan_rows;
using mllm_kernel::host::RowClusterPlan;
using mllm_kernel::host::RowPlan;
using mllm_kernel::host::RowWaveOptions;

int failures = 0;

void Expect(bool ok, const char* what, int64_t rows, int64_t width) {
  if (!ok) {
    std::fprintf(stderr, "FAILED: %s (rows %ld, width %ld)\n", what, static_cast<long>(rows),
                 static_cast<long>(width));
    ++failures;
  }
}

// kvecs, threads a row, rows a block.
void ExpectPlan(const RowPlan& p, int kvecs, unsigned threads, unsigned rows_per_block, int64_t rows,
                int64_t width, const char* what) {
  Expect(p.kvecs == kvecs && p.threads_x == threads && p.rows_per_block == rows_per_block, what, rows, width);
}

// rms_norm's options on a GPU of 132 SMs (an H100): 2 vectors a thread of 16-bit data.
constexpr RowWaveOptions kH100Bf16{2, 1024 * 132};

// Sampling's plan on an H100 (132 SMs; `active16` clusters of 16 run at once): float32 rows,
// 16-byte slices, 96 KiB slice budget (kernels/sampling/sampling.cuh).
RowClusterPlan SamplingPlan(int64_t rows, int64_t vocab, bool copy_slices, bool few_passes, int active16 = 7,
                            bool hopper = true, int* asked = nullptr) {
  return plan_row_cluster_on(
      ClusterDevice{hopper, 132},
      [&] {
        if (asked != nullptr) ++*asked;
        return active16;
      },
      rows, vocab, 4, 4, 96 * 1024, copy_slices, few_passes);
}

void ExpectCluster(const RowClusterPlan& p, unsigned cluster, unsigned threads, bool fits, int64_t rows,
                   int64_t vocab, const char* what) {
  Expect(p.cluster == cluster && p.threads == threads && p.fits == fits, what, rows, vocab);
}

}  // namespace

int main() {
  constexpr int kBf16Vec = 8;  // elements of a 16-byte vector
  constexpr int kF32Vec = 4;

  // Without wave options (softmax): the plans from before the option existed.
  ExpectPlan(plan_rows(8, 4096, kBf16Vec, true), 2, 256, 1, 8, 4096, "latency plan, 4096 wide");
  ExpectPlan(plan_rows(600, 4096, kBf16Vec, true), 4, 128, 2, 600, 4096, "bandwidth plan, 4096 wide");
  ExpectPlan(plan_rows(1, 32768, kBf16Vec, true), 8, 512, 1, 1, 32768, "8 vectors of 512 threads");
  ExpectPlan(plan_rows(3, 4099, kBf16Vec, false), 0, 256, 1, 3, 4099, "scalar kernel");
  ExpectPlan(plan_rows(1, 70000, kBf16Vec, true), 0, 256, 1, 1, 70000, "too wide for vectors");

  // The wave rule at 4096 wide: 2 vectors of 256 threads up to 528 rows (1024 threads an SM).
  for (int64_t rows : {1, 8, 128, 512, 528}) {
    ExpectPlan(plan_rows(rows, 4096, kBf16Vec, true, kH100Bf16), 2, 256, 1, rows, 4096, "wave plan, 4096");
  }
  ExpectPlan(plan_rows(529, 4096, kBf16Vec, true, kH100Bf16), 4, 128, 2, 529, 4096, "past one wave: bandwidth");
  // At 8192 wide, 512 threads: up to 264 rows; then the old latency plan, then bandwidth.
  ExpectPlan(plan_rows(264, 8192, kBf16Vec, true, kH100Bf16), 2, 512, 1, 264, 8192, "wave plan, 8192");
  ExpectPlan(plan_rows(265, 8192, kBf16Vec, true, kH100Bf16), 4, 256, 1, 265, 8192, "past one wave: latency");
  ExpectPlan(plan_rows(512, 8192, kBf16Vec, true, kH100Bf16), 4, 256, 1, 512, 8192, "past one wave: bandwidth");
  // Rows too narrow for a warp of 2-vector threads, or too wide for 512: the plans without it.
  ExpectPlan(plan_rows(4, 64, kBf16Vec, true, kH100Bf16), 1, 32, 8, 4, 64, "narrow rows keep 1 vector");
  ExpectPlan(plan_rows(4, 16384, kBf16Vec, true, kH100Bf16), 8, 256, 1, 4, 16384, "wide rows keep 8 vectors");
  // float32 takes 4 vectors a thread: 4096 wide is 256 threads of 4.
  ExpectPlan(plan_rows(16, 4096, kF32Vec, true, RowWaveOptions{4, 1024 * 132}), 4, 256, 1, 16, 4096,
             "wave plan, float32");

  // Invariants over a sweep: a vector plan covers the row with whole warps of at most 512
  // threads, blocks of at most 256 threads hold several rows, and the grid covers every row.
  for (const RowWaveOptions wave : {RowWaveOptions{}, kH100Bf16, RowWaveOptions{4, 1024 * 132}}) {
    for (int vec : {kF32Vec, kBf16Vec}) {
      for (int64_t width : {1, 7, 8, 64, 120, 1000, 2048, 4096, 8192, 16384, 32768, 32776, 65536}) {
        for (int64_t rows : {1, 2, 31, 100, 264, 511, 512, 1000, 5000}) {
          const bool vec_ok = width % vec == 0;
          const RowPlan p = plan_rows(rows, width, vec, vec_ok, wave);
          const int64_t nvec = width / vec;
          Expect(p.kvecs == 0 || p.kvecs == 1 || p.kvecs == 2 || p.kvecs == 4 || p.kvecs == 8, "kvecs", rows, width);
          Expect(p.threads_x % 32 == 0 && p.threads_x >= 32 && p.threads_x <= 512, "threads", rows, width);
          if (p.kvecs != 0) {
            Expect(vec_ok, "vectors only when aligned", rows, width);
            Expect(static_cast<int64_t>(p.threads_x) * p.kvecs >= nvec, "the row covered", rows, width);
            Expect(static_cast<int64_t>(p.threads_x - 32) * p.kvecs < nvec, "no idle warp", rows, width);
          } else {
            Expect(!vec_ok || nvec > 8 * 512, "scalar only when vectors cannot hold the row", rows, width);
          }
          Expect(p.rows_per_block >= 1 && (p.rows_per_block == 1 || p.threads_x * p.rows_per_block <= 256),
                 "rows a block", rows, width);
          Expect(static_cast<int64_t>(p.blocks) * p.rows_per_block >= rows, "every row has a block", rows, width);
        }
      }
    }
  }

  // Cluster plans. Few rows fill the GPU with clusters of up to 8 blocks (1024 threads each).
  ExpectCluster(SamplingPlan(1, 128256, true, false), 8, 1024, true, 1, 128256, "batch 1: 8 blocks");
  ExpectCluster(SamplingPlan(8, 128256, true, false), 8, 1024, true, 8, 128256, "batch 8: 8 blocks");
  // Few-pass ops (greedy, top_k_mask_logits) take 16 over long rows when every cluster fits...
  ExpectCluster(SamplingPlan(1, 128256, false, true), 16, 1024, true, 1, 128256, "few passes: 16 blocks");
  ExpectCluster(SamplingPlan(4, 151936, true, true), 16, 1024, true, 4, 151936, "few passes: 16 blocks, 4 rows");
  // ... not when 8 clusters of 16 do not run at once, nor over short rows, nor without clusters.
  ExpectCluster(SamplingPlan(8, 128256, true, true), 8, 1024, true, 8, 128256, "8 rows: 8 blocks");
  ExpectCluster(SamplingPlan(4, 32000, true, true), 8, 512, true, 4, 32000, "short rows: 8 blocks");
  ExpectCluster(SamplingPlan(1, 128256, true, true, 7, false), 1, 1024, false, 1, 128256, "no clusters: 1 block");
  // Many rows: one block a row where the slice fits, else as many as it takes (8 at 128256
  // float32), two 512-thread blocks an SM.
  ExpectCluster(SamplingPlan(256, 32000, true, false), 2, 512, true, 256, 32000, "256 rows of 32000");
  ExpectCluster(SamplingPlan(256, 128256, true, false), 8, 512, true, 256, 128256, "256 rows of 128256");
  // Slices that fit only with 16 blocks take 16 where clusters of 16 run; else they do not fit.
  ExpectCluster(SamplingPlan(1, 600001, true, false), 16, 1024, false, 1, 600001, "600001: 16, still too big");
  ExpectCluster(SamplingPlan(1, 300000, true, false), 16, 1024, true, 1, 300000, "300000: fits with 16");
  ExpectCluster(SamplingPlan(1, 300000, true, false, 0), 8, 1024, false, 1, 300000, "no clusters of 16: 8");
  // The occupancy query is asked only once a plan reaches 8 blocks.
  int asked = 0;
  SamplingPlan(64, 32000, true, false, 7, true, &asked);
  SamplingPlan(1000, 32000, true, true, 7, true, &asked);
  Expect(asked == 0, "no query below 8 blocks", 64, 32000);
  SamplingPlan(1, 300000, true, false, 7, true, &asked);
  Expect(asked > 0, "a query where 8 blocks are too few", 1, 300000);

  // Invariants: power-of-two clusters of at most 16 (1 without clusters), slices of whole
  // vectors that cover the row, 256-1024 threads in warps, a grid within 2^31 - 1 blocks.
  for (bool hopper : {true, false}) {
    for (int active16 : {0, 7}) {
      for (int64_t vocab : {1, 3, 4, 999, 4099, 32000, 128256, 151936, 600001, 5000000}) {
        for (int64_t rows : {1, 2, 4, 5, 8, 16, 33, 64, 132, 256, 1000}) {
          for (bool copy : {true, false}) {
            for (bool few : {true, false}) {
              const RowClusterPlan p = SamplingPlan(rows, vocab, copy, few, active16, hopper);
              const bool pow2 = p.cluster != 0 && (p.cluster & (p.cluster - 1)) == 0;
              Expect(pow2 && p.cluster <= (hopper ? 16u : 1u), "cluster size", rows, vocab);
              Expect(p.cluster <= 8 || (hopper && active16 > 0), "16 only where they run", rows, vocab);
              Expect(p.slice % 4 == 0 && p.slice * p.cluster >= vocab, "slices cover the row", rows, vocab);
              Expect(p.threads % 32 == 0 && p.threads >= 256 && p.threads <= 1024, "threads", rows, vocab);
              Expect(rows * p.cluster <= 0x7fffffff, "grid", rows, vocab);
              Expect(p.fits == (p.slice * 4 <= 96 * 1024), "fits: the slice within the budget", rows, vocab);
            }
          }
        }
      }
    }
  }

  if (failures != 0) {
    std::fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  std::printf("row_plan_test: ok\n");
  return 0;
}
