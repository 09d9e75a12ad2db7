#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/autograd/node.h"
#include "kiln/extension/load_extension.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/kernels.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln {
namespace extension_test {

using ops::BinaryOp;

// EXPECT_CONTAINS(text, part): gmock's HasSubstr without needing gmock.
#define EXPECT_CONTAINS(text, part)                                    \
  do {                                                                 \
    const std::string text_ = (text);                                  \
    EXPECT_NE(text_.find(part), std::string::npos) << "in: " << text_; \
  } while (0)

// Expects `f` to throw kiln::Error and returns its message.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no kiln::Error raised";
  return "";
}

std::vector<Tensor> mul_by(const Tensor& x, double s) { return {ops::binary(BinaryOp::Mul, x, s)}; }

// "axpb": y = a * x + b (inputs x, b; attribute a), CPU f32/f64, with its backward.
void define_axpb(OpRegistry& r) {
  r.def({.name = "axpb",
         .num_inputs = 2,
         .num_outputs = 1,
         .backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
           const Tensor& g = ctx.grad_outputs[0];
           return {ops::binary(BinaryOp::Mul, g, ctx.attrs.get<double>("a")),
                   ops::sum_to_shape(g, ctx.inputs[1].shape())};
         }});
  r.impl("axpb", DeviceKind::CPU, {DType::F32, DType::F64}, [](const std::vector<Tensor>& in, const Attrs& attrs) {
    return std::vector<Tensor>{
        ops::binary(BinaryOp::Add, ops::binary(BinaryOp::Mul, in[0], attrs.get<double>("a")), in[1])};
  });
}

