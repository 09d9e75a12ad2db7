// Every op lets a NaN through on the CPU, as PyTorch does (cases in nan_cases.h).
#include "nan_cases.h"

namespace kiln::nantest {
namespace nan_propagation_test {

class CpuNanPropagation : public ::testing::TestWithParam<NanCase> {};

TEST_P(CpuNanPropagation, MatchesPyTorch) { GetParam().run(Device::cpu()); }

INSTANTIATE_TEST_SUITE_P(Ops, CpuNanPropagation, ::testing::ValuesIn(nan_cases()),
                         [](const ::testing::TestParamInfo<NanCase>& info) { return info.param.name; });

}  // namespace nan_propagation_test
}  // namespace kiln::nantest
