// Prints the SIMD target Highway's dynamic dispatch selects on this CPU (for show_env).
#include <cstdio>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "tools/hwy_target.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace mllm_kernel_tools {
namespace HWY_NAMESPACE {
const char* CompiledTargetName() { return hwy::TargetName(HWY_TARGET); }
}  // namespace HWY_NAMESPACE
}  // namespace mllm_kernel_tools
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace mllm_kernel_tools {
HWY_EXPORT(CompiledTargetName);
}  // namespace mllm_kernel_tools

int main() {
  std::printf("%s\n", HWY_DYNAMIC_DISPATCH(mllm_kernel_tools::CompiledTargetName)());
  return 0;
}
#endif
