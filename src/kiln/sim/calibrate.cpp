// The measurements of `kiln simulate --calibrate`, through Kiln's own ops on the device.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <optional>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/models/transformer_core_ops.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/reduce.h"
#include "kiln/runtime/backend.h"
#include "kiln/sim/calibration.h"
#include "kiln/te/fp8_linear.h"
#include "kiln/te/fp8_weight_cache.h"
#include "kiln/te/fused_norm.h"
#include "kiln/te/gelu_mlp.h"
#include "kiln/te/rope.h"
#include "kiln/te/swiglu.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::sim {

namespace {

DType dtype_of(Precision p) { return p == Precision::FP32 ? DType::F32 : DType::BF16; }

// Median seconds of one `run` over a few repetitions after warming up. On a GPU each repetition
// runs `run` back to back until about 2 ms of work are queued (at most 20 calls) between two
// synchronisations, so the launch and synchronisation latency (~15-30 us) does not count: training
// launches asynchronously too. The CPU runs synchronously: one call per repetition.
// The number of calls comes from a second call: the first one builds the cuBLASLt / cuDNN plans
// and allocates (milliseconds), and sizing the repetitions by it left most samples of the
// 2026-12-03 H200 table at one call each, every small GEMM carrying ~25 us of latency.
template <class F>
double time_it(Device device, int reps, F&& run, int max_calls = 20) {
  auto clock = [] { return std::chrono::steady_clock::now(); };
  run();
  synchronize(device);
  auto start = clock();
  run();
  synchronize(device);
  const double warm = std::chrono::duration<double>(clock() - start).count();
  const int calls = device.is_cpu() ? 1 : std::clamp(static_cast<int>(2e-3 / std::max(warm, 1e-7)), 1, max_calls);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    start = clock();
    for (int c = 0; c < calls; ++c) run();
    synchronize(device);
    t.push_back(std::chrono::duration<double>(clock() - start).count() / calls);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// [m, k] x [n, k]^T products of transformer layers (tokens x the qkv, output, fc1 and fc2
// projections) for hidden sizes 768 to 4096 in the GPT-2 (biased, 4h MLP) and Llama (GQA, SwiGLU)
// shapes, at 8192 tokens and at 2048 / 16384 for some: a linear layer between samples is
// interpolated (CalibrationTable::linear_seconds), and a GEMM's rate changes fastest with its
// smallest dimension, so the grid is dense there.
constexpr std::array<std::array<std::int64_t, 3>, 30> kLinearShapes = {{
    {8192, 2304, 768},   {8192, 768, 768},    {8192, 3072, 768},   {8192, 768, 3072},   // GPT-2 124M
    {8192, 3072, 1024},  {8192, 1024, 1024},  {8192, 4096, 1024},  {8192, 1024, 4096},  // GPT-2 350M
    {8192, 3072, 2048},  {8192, 2048, 2048},  {8192, 11264, 2048}, {8192, 2048, 5632},  // Llama 1B
    {8192, 5120, 3072},  {8192, 3072, 3072},  {8192, 16384, 3072}, {8192, 3072, 8192},  // Llama 2.4B-3B
    {16384, 2304, 768},  {16384, 768, 768},   {16384, 4096, 1024}, {16384, 1024, 4096}, {16384, 3072, 2048},
    {16384, 2048, 2048}, {16384, 4096, 4096}, {16384, 6144, 4096}, {2048, 5120, 3072},  {2048, 3072, 3072},
    {2048, 16384, 3072}, {2048, 3072, 8192},  {4096, 1024, 1024},  {4096, 3072, 1024},
}};

// Inputs of an op sample in several copies, cycled call by call. On a GPU a layer-sized tensor
// (2-32 MB here) that the timed calls read back to back stays in the 50-60 MB L2, and the samples
// measured L2's bandwidth: about half of what the same kernels take inside a training step, whose
// activations stream through DRAM (configuration 7 profiled on an H100, 2026-12-06: the layers'
// memory-bound kernels 0.40 ms a layer and micro-batch, the model 0.18; docs/simulate.md). Copies
// totalling kColdFootprint (more than any current L2) make each call read memory the previous
// ones did not touch, as a step does. The CPU keeps one copy (its samples run one call each).
constexpr double kColdFootprint = 192.0 * (1 << 20);
constexpr int kMaxCopies = 64;

int copies_for(Device device, double bytes_per_call) {
  if (device.is_cpu()) return 1;
  return static_cast<int>(
      std::clamp(std::ceil(kColdFootprint / std::max(bytes_per_call, 1.0)), 1.0, static_cast<double>(kMaxCopies)));
}

// Which copy the next timed call takes: 0, 1, ..., count - 1, 0, ...
struct CopyCycle {
  int count = 1;
  int next = 0;
  int operator()() {
    const int i = next;
    next = (next + 1) % count;
    return i;
  }
};

// One op's forward (with autograd recording, as training runs it) and backward (autograd::grad from
// a fixed output gradient to the copy's inputs: the op's own backward kernels, no sum, fill or
// accumulation into .grad around them) over `copies` input copies in turn (forward(i) runs copy i).
std::pair<double, double> time_op_copies(Device device, int reps, int copies, const std::function<Tensor(int)>& forward,
                                         const std::function<std::vector<Tensor>(int)>& inputs) {
  CopyCycle pick{copies};
  const double fwd = time_it(
      device, reps, [&] { (void)forward(pick()); }, 400);
  if (!inputs || inputs(0).empty()) return {fwd, 0.0};
  const Tensor y0 = forward(0);
  const Tensor g = Tensor::randn(y0.shape(), 31, DType::F32, device).to(y0.dtype());
  const double both = time_it(
      device, reps,
      [&] {
        const int i = pick();
        (void)autograd::grad({forward(i)}, {g}, inputs(i));
      },
      400);
  return {fwd, std::max(both - fwd, 0.0)};
}

// time_op_copies on one copy of the inputs (the GELU MLP sample).
std::pair<double, double> time_op(Device device, int reps, const std::function<Tensor()>& forward,
                                  const std::vector<Tensor>& inputs) {
  return time_op_copies(
      device, reps, 1, [&](int) { return forward(); }, [&](int) { return inputs; });
}

// The op samples (CalibrationTable::ops): each kind at a few sizes (rows of `width` elements), its
// forward and backward fitted to fixed + per element, each call on its own copy of the inputs.
void calibrate_ops(CalibrationTable& t, Device device, Precision p, int reps, bool quick) {
  const DType dt = dtype_of(p);
  const bool cpu = device.is_cpu();
  const std::int64_t width = cpu ? 256 : 1024;
  const std::vector<std::int64_t> rows =
      cpu ? (quick ? std::vector<std::int64_t>{16, 64} : std::vector<std::int64_t>{64, 256, 1024})
          : std::vector<std::int64_t>{256, 1024, 4096, 16384};
  auto input = [&](Shape shape, std::uint64_t seed, bool grad = true) {
    Tensor x = Tensor::randn(std::move(shape), seed, DType::F32, device).to(dt);
    return grad ? x.requires_grad_(true) : x;
  };
  // `count` copies of input(shape, seed + copy, grad)
  auto inputs = [&](int count, const Shape& shape, std::uint64_t seed, bool grad = true) {
    std::vector<Tensor> v;
    for (int i = 0; i < count; ++i) v.push_back(input(shape, seed + 1000 * static_cast<std::uint64_t>(i), grad));
    return v;
  };
  const double element_bytes = static_cast<double>(dtype_size(dt));
  const std::int64_t head_dim = 64, heads = width / head_dim;
  const te::RopeTable rope = te::make_rope_table(head_dim, cpu ? 1024 : 16384, 10000.0, false, 1.0, device);
  for (int kind_index = 0; kind_index < kOpKinds; ++kind_index) {
    const auto kind = static_cast<OpKind>(kind_index);
    OpSample sample;
    sample.kind = kind;
    sample.precision = p;
    std::vector<std::pair<double, double>> fwd_points, bwd_points;
    // An op this device or dtype does not run leaves its kind out: the table then has no complete op
    // set for the precision, and the simulator keeps the byte model for it.
    try {
      for (const std::int64_t r : rows) {
        const double elements = static_cast<double>(r * width);
        // What one call reads and writes, about (the main tensor three times): the copies it needs.
        const int n = copies_for(device, 3.0 * elements * element_bytes);
        std::pair<double, double> s;
        const Tensor w = Tensor::ones({width}, dt, device).requires_grad_(true);
        const Tensor b = Tensor::zeros({width}, dt, device).requires_grad_(true);
        switch (kind) {
          case OpKind::LayerNorm:
          case OpKind::LayerNormResidual:
          case OpKind::RmsNorm:
          case OpKind::RmsNormResidual: {
            const bool residual = kind == OpKind::LayerNormResidual || kind == OpKind::RmsNormResidual;
            const bool layer = kind == OpKind::LayerNorm || kind == OpKind::LayerNormResidual;
            const std::vector<Tensor> x = inputs(n, {1, r, width}, 40);
            const std::vector<Tensor> res = residual ? inputs(n, {1, r, width}, 41) : std::vector<Tensor>(n);
            auto in = [&](int i) {
              std::vector<Tensor> v = {x[i], w};
              if (residual) v.push_back(res[i]);
              if (layer) v.push_back(b);
              return v;
            };
            // The second norm's two outputs (normed, sum) both flow on in a layer: the backward gets both.
            const Tensor g2 = residual ? Tensor::randn({1, r, width}, 32, DType::F32, device).to(dt) : Tensor();
            auto run = [&](int i) {
              return layer ? te::add_layer_norm(x[i], res[i], w, b, 1e-5) : te::add_rms_norm(x[i], res[i], w, 1e-5);
            };
            CopyCycle pick{n};
            const double fwd = time_it(
                device, reps, [&] { (void)run(pick()); }, 400);
            const Tensor g1 = Tensor::randn({1, r, width}, 31, DType::F32, device).to(dt);
            const double both = time_it(
                device, reps,
                [&] {
                  const int i = pick();
                  auto [y, sum] = run(i);
                  if (residual)
                    (void)autograd::grad({y, sum}, {g1, g2}, in(i));
                  else
                    (void)autograd::grad({y}, {g1}, in(i));
                },
                400);
            s = {fwd, std::max(both - fwd, 0.0)};
            break;
          }
          case OpKind::Add: {
            const std::vector<Tensor> x = inputs(n, {r, width}, 42, false), y = inputs(n, {r, width}, 43, false);
            s = time_op_copies(device, reps, n, [&](int i) { return ops::binary(ops::BinaryOp::Add, x[i], y[i]); }, {});
            break;
          }
          case OpKind::BiasGrad: {
            const std::vector<Tensor> dy = inputs(n, {r, width}, 44, false);
            s = time_op_copies(device, reps, n,
                               [&](int i) { return ops::reduce(ops::ReduceOp::Sum, dy[i], {0}, false); }, {});
            s = {0.0, s.first};  // the reduction is the linear layer's backward
            break;
          }
          case OpKind::BiasAdd: {
            const std::vector<Tensor> y = inputs(n, {1, r, width}, 45, false);
            const Tensor bias = input({width}, 46, false);
            s = time_op_copies(device, reps, n, [&](int i) { return ops::binary(ops::BinaryOp::Add, y[i], bias); }, {});
            break;
          }
          case OpKind::Rope: {
            // q of a fused projection: a strided view [B, T, H, D] of [B, T, 2H, D], read in place.
            const std::vector<Tensor> qkv = inputs(n, {1, r, 2 * heads, head_dim}, 47);
            s = time_op_copies(
                device, reps, n, [&](int i) { return te::apply_rope(qkv[i].narrow(2, 0, heads), rope, 0); },
                [&](int i) { return std::vector<Tensor>{qkv[i]}; });
            break;
          }
          case OpKind::Swiglu: {
            const std::vector<Tensor> x = inputs(n, {r, 2 * width}, 48);
            s = time_op_copies(
                device, reps, n, [&](int i) { return te::swiglu(x[i]); },
                [&](int i) { return std::vector<Tensor>{x[i]}; });
            break;
          }
          case OpKind::Gelu: {
            const std::vector<Tensor> x = inputs(n, {r, width}, 49);
            s = time_op_copies(
                device, reps, n, [&](int i) { return gelu(x[i], true); },
                [&](int i) { return std::vector<Tensor>{x[i]}; });
            break;
          }
          case OpKind::Dropout: {
            const std::vector<Tensor> x = inputs(n, {r, width}, 50);
            std::uint64_t offset = 0;
            s = time_op_copies(
                device, reps, n, [&](int i) { return dropout(x[i], 0.1, true, 13, offset += 1u << 24); },
                [&](int i) { return std::vector<Tensor>{x[i]}; });
            break;
          }
          case OpKind::Copy: {
            const std::vector<Tensor> qkv = inputs(n, {1, r, 3 * heads, head_dim}, 51, false);
            s = time_op_copies(device, reps, n, [&](int i) { return ops::contiguous(qkv[i].narrow(2, heads, heads)); },
                               {});
            break;
          }
          case OpKind::Accumulate: {
            // The fp32 buffer and the gradient: 6 bytes an element in bf16, 8 in fp32.
            const int m = copies_for(device, elements * (4.0 + 2.0 * element_bytes));
            std::vector<Tensor> buffer;
            for (int i = 0; i < m; ++i) buffer.push_back(Tensor::zeros({r * width}, DType::F32, device));
            const std::vector<Tensor> g = inputs(m, {r * width}, 52, false);
            CopyCycle pick{m};
            s = {time_it(
                     device, reps,
                     [&] {
                       const int i = pick();
                       ops::accumulate_(buffer[i], g[i]);
                     },
                     400),
                 0.0};
            break;
          }
        }
        fwd_points.emplace_back(elements, s.first);
        bwd_points.emplace_back(elements, s.second);
        sample.points.push_back({elements, s.first, s.second});
      }
    } catch (const std::exception&) {
      continue;
    }
    sample.forward = fit_op_cost(fwd_points);
    sample.backward = fit_op_cost(bwd_points);
    t.ops.push_back(sample);
  }
}

// Bytes a te::fp8_linear keeps for its backward (per input element) and in its weight cache (per
// weight element), from the caching allocator's count: what the memory model holds per FP8 linear.
void calibrate_fp8_memory(CalibrationTable& t, Device device) {
  const std::int64_t m = device.is_cpu() ? 256 : 4096, n = device.is_cpu() ? 256 : 2048, k = n;
  Backend& backend = backend_for(device);
  auto allocated = [&] {
    synchronize(device);
    return static_cast<double>(backend.memory_stats(device.index).allocated);
  };
  for (te::Fp8ScalingRecipe recipe :
       {te::Fp8ScalingRecipe::Delayed, te::Fp8ScalingRecipe::Tensorwise, te::Fp8ScalingRecipe::Blockwise}) {
    te::Fp8Recipe r;
    r.recipe = recipe;
    const Tensor x = Tensor::randn({m, k}, 53, DType::F32, device).to(DType::BF16).requires_grad_(true);
    const Tensor w = Tensor::randn({n, k}, 54, DType::F32, device).to(DType::BF16).requires_grad_(true);
    te::Fp8LinearState state;
    state.input = te::Fp8ScalingState::fresh(r.amax_history_len, device);
    state.weight = te::Fp8ScalingState::fresh(r.amax_history_len, device);
    state.grad_output = te::Fp8ScalingState::fresh(r.amax_history_len, device);
    state.weight_cache = std::make_shared<te::Fp8WeightCache>();
    const double before = allocated();
    double cache = 0, saved = 0;
    {
      const Tensor y = te::fp8_linear(x, w, Tensor(), r, &state);  // casts and caches the weight
      (void)y;
    }
    cache = allocated() - before;
    {
      const double start = allocated();
      const Tensor y = te::fp8_linear(x, w, Tensor(), r, &state);  // the cache hit, as every micro-batch
      saved = allocated() - start - static_cast<double>(y.numel()) * 2;
    }
    t.fp8_memory.push_back(
        {recipe, std::max(saved, 0.0) / static_cast<double>(m * k), std::max(cache, 0.0) / static_cast<double>(n * k)});
  }
}

}  // namespace

CalibrationTable calibrate(const CalibrateOptions& o) {
  CalibrationTable t;
  t.device = o.device.str();
  t.format = 2;
  t.linear_backward_direct = true;  // the linear layers' GEMMs timed directly (below)
  t.fp8_weight_cached = true;       // FP8 linear layers keep their weight casts, as training does
  t.fp8_linear_direct = true;       // and are timed as training runs them (below)
  const bool cpu = o.device.is_cpu();
  const int reps = o.quick ? 2 : 5;
  const std::vector<std::int64_t> sizes =
      cpu ? (o.quick ? std::vector<std::int64_t>{32, 128} : std::vector<std::int64_t>{64, 128, 256, 512})
          : std::vector<std::int64_t>{256, 1024, 4096, 8192};
  for (Precision p : o.precisions) {
    if (p == Precision::FP8) continue;  // FP8 linear layers are measured whole, per recipe, below
    const DType dt = dtype_of(p);
    std::optional<NoGradGuard> no_grad(std::in_place);  // GEMMs only: attention records its backward
    // Square and the skinny shapes of transformer layers (tokens x hidden by hidden x 4 hidden).
    for (std::int64_t m : sizes)
      for (std::int64_t n : sizes)
        for (std::int64_t k : sizes) {
          if (o.quick && !(m == n && n == k)) continue;
          if (!(m == n || n == k || m == k)) continue;
          Tensor a = Tensor::randn({m, k}, 1, DType::F32, o.device).to(dt);
          Tensor b = Tensor::randn({k, n}, 2, DType::F32, o.device).to(dt);
          const double s = time_it(o.device, reps, [&] { (void)matmul(a, b); });
          t.gemms.push_back({m, n, k, p, s});
        }
    no_grad.reset();
    // Linear layers as training runs them: the three GEMMs of autograd/functions/linalg.cpp linear,
    // called as it calls them (the forward x W^T; the backward's data gradient g W and weight
    // gradient g^T x), on a GPU at transformer layers' sizes (kLinearShapes), under sustained load
    // (a sample runs ~2 ms of back-to-back calls). Timed directly, not through autograd: a
    // `sum(linear(x, w)).backward()` also timed its harness (the sum, its gradient's fill, x's and
    // W's gradients accumulated into .grad), which training does not run (its weight gradients
    // accumulate into the fp32 buffers, counted apart): 10-20% of the backward at GPT-2 sizes.
    if (!cpu && !o.quick)
      for (auto [m, n, k] : kLinearShapes) {
        const Tensor x = Tensor::randn({1, m, k}, 15, DType::F32, o.device).to(dt);
        const Tensor w = Tensor::randn({1, n, k}, 16, DType::F32, o.device).to(dt);
        const Tensor g = Tensor::randn({1, m, n}, 17, DType::F32, o.device).to(dt);
        const double fwd = time_it(o.device, reps, [&] { (void)ops::gemm(x, w, false, true); });
        const double bwd = time_it(o.device, reps, [&] {
          (void)ops::gemm(g, w, false, false);
          (void)ops::gemm(g, x, true, false);
        });
        t.linear.push_back({m, n, k, p, fwd, bwd});
      }
    // Attention forward and backward at training-like sizes (enough heads to fill a GPU): on a GPU
    // te/'s fused kernel (what transformer_engine layers run), without and with attention dropout,
    // and on both the local layers' unfused path, without and with attention dropout. Sequences of
    // 1024, 2048 and 4096 at head size 64 (a kernel's rate depends on its sequence: the loop over
    // keys each block of queries runs), and a 4x larger batch at 1024: CalibrationTable::
    // attention_seconds interpolates in the sequence and scales in batch x heads.
    struct Shape {
      std::int64_t b, heads, seq, d;
    };
    std::vector<Shape> shapes =
        cpu ? std::vector<Shape>{{1, 4, 64, 64}, {1, 4, 256, 64}}
            : std::vector<Shape>{
                  {2, 16, 1024, 64}, {2, 16, 2048, 64}, {2, 16, 4096, 64}, {2, 16, 2048, 128}, {8, 16, 1024, 64}};
    if (o.quick) shapes.resize(1);
    auto time_attention = [&](const models::CoreOps& ops, const Shape& s, bool dropout) {
      models::CoreAttentionOptions ao;
      ao.causal = true;
      if (dropout) {  // as run_core_attention sets it: a callable for the local op, a draw for te::attention
        ao.probs_dropout = [](const Tensor& probs) { return kiln::dropout(probs, 0.1, true, 12); };
        ao.dropout_p = 0.1;
        ao.reserve_dropout = [](std::int64_t, Device) { return autograd::RandomDraw{12, 0, Tensor()}; };
      }
      Tensor q = Tensor::randn({s.b, s.seq, s.heads, s.d}, 3, DType::F32, o.device).to(dt).requires_grad_(true);
      Tensor k = Tensor::randn({s.b, s.seq, s.heads, s.d}, 4, DType::F32, o.device).to(dt).requires_grad_(true);
      Tensor v = Tensor::randn({s.b, s.seq, s.heads, s.d}, 5, DType::F32, o.device).to(dt).requires_grad_(true);
      // The forward as training runs it: recording for the backward (saving what it needs; the local
      // path keeps its probabilities and masks), not under NoGradGuard. Until 2026-12-07 it was timed
      // without recording and the backward (both - forward) held at least that forward, which the bf16
      // unfused samples all hit: their layers came out 5-14% long.
      const double fwd = time_it(o.device, reps, [&] { (void)ops.attention(q, k, v, ao); });
      const double both = time_it(o.device, reps, [&] { sum(ops.attention(q, k, v, ao)).backward(); });
      return std::pair{fwd, std::max(both - fwd, 0.5 * fwd)};
    };
    for (const Shape& s : shapes) {
      const auto [fwd, bwd] = time_attention(
          models::core_ops_for(cpu ? models::TransformerImpl::Local : models::TransformerImpl::TransformerEngine), s,
          false);
      t.attention.push_back({s.b, s.heads, s.seq, s.d, p, fwd, bwd, false});
    }
    if (!cpu) {
      // transformer_engine layers with attention dropout: te::attention as Auto runs it (Kiln's
      // kernels with the Philox mask), a fixed draw per call here.
      for (const Shape& s : shapes) {
        const auto [fwd, bwd] =
            time_attention(models::core_ops_for(models::TransformerImpl::TransformerEngine), s, true);
        t.attention.push_back({s.b, s.heads, s.seq, s.d, p, fwd, bwd, true});
      }
    }
    // The unfused path holds [B, H, T, S] f32 scores several times over: at most T 2048 on a GPU.
    for (const Shape& s : shapes) {
      if (!cpu && s.seq > 2048) continue;
      for (bool dropout : {false, true}) {
        const auto [fwd, bwd] = time_attention(models::local_core_ops(), s, dropout);
        t.unfused_attention.push_back({s.b, s.heads, s.seq, s.d, p, dropout, fwd, bwd});
      }
    }
  }
  for (Precision p : o.precisions) {
    if (p == Precision::FP8) continue;
    calibrate_ops(t, o.device, p, reps, o.quick);
    // transformer_engine's GELU MLP on one rank (te::linear_gelu_linear, what its layers call) at the
    // GPT-2 124M / 350M / 1.3B MLP shapes.
    if (!cpu && !o.quick) {
      const DType dt = dtype_of(p);
      for (auto [m, h] : std::vector<std::array<std::int64_t, 2>>{
               {8192, 768}, {16384, 768}, {8192, 1024}, {16384, 1024}, {8192, 2048}, {4096, 1024}}) {
        const std::int64_t f = 4 * h;
        const Tensor x = Tensor::randn({1, m, h}, 55, DType::F32, o.device).to(dt).requires_grad_(true);
        const Tensor w1 = Tensor::randn({f, h}, 56, DType::F32, o.device).to(dt).requires_grad_(true);
        const Tensor b1 = Tensor::zeros({f}, dt, o.device).requires_grad_(true);
        const Tensor w2 = Tensor::randn({h, f}, 57, DType::F32, o.device).to(dt).requires_grad_(true);
        const Tensor b2 = Tensor::zeros({h}, dt, o.device).requires_grad_(true);
        const auto [fwd, bwd] =
            time_op(o.device, reps, [&] { return te::linear_gelu_linear(x, w1, b1, w2, b2); }, {x, w1, b1, w2, b2});
        t.gelu_mlp.push_back({m, f, h, p, fwd, bwd});
      }
    }
  }
  try {
    calibrate_fp8_memory(t, o.device);
  } catch (const std::exception&) {
    t.fp8_memory.clear();  // no FP8 linear on this device
  }
  if (!cpu && !o.quick) {
    // FP8 linear layers (casts, scaling and FP8 GEMMs, forward and backward) per recipe, in bf16.
    // Each is timed as ParallelLinear runs it: the weight's casts kept while it is unchanged
    // (training casts it once per optimizer step, not per micro-batch; the simulator adds that cast
    // per step); and as training runs it: the output's gradient given (no sum and fill around the
    // layer), the weight's gradient added into an fp32 main gradient by the wgrad GEMM (gradient-
    // accumulation fusion, which the trainer turns on with --bf16), x's gradient handed on rather
    // than added into a .grad (cleared before each call). Until 2026-12-07 the samples timed
    // `sum(fp8_linear(x, w)).backward()`: that harness and both .grad accumulations made the FP8 rows
    // of docs/simulate.md 5-13% slow.
    auto time_fp8_linear = [&](const te::Fp8Recipe& r, std::int64_t m, std::int64_t n, std::int64_t k) {
      Tensor x = Tensor::randn({m, k}, 13, DType::F32, o.device).to(DType::BF16).requires_grad_(true);
      Tensor w = Tensor::randn({n, k}, 14, DType::F32, o.device).to(DType::BF16).requires_grad_(true);
      te::Fp8LinearState state;
      state.input = te::Fp8ScalingState::fresh(r.amax_history_len, o.device);
      state.weight = te::Fp8ScalingState::fresh(r.amax_history_len, o.device);
      state.grad_output = te::Fp8ScalingState::fresh(r.amax_history_len, o.device);
      state.weight_cache = std::make_shared<te::Fp8WeightCache>();
      const Tensor g = Tensor::randn({m, n}, 15, DType::F32, o.device).to(DType::BF16);
      w.set_grad(Tensor::zeros({n, k}, DType::F32, o.device));
      const autograd::GradientAccumulationFusionScope fusion(true);
      return time_it(o.device, reps, [&] {
        x.set_grad(Tensor());
        te::fp8_linear(x, w, Tensor(), r, &state).backward(g);
      });
    };
    for (te::Fp8ScalingRecipe recipe :
         {te::Fp8ScalingRecipe::Delayed, te::Fp8ScalingRecipe::Tensorwise, te::Fp8ScalingRecipe::Blockwise}) {
      te::Fp8Recipe r;
      r.recipe = recipe;
      // (The layer shapes of GPT-2 124M / 350M and Llama 1B at 8192 tokens, and larger ones.)
      for (auto [m, n, k] : std::vector<std::array<std::int64_t, 3>>{{8192, 2304, 768},
                                                                     {8192, 3072, 768},
                                                                     {8192, 768, 3072},
                                                                     {8192, 3072, 1024},
                                                                     {8192, 1024, 1024},
                                                                     {8192, 4096, 1024},
                                                                     {8192, 1024, 4096},
                                                                     {8192, 3072, 2048},
                                                                     {8192, 2048, 2048},
                                                                     {8192, 11264, 2048},
                                                                     {8192, 2048, 5632},
                                                                     {8192, 6144, 2048},
                                                                     {8192, 2048, 8192},
                                                                     {16384, 4096, 4096},
                                                                     {4096, 1024, 1024}}) {
        t.fp8_linear.push_back({m, n, k, recipe, time_fp8_linear(r, m, n, k)});
      }
      // The same at 16 rows x 128 x 128: nothing but the calls (the samples' fixed part).
      t.fp8_linear_call.push_back({16, 128, 128, recipe, time_fp8_linear(r, 16, 128, 128)});
    }
  }
  {
    NoGradGuard no_grad;
    const std::int64_t n = o.quick ? (1 << 20) : (1 << 24);
    Tensor x = Tensor::randn({n}, 6, DType::F32, o.device), y = Tensor::randn({n}, 7, DType::F32, o.device);
    const double s = time_it(o.device, reps, [&] { (void)add(x, y); });
    t.memory_bandwidth = 3.0 * 4.0 * static_cast<double>(n) / s;
  }
  {
    // The layers' memory-bound kernels, forward and backward through autograd, per element: on a
    // GPU on 16M elements (bandwidth-bound, as a layer's are), on the CPU on 512K.
    const std::int64_t rows = o.quick ? 256 : (cpu ? 2048 : 8192), cols = cpu ? 256 : 2048;
    const double elements = static_cast<double>(rows * cols);
    t.elementwise_elements = rows * cols;
    Tensor x = Tensor::randn({rows, cols}, 10, DType::F32, o.device).requires_grad_(true);
    Tensor w = Tensor::ones({cols}, DType::F32, o.device).requires_grad_(true);
    Tensor b = Tensor::zeros({cols}, DType::F32, o.device).requires_grad_(true);
    auto per_element = [&](auto&& op) { return time_it(o.device, reps, [&] { sum(op()).backward(); }) / elements; };
    auto& e = t.elementwise;
    e.norm = per_element([&] { return layer_norm(x, w, b); });
    e.activation = per_element([&] { return gelu(x, true); });
    e.dropout = per_element([&] { return dropout(x, 0.1, true, 11); });
    e.softmax = per_element([&] { return softmax(x, -1); });
    e.add = per_element([&] { return add(x, x); });
    e.harness = per_element([&] { return x; });
  }
  {
    // A small op recorded for the backward (autograd on, as in training): its time is the overhead.
    Tensor x = Tensor::randn({64, 64}, 8, DType::F32, o.device).requires_grad_(true);
    Tensor y = Tensor::randn({64, 64}, 9, DType::F32, o.device);
    const int ops = 50;
    t.op_overhead = time_it(o.device, reps,
                            [&] {
                              Tensor z = x;
                              for (int i = 0; i < ops; ++i) z = add(z, y);
                            }) /
                    ops;
  }
  return t;
}

}  // namespace kiln::sim
