#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "kiln/ops/kernels.h"

namespace kiln {
namespace kernel_registry_test {

using ScaleKernel = void(const Tensor& in, double s, const Tensor& out);

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

#define EXPECT_CONTAINS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)

int calls_every = 0, calls_f32 = 0;
void scale_every(const Tensor&, double, const Tensor&) { ++calls_every; }
void scale_f32(const Tensor&, double, const Tensor&) { ++calls_f32; }

TEST(KernelRegistry, DispatchesByDeviceAndDtypeWithTheDtypesOwnKernelFirst) {
  ops::KernelRegistry r;
  const auto op = r.declare<ScaleKernel>("scale");
  r.add(op, DeviceKind::CPU, scale_every);
  r.add(op, DeviceKind::CPU, scale_f32, {DType::F32});
  Tensor t = Tensor::zeros({2});
  calls_every = calls_f32 = 0;
  reinterpret_cast<ops::KernelOp<ScaleKernel>::Fn>(r.find_kernel(op.id, DeviceKind::CPU, DType::F32)->fn)(t, 1, t);
  reinterpret_cast<ops::KernelOp<ScaleKernel>::Fn>(r.find_kernel(op.id, DeviceKind::CPU, DType::F64)->fn)(t, 1, t);
  EXPECT_EQ(calls_f32, 1);
  EXPECT_EQ(calls_every, 1);
  EXPECT_EQ(r.find_kernel(op.id, DeviceKind::CUDA, DType::F32), nullptr);
  EXPECT_EQ(r.describe(op.id), "scale: cpu (float32, every dtype)");
  EXPECT_EQ(r.kernels().size(), 2u);
}

TEST(KernelRegistry, RefusesAnotherKernelTypeAndATakenSlot) {
  ops::KernelRegistry r;
  const auto op = r.declare<ScaleKernel>("scale");
  r.add(op, DeviceKind::CPU, scale_every);
  EXPECT_CONTAINS(error_of([&] { r.add(op, DeviceKind::CPU, scale_f32); }),
                  "op 'scale': a kernel for device cpu and every dtype is already registered");
  EXPECT_CONTAINS(error_of([&] { (void)r.declare<void(const Tensor&)>("scale"); }),
                  "op 'scale' is already declared with another kernel type");
  EXPECT_CONTAINS(error_of([&] { (void)r.find<void(const Tensor&)>("scale"); }), "op 'scale' has kernel type");
  EXPECT_CONTAINS(error_of([&] { (void)r.find<ScaleKernel>("nope"); }), "op 'nope' is not registered");
  EXPECT_CONTAINS(error_of([&] { (void)r.declare<ScaleKernel>("two words"); }), "contains whitespace");
  // The built-in ops are declared in every registry, with the ids of ops::op.
  EXPECT_EQ(r.find<ops::sig::copy>("copy").id, ops::op::copy.id);
  EXPECT_CONTAINS(error_of([&] { (void)r.declare<ScaleKernel>("copy"); }), "another kernel type");
}

TEST(KernelRegistry, AMissingKernelNamesTheOpTheDeviceAndTheDtype) {
  ops::KernelRegistry r;
  const auto op = r.declare<ScaleKernel>("scale");
  r.add(op, DeviceKind::CPU, scale_f32, {DType::F32, DType::F64});
  EXPECT_CONTAINS(error_of([&] { r.missing_kernel(op.id, Device::cuda(1), DType::BF16); }),
                  "scale: no kernel for device cuda:1 and dtype bfloat16 (registered: cpu (float64, float32))");
  // The process-wide registry: a built-in op on a device kind no backend fills.
  EXPECT_CONTAINS(error_of([] {
                    (void)ops::kernel(ops::op::copy, Device{DeviceKind::MUSA, 0});
                  }),
                  "copy: no kernel for device musa");
}

TEST(KernelRegistry, MergeIsAllOrNothing) {
  ops::KernelRegistry a, b, c;
  const auto in_a = a.declare<ScaleKernel>("scale");
  a.add(in_a, DeviceKind::CPU, scale_every);
  const auto in_b = b.declare<ScaleKernel>("scale");
  b.add(in_b, DeviceKind::CUDA, scale_every);
  b.add(b.declare<ScaleKernel>("other"), DeviceKind::CPU, scale_every);
  std::vector<std::string> moved = a.merge(std::move(b));
  std::sort(moved.begin(), moved.end());
  EXPECT_EQ(moved, (std::vector<std::string>{"other", "scale"}));
  EXPECT_EQ(a.describe(in_a.id), "scale: cpu (every dtype), cuda (every dtype)");
  // A conflict in any op leaves the target as it was.
  c.add(c.declare<ScaleKernel>("fresh"), DeviceKind::CPU, scale_every);
  c.add(c.declare<ScaleKernel>("scale"), DeviceKind::CPU, scale_f32);
  EXPECT_CONTAINS(error_of([&] { a.merge(std::move(c)); }), "op 'scale': a kernel for device cpu and every dtype");
  EXPECT_FALSE(a.find_id("fresh").has_value());
}

TEST(KernelRegistry, BuiltinKernelsAreRegisteredWithTheirFlags) {
  for (const auto& name : {"copy", "gemm", "conv2d_forward", "adam_step"})
    EXPECT_TRUE(ops::kernel_registry().has_kernel(name, DeviceKind::CPU, DType::F32)) << name;
  EXPECT_FALSE(ops::kernel_has_flag(ops::op::conv2d_forward, DeviceKind::CPU, ops::kTakesChannelsLast));
  // Image augmentation is vision's family, not a core op.
  const auto augment = ops::kernel_registry().find_id("augment_images");
  EXPECT_TRUE(!augment || *augment >= ops::kNumBuiltinOps);
}

}  // namespace kernel_registry_test
}  // namespace kiln
