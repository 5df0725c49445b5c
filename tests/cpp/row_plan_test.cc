// Tests of include/mllm_kernel/row_plan.hpp, the launch plan of the norm and softmax kernels:
// the shapes the benchmarks chose (benchmarks/RESULTS.md), the one-wave rule of rms_norm at its
// edges, and invariants the kernels rely on over a sweep of shapes.
#include "mllm_kernel/row_plan.hpp"

#include <cstdint>
#include <cstdio>
#include <initializer_list>

namespace {

using mllm_kernel::host::plan_rows;
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

  if (failures != 0) {
    std::fprintf(stderr, "%d failures\n", failures);
    return 1;
  }
  std::printf("row_plan_test: ok\n");
  return 0;
}
