// Every CUDA op lets a NaN through as PyTorch does: the cases of tests/ops/nan_cases.h on the GPU.
#include "../ops/nan_cases.h"
#include "kiln/runtime/backend.h"

namespace kiln::nantest {
namespace nan_propagation_test {

class CudaNanPropagation : public ::testing::TestWithParam<NanCase> {};

TEST_P(CudaNanPropagation, MatchesPyTorch) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA GPU";
  GetParam().run(Device::cuda(0));
}

INSTANTIATE_TEST_SUITE_P(Ops, CudaNanPropagation, ::testing::ValuesIn(nan_cases()),
                         [](const ::testing::TestParamInfo<NanCase>& info) { return info.param.name; });

}  // namespace nan_propagation_test
}  // namespace kiln::nantest
