#pragma once
// test_backend_ops: every kernel in the kernel registry (ops/kernel_registry.h), on every backend,
// in three modes (after ggml's tests/test-backend-ops.cpp):
//   eval  runs each case on every backend and dtype and compares outputs (and, for differentiable
//         cases, the input gradients autograd computes through the backward kernels) with the
//         float64 reference: the case's direct float64 computation, else the CPU kernels at f64;
//   grad  checks the gradients of differentiable cases against central finite differences, in
//         float64 on every backend;
//   perf  times each case (forward, and backward where there is one) on every backend.
// The harness fails when a registered kernel is run by no case, so coverage cannot drop silently.
//
// A case is one entry in a cases_*.cpp file: its name, the registry ops it runs, the dtypes it is
// compared at, its inputs (float64 where floating; converted per run), its forward, and which
// inputs get gradients.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::backend_ops {

struct OpCase {
  std::string name;                  // "unary/exp": family/variant
  std::vector<std::string> kernels;  // the registry ops the case runs (forward and backward)
  // The dtypes compared with the reference besides float64. Empty with `native` set: the case
  // runs at its inputs' own dtypes only (e.g. uint8 images).
  std::vector<DType> dtypes = {DType::F32};
  bool native = false;
  // Inputs on the CPU; floating ones in float64 (converted to each run's dtype). `large` asks for
  // the bigger shapes of perf mode.
  std::function<std::vector<Tensor>(bool large)> inputs;
  // The op on inputs of one device and dtype; returns its outputs.
  std::function<std::vector<Tensor>(const std::vector<Tensor>& in)> forward;
  // Inputs that get gradients (floating ones); empty: the case is not differentiable.
  std::vector<int> grad_inputs = {};
  // Optional direct float64 computation of the outputs (CPU tensors); else the CPU kernels at f64.
  std::function<std::vector<Tensor>(const std::vector<Tensor>& in)> reference = {};
  double tol_scale = 1;  // multiplies the per-dtype tolerances (long reductions, ill-conditioned ops)
  // Whether every backend runs the case at float64 too; off where float64 is a CPU-only
  // reference path (the optimizer kernels' contract is float32).
  bool f64_on_every_backend = true;
  // Whether grad mode checks the case by finite differences; off where a smaller case of the same
  // function already does and this one's shapes exist to reach a device kernel's tiling.
  bool finite_differences = true;
};

// Every case (built once; the image-augmentation and FP8 families are registered first).
const std::vector<OpCase>& all_cases();
void add_elementwise_cases(std::vector<OpCase>& cases);
void add_reduce_linalg_cases(std::vector<OpCase>& cases);
void add_nn_cases(std::vector<OpCase>& cases);
void add_data_cases(std::vector<OpCase>& cases);          // copy, fill, random, indexing, optimizer, images
void add_fp8_cases(std::vector<OpCase>& cases);           // the FP8 family (registers it)
void add_te_attention_cases(std::vector<OpCase>& cases);  // te/'s attention family
void add_te_fused_cases(std::vector<OpCase>& cases);      // te/'s fused kernels (te/fused_ops.h)
void add_fp8_producer_cases(std::vector<OpCase>& cases);  // te/'s FP8-output norms / SwiGLU, batched update
void add_te_moe_cases(std::vector<OpCase>& cases);        // te/'s mixture-of-experts kernels (te/moe_ops.h)

struct Options {
  std::string op;       // run only cases that run this registry op (empty: all)
  std::string backend;  // "cpu" or "cuda" (empty: every backend with a device)
  bool verbose = false;
};

// What one mode found.
struct Report {
  int cases_run = 0, checks = 0, failures = 0;
  std::map<std::string, int> checks_per_backend;
  std::vector<std::string> messages;  // one line per failure
};

// Registry coverage: kernels per backend, and those no case runs (the harness fails on them).
struct Coverage {
  std::map<std::string, int> kernels_per_backend;  // registered kernels
  std::map<std::string, int> covered_per_backend;  // of those, run by a case
  std::vector<std::string> uncovered;              // "op on device"
  std::vector<std::string> unknown;                // case kernels that are not registered ops
};

Coverage coverage();
std::vector<Device> backends(const Options& o);  // devices to run on (CPU first)
Report run_eval(const Options& o);
Report run_eval(const Options& o, const std::vector<OpCase>& cases);  // given cases only
Report run_grad(const Options& o);
Report run_perf(const Options& o);  // prints one JSON line per case, backend and dtype
void print_coverage(const Coverage& c);
void print_report(const char* mode, const Report& r);

// Helpers for the cases.
Tensor randn(Shape shape, std::uint64_t seed, double scale = 1.0, double shift = 0.0);  // f64 CPU
Tensor rand_uniform(Shape shape, std::uint64_t seed, double lo, double hi);             // f64 CPU
// Values with gaps of at least `gap` between any two (a shuffled ramp): max/min/sort/pool inputs
// stay away from ties under finite differences and low-precision rounding.
Tensor distinct(Shape shape, std::uint64_t seed, double gap = 0.05);
Tensor rand_index(Shape shape, std::uint64_t seed, std::int64_t hi);  // int64 in [0, hi)

}  // namespace kiln::backend_ops