TEST(Attrs, GetConvertAndFallback) {
  Attrs a{{"n", 3}, {"scale", 0.5}, {"mode", "tanh"}, {"flag", true}, {"dims", std::vector<std::int64_t>{1, 2}}};
  EXPECT_EQ(a.get<std::int64_t>("n"), 3);
  EXPECT_EQ(a.get<int>("n"), 3);
  EXPECT_EQ(a.get<double>("n"), 3.0);  // an integer reads as a double
  EXPECT_EQ(a.get<double>("scale"), 0.5);
  EXPECT_EQ(a.get<std::string>("mode"), "tanh");
  EXPECT_TRUE(a.get<bool>("flag"));
  EXPECT_EQ(a.get<std::vector<std::int64_t>>("dims"), (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(a.get<double>("missing", 7.0), 7.0);
  EXPECT_CONTAINS(error_of([&] { a.get<double>("missing"); }), "attribute 'missing' is not set");
  EXPECT_CONTAINS(error_of([&] { a.get<std::int64_t>("scale"); }), "attribute 'scale' is not an integer");
  EXPECT_CONTAINS(a.str(), "mode=\"tanh\"");
}

TEST(OpRegistry, DispatchesByDtype) {
  OpRegistry r;
  r.def({.name = "tag", .num_inputs = 1, .num_outputs = 1});
  r.impl("tag", DeviceKind::CPU, DType::F32, [](const auto& in, const Attrs&) { return mul_by(in[0], 2); });
  r.impl("tag", DeviceKind::CPU, DType::F64, [](const auto& in, const Attrs&) { return mul_by(in[0], 3); });
  EXPECT_EQ(r.call("tag", {Tensor::ones({2}, DType::F32)})[0].to_vector<double>(), (std::vector<double>{2, 2}));
  EXPECT_EQ(r.call("tag", {Tensor::ones({2}, DType::F64)})[0].to_vector<double>(), (std::vector<double>{3, 3}));
  EXPECT_TRUE(r.has_kernel("tag", DeviceKind::CPU, DType::F64));
  EXPECT_FALSE(r.has_kernel("tag", DeviceKind::CUDA, DType::F64));
  EXPECT_EQ(r.describe("tag"), "tag: cpu (float64, float32) (no backward)");
}

TEST(OpRegistry, NoKernelForTheDeviceNamesOpAndDevice) {
  OpRegistry r;
  r.def({.name = "gpu_only"});
  r.impl("gpu_only", DeviceKind::CUDA, DType::F32, [](const auto& in, const Attrs&) { return in; });
  std::string msg = error_of([&] { r.call("gpu_only", {Tensor::ones({2})}); });
  EXPECT_CONTAINS(msg, "custom op 'gpu_only': no kernel for device cpu and dtype float32");
  EXPECT_CONTAINS(msg, "registered kernels: cuda (float32)");
}

TEST(OpRegistry, NoKernelForTheDtypeNamesOpAndDevice) {
  OpRegistry r;
  define_axpb(r);
  std::string msg = error_of([&] { r.call("axpb", {Tensor::ones({2}, DType::I32), Tensor::ones({2}, DType::I32)}); });
  EXPECT_CONTAINS(msg, "custom op 'axpb': no kernel for device cpu and dtype int32");
  EXPECT_CONTAINS(msg, "cpu (float64, float32)");
}

// Custom ops share the one kernel table with the built-in ops: a built-in's name is taken, and
// the process-wide registry dispatches through the same table the built-ins use.
TEST(OpRegistry, SharesTheKernelTableWithTheBuiltinOps) {
  OpRegistry r;
  EXPECT_CONTAINS(error_of([&] { r.def({.name = "copy"}); }),
                  "custom op 'copy': the name is taken by an op of another kind in the kernel table (copy: none)");
  EXPECT_EQ(&op_registry().kernels(), &ops::kernel_registry());
  EXPECT_NE(&r.kernels(), &ops::kernel_registry());
  define_axpb(r);
  const auto id = r.kernels().find_id("axpb");
  ASSERT_TRUE(id.has_value());
  EXPECT_GE(*id, ops::kNumBuiltinOps);
  EXPECT_EQ(r.kernels().describe(*id), "axpb: cpu (float64, float32)");
}

TEST(OpRegistry, RegisteringTwiceIsAnError) {
  OpRegistry r;
  define_axpb(r);
  EXPECT_CONTAINS(error_of([&] { r.def({.name = "axpb"}); }), "custom op 'axpb' is already declared");
  std::string msg =
      error_of([&] { r.impl("axpb", DeviceKind::CPU, DType::F32, [](const auto& in, const Attrs&) { return in; }); });
  EXPECT_CONTAINS(msg, "custom op 'axpb': a kernel for device cpu and dtype float32 is already registered");
  // A new dtype or device for the same op is fine.
  r.impl("axpb", DeviceKind::CUDA, DType::F32, [](const auto& in, const Attrs&) { return in; });
}

TEST(OpRegistry, UnknownOpsAndBadArguments) {
  OpRegistry r;
  define_axpb(r);
  EXPECT_CONTAINS(error_of([&] { r.call("nope", {Tensor::ones({1})}); }),
                  "custom op 'nope' is not registered (registered ops: axpb)");
  EXPECT_CONTAINS(error_of([&] {
                    r.call("axpb", {Tensor::ones({1})}, {{"a", 1}});
                  }),
                  "custom op 'axpb': expected 2 inputs, got 1");
  EXPECT_CONTAINS(error_of([&] { r.call("axpb", {Tensor(), Tensor()}); }), "needs a defined tensor input");
  EXPECT_CONTAINS(error_of([&] { r.def({.name = "has space"}); }), "cannot contain whitespace");
  EXPECT_CONTAINS(error_of([] { Op("nope"); }), "custom op 'nope' is not declared");
}

TEST(OpRegistry, KernelOutputsAreChecked) {
  OpRegistry r;
  r.def({.name = "two", .num_outputs = 2});
  r.impl("two", DeviceKind::CPU, DType::F32, [](const auto& in, const Attrs&) { return in; });
  EXPECT_CONTAINS(error_of([&] { r.call("two", {Tensor::ones({1})}); }),
                  "custom op 'two': its cpu kernel returned 1 outputs, the op declares 2");
}

TEST(OpRegistry, KernelsBeforeTheDeclaration) {
  OpRegistry r;
  r.impl("late", DeviceKind::CPU, DType::F32, [](const auto& in, const Attrs&) { return mul_by(in[0], 2); });
  EXPECT_FALSE(r.has("late"));
  EXPECT_CONTAINS(error_of([&] { r.call("late", {Tensor::ones({1})}); }), "was never declared");
  r.def({.name = "late"});
  EXPECT_EQ(r.call("late", {Tensor::ones({1})})[0].item(), 2);
  EXPECT_EQ(r.op_names(), (std::vector<std::string>{"late"}));
}

TEST(OpRegistry, TakesPartInAutograd) {
  OpRegistry r;
  define_axpb(r);
  Tensor x = Tensor::from_vector<double>({1, 2, 3}).requires_grad_();
  Tensor b = Tensor::from_vector<double>({10}).requires_grad_();
  Tensor y = r.call("axpb", {x, b}, {{"a", 4.0}})[0];
  EXPECT_TRUE(y.requires_grad());
  EXPECT_EQ(y.grad_fn()->name(), "axpbBackward");
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{14, 18, 22}));
  sum(y * y).backward();  // d/dx = 2 y a, d/db = sum 2 y
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{112, 144, 176}));
  EXPECT_EQ(b.grad().to_vector<double>(), (std::vector<double>{108}));

  auto result = autograd::gradcheck(
      [&](const std::vector<Tensor>& in) {
        return r.call("axpb", in, {{"a", -1.5}})[0];
      },
      {Tensor::randn({3, 4}, 1, DType::F64).requires_grad_(), Tensor::randn({4}, 2, DType::F64).requires_grad_()});
  EXPECT_TRUE(result.ok) << result.message;
}

