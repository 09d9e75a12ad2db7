// Cases of the data-movement, random, indexing and optimizer kernels, and of the image
// augmentation family (vision/image_augment.h).
#include <cmath>
#include <optional>

#include "harness.h"
#include "kiln/autograd/functions.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/indexing.h"
#include "kiln/ops/kernels.h"
#include "kiln/vision/augment_math.h"
#include "kiln/vision/image_augment.h"

namespace kiln::backend_ops {

namespace cases_data {

std::vector<Tensor> one(Tensor t) { return {std::move(t)}; }

// A case whose single input only carries the run's device and dtype.
OpCase factory_case(std::string name, std::string kernel, std::function<Tensor(Device, DType, bool large)> make) {
  OpCase c;
  c.name = std::move(name);
  c.kernels = {std::move(kernel)};
  c.dtypes = {DType::F32, DType::BF16, DType::F16};
  c.inputs = [](bool large) { return std::vector<Tensor>{Tensor::zeros({large ? 1 << 20 : 7}, DType::F64)}; };
  c.forward = [make](const std::vector<Tensor>& in) {
    return one(make(in[0].device(), in[0].dtype(), in[0].numel() > 7));
  };
  return c;
}

// Empty model_params for the optimizer kernels (no dtype), else one poisoned (NaN) tensor
// of `dtype` per parameter, which the kernel must overwrite with the updated parameter.
std::vector<Tensor> model_copies(const std::vector<Tensor>& params, std::optional<DType> dtype) {
  std::vector<Tensor> out;
  if (!dtype) return out;
  for (const Tensor& p : params) out.push_back(Tensor::full(p.shape(), std::nan(""), *dtype, p.device()));
  return out;
}

}  // namespace cases_data

void add_data_cases(std::vector<OpCase>& cases) {
  using namespace cases_data;  // this file's helpers (a named namespace: the tests compile in unity batches)
  {
    OpCase c;
    c.name = "copy/strided_and_converted";
    c.kernels = {"copy"};
    c.dtypes = {DType::F32, DType::BF16, DType::F16};
    c.inputs = [](bool large) {
      auto v = randn(large ? Shape{2048, 2048} : Shape{9, 14}, 150, 20.0).to_vector<double>();
      for (double& x : v) x = std::round(x);  // whole numbers: the integer conversions are exact
      return std::vector<Tensor>{Tensor::from_vector(v, large ? Shape{2048, 2048} : Shape{9, 14})};
    };
    c.forward = [](const std::vector<Tensor>& in) {
      const Tensor& x = in[0];
      return std::vector<Tensor>{x.t().contiguous(), ops::to(x, x.device(), DType::I32),
                                 ops::to(x.t(), x.device(), DType::F32), ops::to(x, x.device(), DType::I64)};
    };
    cases.push_back(std::move(c));
  }
  {
    // A gradient of the case's dtype added into a float32 accumulator (float64 for the reference),
    // contiguous and through a transposed addend.
    OpCase c;
    c.name = "accumulate/into_float_accumulator";
    c.kernels = {"accumulate"};
    c.dtypes = {DType::F32, DType::BF16, DType::F16};
    c.inputs = [](bool large) {
      const Shape s = large ? Shape{2048, 2048} : Shape{9, 14};
      return std::vector<Tensor>{randn(s, 152), randn(s, 153)};
    };
    c.forward = [](const std::vector<Tensor>& in) {
      const DType acc_type = in[0].dtype() == DType::F64 ? DType::F64 : DType::F32;
      Tensor flat = ops::to(in[0], in[0].device(), acc_type).clone();
      ops::accumulate_(flat, in[1]);
      Tensor strided = ops::to(in[0].t(), in[0].device(), acc_type).clone();
      ops::accumulate_(strided, in[1].t());
      return std::vector<Tensor>{flat, strided};
    };
    cases.push_back(std::move(c));
  }
  cases.push_back(factory_case("fill/strided", "fill", [](Device d, DType t, bool large) {
    const std::int64_t n = large ? 2048 : 6;
    Tensor x = Tensor::zeros({n, n + 1}, t, d);
    ops::fill(x.t().slice(0, 1, n, 2), 1.25);  // a strided view: every other column
    return x;
  }));
  cases.push_back(factory_case("arange", "arange", [](Device d, DType t, bool large) {
    return Tensor::arange(-3.5, large ? 1e6 : 20.0, 0.75, t, d);
  }));
  cases.push_back(factory_case("random/uniform", "random", [](Device d, DType t, bool large) {
    return Tensor::rand({large ? 1 << 22 : 301}, 7, t, d);
  }));
  cases.push_back(factory_case("random/normal", "random", [](Device d, DType t, bool large) {
    return Tensor::randn({large ? 1 << 22 : 301}, 8, t, d);
  }));
  cases.push_back(factory_case("random/bernoulli", "random", [](Device d, DType t, bool large) {
    Tensor x = Tensor::empty({large ? 1 << 22 : 301}, t, d);
    ops::kernel(ops::op::random, d)(x, ops::RandomKind::Bernoulli, 9, 1000, 0.3, 0.0);
    return x;
  }));
  cases.push_back(
      factory_case("random_device_offset/uniform", "random_device_offset", [](Device d, DType t, bool large) {
        Tensor x = Tensor::empty({large ? 1 << 22 : 301}, t, d);
        Tensor offset = Tensor::scalar(4096, DType::I64, d);
        ops::kernel(ops::op::random_device_offset, d)(x, ops::RandomKind::Uniform, 10, offset, -1.0, 2.0);
        return x;
      }));

  // Indexing: forward kernels, and their backward (index_add, scatter_add) through autograd.
  auto table = [](bool large) { return randn(large ? Shape{32768, 1024} : Shape{10, 6}, 160); };
  {
    OpCase c;
    c.name = "index_select/dim0";
    c.kernels = {"index_select", "index_add"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [table](bool large) {
      return std::vector<Tensor>{table(large), rand_index({large ? 65536 : 8}, 161, large ? 32768 : 10)};
    };
    c.forward = [](const std::vector<Tensor>& in) { return one(index_select(in[0], 0, in[1])); };
    c.grad_inputs = {0};  // repeated indices: the backward's index_add accumulates
    cases.push_back(std::move(c));
  }
  {
    // A small table hit by many tokens: on CUDA in bf16/f16 its gradient is the one-hot GEMM
    // (autograd/functions/dropout_embedding.cpp), elsewhere index_add.
    OpCase c;
    c.name = "embedding/small_table";
    c.kernels = {"index_select", "index_add", "scatter_add", "gemm"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [](bool large) {
      return std::vector<Tensor>{randn(large ? Shape{384, 768} : Shape{24, 16}, 165),
                                 rand_index({large ? 8192 : 300}, 166, large ? 384 : 24)};
    };
    c.forward = [](const std::vector<Tensor>& in) { return one(embedding(in[0], in[1])); };
    c.grad_inputs = {0};
    cases.push_back(std::move(c));
  }
  {
    OpCase c;
    c.name = "index_select/dim1";
    c.kernels = {"index_select", "index_add"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [table](bool large) {
      return std::vector<Tensor>{table(large), rand_index({large ? 512 : 9}, 162, large ? 1024 : 6)};
    };
    c.forward = [](const std::vector<Tensor>& in) { return one(index_select(in[0], 1, in[1])); };
    c.grad_inputs = {0};
    cases.push_back(std::move(c));
  }
  {
    OpCase c;
    c.name = "index_add/dim0";
    c.kernels = {"index_add"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [table](bool large) {
      const std::int64_t n = large ? 65536 : 12;
      return std::vector<Tensor>{table(large), rand_index({n}, 163, large ? 32768 : 10),
                                 randn({n, large ? 1024 : 6}, 164)};
    };
    c.forward = [](const std::vector<Tensor>& in) {
      Tensor out = in[0].clone();
      ops::index_add_(out, 0, in[1], in[2]);
      return one(out);
    };
    cases.push_back(std::move(c));
  }
  {
    OpCase c;
    c.name = "gather/dim1";
    c.kernels = {"gather", "scatter_add"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [table](bool large) {
      return std::vector<Tensor>{table(large),
                                 rand_index(large ? Shape{32768, 256} : Shape{10, 4}, 165, large ? 1024 : 6)};
    };
    c.forward = [](const std::vector<Tensor>& in) { return one(gather(in[0], 1, in[1])); };
    c.grad_inputs = {0};
    cases.push_back(std::move(c));
  }
  {
    OpCase c;
    c.name = "scatter_add/dim0";
    c.kernels = {"scatter_add"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [table](bool large) {
      const Shape s = large ? Shape{65536, 1024} : Shape{15, 6};
      return std::vector<Tensor>{table(large), rand_index(s, 166, large ? 32768 : 10), randn(s, 167)};
    };
    c.forward = [](const std::vector<Tensor>& in) { return one(scatter_add(in[0], 0, in[1], in[2])); };
    c.grad_inputs = {0, 2};
    cases.push_back(std::move(c));
  }
  for (bool largest : {true, false}) {
    OpCase c;
    c.name = largest ? "topk/largest" : "topk/smallest";
    c.kernels = {"topk"};
    c.dtypes = {DType::F32, DType::BF16};
    c.inputs = [](bool large) { return std::vector<Tensor>{distinct(large ? Shape{4096, 1024} : Shape{5, 23}, 168)}; };
    c.forward = [largest](const std::vector<Tensor>& in) {
      auto [values, indices] = topk(in[0], 4, largest);
      return std::vector<Tensor>{values, indices};
    };
    c.grad_inputs = {0};
    cases.push_back(std::move(c));
  }

  // Optimizer kernels: one step over two parameters; float32 is their contract, float64 the CPU
  // reference. Outputs: the updated parameters and state.
  auto params = [](bool large, std::uint64_t seed) {
    const Shape a = large ? Shape{4096, 1024} : Shape{5, 7}, b = large ? Shape{1024} : Shape{11};
    return std::vector<Tensor>{randn(a, seed),
                               randn(b, seed + 1),  // params
                               randn(a, seed + 2, 0.1),
                               randn(b, seed + 3, 0.1),  // grads
                               randn(a, seed + 4, 0.01),
                               randn(b, seed + 5, 0.01),  // state 1
                               rand_uniform(a, seed + 6, 0, 1e-3),
                               rand_uniform(b, seed + 7, 0, 1e-3)};  // state 2
  };
  for (bool decoupled : {false, true}) {
    OpCase c;
    c.name = decoupled ? "adam_step/adamw" : "adam_step/adam_l2";
    c.kernels = {"adam_step"};
    c.dtypes = {DType::F32};
    c.f64_on_every_backend = false;
    c.inputs = [params](bool large) { return params(large, 170); };
    c.forward = [decoupled](const std::vector<Tensor>& in) {
      ops::AdamParams hp;
      hp.lr = 1e-2;
      hp.weight_decay = 0.05;
      hp.decoupled_weight_decay = decoupled;
      hp.step = 3;
      const std::vector<Tensor> p = {in[0], in[1]}, g = {in[2], in[3]}, m = {in[4], in[5]}, v = {in[6], in[7]};
      // AdamW also writes bfloat16 model copies of the (master) parameters in the same pass.
      const std::vector<Tensor> model = model_copies(p, decoupled ? std::optional<DType>(DType::BF16) : std::nullopt);
      ops::kernel(ops::op::adam_step, in[0].device())(p, g, m, v, model, hp);
      std::vector<Tensor> out = {in[0], in[1], in[4], in[5], in[6], in[7]};
      out.insert(out.end(), model.begin(), model.end());
      return out;
    };
    cases.push_back(std::move(c));
  }
  for (bool nesterov : {false, true}) {
    OpCase c;
    c.name = nesterov ? "sgd_step/nesterov" : "sgd_step/momentum_dampening";
    c.kernels = {"sgd_step"};
    c.dtypes = {DType::F32};
    c.f64_on_every_backend = false;
    c.inputs = [params](bool large) { return params(large, 180); };
    c.forward = [nesterov](const std::vector<Tensor>& in) {
      ops::SgdParams hp;
      hp.lr = 0.1;
      hp.momentum = 0.9;
      hp.dampening = nesterov ? 0.0 : 0.1;
      hp.nesterov = nesterov;
      hp.weight_decay = 0.01;
      hp.first_step = false;
      const std::vector<Tensor> p = {in[0], in[1]}, g = {in[2], in[3]}, buf = {in[4], in[5]};
      // Nesterov also writes float16 model copies of the (master) parameters in the same pass.
      const std::vector<Tensor> model = model_copies(p, nesterov ? std::optional<DType>(DType::F16) : std::nullopt);
      ops::kernel(ops::op::sgd_step, in[0].device())(p, g, buf, model, hp);
      std::vector<Tensor> out = {in[0], in[1], in[4], in[5]};
      out.insert(out.end(), model.begin(), model.end());
      return out;
    };
    cases.push_back(std::move(c));
  }
  {
    OpCase c;
    c.name = "sum_of_squares";
    c.kernels = {"sum_of_squares"};
    c.dtypes = {DType::F32};
    c.f64_on_every_backend = false;
    c.inputs = [params](bool large) {
      auto p = params(large, 190);
      return std::vector<Tensor>{p[0], p[1], p[2]};
    };
    c.forward = [](const std::vector<Tensor>& in) {
      Tensor out = Tensor::zeros({}, DType::F32, in[0].device());
      ops::kernel(ops::op::sum_of_squares, in[0].device())(in, out);
      return one(out);
    };
    c.reference = [](const std::vector<Tensor>& in) {
      double s = 0;
      for (const Tensor& t : in)
        for (double x : t.to_vector<double>()) s += x * x;
      return one(Tensor::from_vector(std::vector<double>{s}, {}));
    };
    cases.push_back(std::move(c));
  }

  // The image augmentation family (vision/): uint8 images in, float32 batches out, so the case
  // runs at its inputs' dtypes, with a direct computation as the reference.
  {
    OpCase c;
    c.name = "augment_images/crop_flip_normalise";
    c.kernels = {vision::kAugmentImagesOp};
    c.native = true;
    c.dtypes = {};
    c.inputs = [](bool large) {
      const std::int64_t n = large ? 50000 : 6, batch = large ? 512 : 5;
      auto v = Tensor::rand({n, 3, large ? 32 : 8, large ? 32 : 7}, 200, DType::F64).to_vector<double>();
      std::vector<std::uint8_t> px(v.size());
      for (std::size_t i = 0; i < v.size(); ++i) px[i] = static_cast<std::uint8_t>(v[i] * 255.0);
      return std::vector<Tensor>{Tensor::from_vector(px, {n, 3, large ? 32 : 8, large ? 32 : 7}),
                                 rand_index({batch}, 201, n)};
    };
    static const auto params_of = [] {
      vision::AugmentParams p;
      p.pad = 2;
      p.flip = true;
      p.seed = 42;
      p.offset = 77;
      for (int k = 0; k < 3; ++k) p.mean[k] = 0.4f + 0.05f * static_cast<float>(k), p.std[k] = 0.25f;
      return p;
    };
    c.forward = [](const std::vector<Tensor>& in) { return one(vision::augment_images(in[0], in[1], params_of())); };
    c.reference = [](const std::vector<Tensor>& in) {
      const vision::AugmentParams p = params_of();
      const auto& s = in[0].shape();
      const std::int64_t ch = s[1], h = s[2], w = s[3], batch = in[1].numel();
      auto px = in[0].to_vector<double>();
      auto idx = in[1].to_vector<std::int64_t>();
      std::vector<double> out(static_cast<std::size_t>(batch * ch * h * w));
      for (std::int64_t b = 0; b < batch; ++b) {
        const vision::BatchAugmentChoice choice = vision::augment_choice(p, static_cast<std::uint64_t>(b));
        for (std::int64_t k = 0; k < ch; ++k)
          for (std::int64_t y = 0; y < h; ++y)
            for (std::int64_t x = 0; x < w; ++x) {
              const std::int64_t sy = y + choice.dy, sx = (choice.flip ? w - 1 - x : x) + choice.dx;
              const double v = sy >= 0 && sy < h && sx >= 0 && sx < w
                                   ? px[static_cast<std::size_t>(((idx[b] * ch + k) * h + sy) * w + sx)]
                                   : 0.0;
              out[static_cast<std::size_t>(((b * ch + k) * h + y) * w + x)] = (v / 255.0 - p.mean[k]) / p.std[k];
            }
      }
      return one(Tensor::from_vector(out, {batch, ch, h, w}));
    };
    cases.push_back(std::move(c));
  }
}

}  // namespace kiln::backend_ops