TEST(OpRegistry, NoGradModeRecordsNothing) {
  OpRegistry r;
  define_axpb(r);
  Tensor x = Tensor::ones({2}).requires_grad_();
  NoGradGuard guard;
  EXPECT_FALSE(r.call("axpb", {x, x}, {{"a", 1}})[0].requires_grad());
}

TEST(OpRegistry, OpWithoutBackwardRaisesOnlyWhenDifferentiated) {
  OpRegistry r;
  r.def({.name = "fwd_only", .num_inputs = 1});
  r.impl("fwd_only", DeviceKind::CPU, DType::F64, [](const auto& in, const Attrs&) { return mul_by(in[0], 2); });
  Tensor x = Tensor::ones({2}, DType::F64).requires_grad_();
  Tensor y = r.call("fwd_only", {x})[0];  // fine: forward only
  EXPECT_CONTAINS(error_of([&] { sum(y).backward(); }), "custom op 'fwd_only' has no backward");
}

TEST(OpRegistry, BackwardResultsAreChecked) {
  OpRegistry r;
  r.def({.name = "bad_grad", .num_inputs = 1, .backward = [](const BackwardContext&) -> std::vector<Tensor> {
           return {Tensor::ones({5}, DType::F64)};
         }});
  r.impl("bad_grad", DeviceKind::CPU, DType::F64, [](const auto& in, const Attrs&) { return mul_by(in[0], 2); });
  r.def({.name = "few_grads", .num_inputs = 1, .backward = [](const BackwardContext&) -> std::vector<Tensor> {
           return {};
         }});
  r.impl("few_grads", DeviceKind::CPU, DType::F64, [](const auto& in, const Attrs&) { return mul_by(in[0], 2); });
  Tensor x = Tensor::ones({2}, DType::F64).requires_grad_();
  EXPECT_CONTAINS(error_of([&] { sum(r.call("bad_grad", {x})[0]).backward(); }),
                  "custom op 'bad_grad': backward returned a gradient float64[5] on cpu for input 0 of shape [2]");
  EXPECT_CONTAINS(error_of([&] { sum(r.call("few_grads", {x})[0]).backward(); }),
                  "custom op 'few_grads': backward returned 0 gradients for 1 inputs");
}

TEST(OpRegistry, KernelReturningItsInputAndIntegerOutputs) {
  OpRegistry r;
  r.def({.name = "pass_and_count",
         .num_inputs = 1,
         .num_outputs = 2,
         .backward = [](const BackwardContext& ctx) -> std::vector<Tensor> {
           EXPECT_FALSE(ctx.grad_outputs[1].defined());  // the integer output gets no gradient
           return {ctx.grad_outputs[0]};
         }});
  r.impl("pass_and_count", DeviceKind::CPU, DType::F64, [](const auto& in, const Attrs&) {
    return std::vector<Tensor>{in[0], Tensor::full({1}, static_cast<double>(in[0].numel()), DType::I64)};
  });
  Tensor x = Tensor::from_vector<double>({1, 2}).requires_grad_();
  auto out = r.call("pass_and_count", {x});
  EXPECT_FALSE(out[0].is_same(x));  // recorded on an alias, x stays a leaf
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(out[1].requires_grad());
  sum(out[0] * 3.0).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 3}));
}

TEST(OpRegistry, MergeIsAllOrNothing) {
  OpRegistry target;
  define_axpb(target);
  OpRegistry incoming;
  incoming.def({.name = "fresh"});
  incoming.impl("axpb", DeviceKind::CPU, DType::F32, [](const auto& in, const Attrs&) { return in; });
  EXPECT_CONTAINS(error_of([&] { target.merge(std::move(incoming)); }),
                  "custom op 'axpb': a kernel for device cpu and dtype float32 is already registered");
  EXPECT_FALSE(target.has("fresh"));

  OpRegistry more;
  more.def({.name = "fresh"});
  more.impl("axpb", DeviceKind::CUDA, DType::F32, [](const auto& in, const Attrs&) { return in; });
  EXPECT_EQ(target.merge(std::move(more)), (std::vector<std::string>{"axpb", "fresh"}));
  EXPECT_TRUE(target.has("fresh"));
  EXPECT_TRUE(target.has_kernel("axpb", DeviceKind::CUDA, DType::F32));
}

TEST(OpRegistry, HandlesAndTheGlobalRegistry) {
  if (!op_registry().has("test_global_axpb")) {
    op_registry().def({.name = "test_global_axpb", .num_inputs = 2});
    op_registry().impl("test_global_axpb", DeviceKind::CPU, DType::F32, [](const auto& in, const Attrs& a) {
      return std::vector<Tensor>{
          ops::binary(BinaryOp::Add, ops::binary(BinaryOp::Mul, in[0], a.get<double>("a", 1)), in[1])};
    });
  }
  Tensor x = Tensor::ones({2}), b = Tensor::full({2}, 5);
  EXPECT_EQ(call_op("test_global_axpb", {x, b})[0].to_vector<float>(), (std::vector<float>{6, 6}));
  Op op("test_global_axpb");
  EXPECT_EQ(op.name(), "test_global_axpb");
  EXPECT_EQ(op({x, b}, {{"a", 2}})[0].to_vector<float>(), (std::vector<float>{7, 7}));
  TypedOp<2> typed("test_global_axpb");
  EXPECT_EQ(typed(x, b).to_vector<float>(), (std::vector<float>{6, 6}));
  EXPECT_EQ(typed.with({{"a", 3}}, x, b).to_vector<float>(), (std::vector<float>{8, 8}));
}

TEST(OpRegistry, CallsWhileOtherOpsAreRegistered) {
  OpRegistry r;
  define_axpb(r);
  std::atomic<int> wrong{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t)
    callers.emplace_back([&] {
      Tensor x = Tensor::ones({4}), b = Tensor::ones({4});
      for (int i = 0; i < 200; ++i)
        if (r.call("axpb", {x, b}, {{"a", 2}})[0].to_vector<float>() != std::vector<float>{3, 3, 3, 3}) ++wrong;
    });
  for (int i = 0; i < 100; ++i) {
    std::string name = "extra_" + std::to_string(i);
    r.def({.name = name});
    r.impl(name, DeviceKind::CPU, DType::F32, [](const auto& in, const Attrs&) { return in; });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(r.op_names().size(), 101u);
}

TEST(LoadExtension, LoadsRegistersAndIsIdempotent) {
  OpRegistry r;
  LoadedExtension ext = load_extension(KILN_TEST_OK_EXTENSION, r);
  EXPECT_EQ(ext.ops, (std::vector<std::string>{"ext_scale"}));
  EXPECT_EQ(load_extension(KILN_TEST_OK_EXTENSION, r).ops, ext.ops);  // no second init, no error
  Tensor x = Tensor::from_vector<double>({1, 2}).requires_grad_();
  Tensor y = r.call("ext_scale", {x}, {{"scale", 3}})[0];
  EXPECT_EQ(y.to_vector<double>(), (std::vector<double>{3, 6}));
  // Its backward calls call_op(), i.e. the global registry: load it there too.
  load_extension(KILN_TEST_OK_EXTENSION);
  sum(y).backward();
  EXPECT_EQ(x.grad().to_vector<double>(), (std::vector<double>{3, 3}));
}

TEST(LoadExtension, ConflictsNameTheOpAndDevice) {
  OpRegistry r;
  r.def({.name = "ext_scale"});
  std::string msg = error_of([&] { load_extension(KILN_TEST_OK_EXTENSION, r); });
  EXPECT_CONTAINS(msg, KILN_TEST_OK_EXTENSION);
  EXPECT_CONTAINS(msg, "custom op 'ext_scale' is already declared");
  OpRegistry r2;
  r2.impl("ext_scale", DeviceKind::CPU, DType::F64, [](const auto& in, const Attrs&) { return in; });
  EXPECT_CONTAINS(error_of([&] { load_extension(KILN_TEST_OK_EXTENSION, r2); }),
                  "custom op 'ext_scale': a kernel for device cpu and dtype float64 is already registered");
}

TEST(LoadExtension, ClearErrors) {
  OpRegistry r;
  EXPECT_CONTAINS(error_of([&] { load_extension("/nonexistent/libmissing.so", r); }),
                  "load_extension('/nonexistent/libmissing.so'): no such file");
  EXPECT_CONTAINS(error_of([&] { load_extension(KILN_SOURCE_DIR "/tests/extension/extension_test.cpp", r); }),
                  "cannot load the library");
  std::string msg = error_of([&] { load_extension(KILN_TEST_NO_INIT_EXTENSION, r); });
  EXPECT_CONTAINS(msg, KILN_TEST_NO_INIT_EXTENSION);
  EXPECT_CONTAINS(msg, "has no kiln_extension_init");
  msg = error_of([&] { load_extension(KILN_TEST_THROWING_EXTENSION, r); });
  EXPECT_CONTAINS(msg, "kiln_extension_init failed: throwing_extension: the GPU it wants is missing");
  EXPECT_FALSE(r.has("half_registered"));  // nothing of a failed init stays
  EXPECT_FALSE(r.has_kernel("half_registered", DeviceKind::CPU, DType::F32));
}

}  // namespace extension_test
}  // namespace kiln
