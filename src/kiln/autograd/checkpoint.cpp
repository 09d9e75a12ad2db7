#include "kiln/autograd/checkpoint.h"

#include <memory>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/node.h"
#include "kiln/autograd/random_replay.h"
#include "kiln/autograd/record.h"
#include "kiln/tensor/autocast.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/random_generator.h"

namespace kiln::autograd {

namespace {

// Grad mode on for the recompute (backward itself runs with it off).
class EnableGradGuard {
 public:
  EnableGradGuard() : previous_(grad_enabled()) { set_grad_enabled(true); }
  ~EnableGradGuard() { set_grad_enabled(previous_); }
  EnableGradGuard(const EnableGradGuard&) = delete;
  EnableGradGuard& operator=(const EnableGradGuard&) = delete;

 private:
  bool previous_;
};

// Puts the default generator at `key` for a scope, then back where it was.
class GeneratorPositionGuard {
 public:
  explicit GeneratorPositionGuard(RandomKey key) {
    Generator& g = default_generator();
    saved_ = {g.seed(), g.offset()};
    set(key);
  }
  ~GeneratorPositionGuard() { set(saved_); }
  GeneratorPositionGuard(const GeneratorPositionGuard&) = delete;
  GeneratorPositionGuard& operator=(const GeneratorPositionGuard&) = delete;

 private:
  static void set(RandomKey key) {
    Generator& g = default_generator();
    g.manual_seed(key.seed);
    g.set_offset(key.offset);
  }
  RandomKey saved_;
};

// What the backward needs to run fn again: the inputs (checked for in-place changes), the
// parameters found in the first run, the random and autocast state it ran under.
struct CheckpointState {
  CheckpointFunction fn;
  std::vector<SavedTensor> inputs;
  std::vector<bool> input_requires_grad;
  std::vector<Tensor> params;
  std::vector<std::size_t> recorded_outputs;  // fn's outputs that are node outputs, by index
  RandomKey generator;
  RandomTape tape;
  std::optional<DType> autocast;
};

Grads recompute_backward(CheckpointState& s, const Grads& output_grads) {
  const std::size_t n_in = s.inputs.size();
  std::vector<Tensor> xs(n_in);
  for (std::size_t i = 0; i < n_in; ++i) {
    const Tensor& saved = s.inputs[i].get("checkpoint");
    if (!saved.defined()) continue;
    xs[i] = saved.detach();
    if (s.input_requires_grad[i]) xs[i].requires_grad_(true);
  }
  std::vector<Tensor> outs;
  {
    EnableGradGuard grad_on;
    GeneratorPositionGuard generator(s.generator);
    RandomTapeScope replay(s.tape, /*replay=*/true);
    AutocastGuard autocast(s.autocast.value_or(DType::BF16), s.autocast.has_value());
    outs = s.fn(xs);
    KILN_CHECK(s.tape.replayed() == s.tape.draws().size(),
               "checkpoint: the recomputed function drew random numbers {} times, its first run {} times (its control "
               "flow must not change between the forward and the recompute)",
               s.tape.replayed(), s.tape.draws().size());
  }
  KILN_CHECK(outs.size() > (s.recorded_outputs.empty() ? 0 : s.recorded_outputs.back()),
             "checkpoint: the recomputed function returned {} outputs, fewer than its first run", outs.size());

  std::vector<Tensor> roots, root_grads;
  for (std::size_t k = 0; k < s.recorded_outputs.size(); ++k) {
    const Tensor& out = outs[s.recorded_outputs[k]];
    if (!output_grads[k].defined() || !out.defined() || !out.requires_grad()) continue;
    KILN_CHECK(out.shape() == output_grads[k].shape(),
               "checkpoint: recomputed output {} is {}, the first run's had shape {}", s.recorded_outputs[k],
               out.describe(), shape_str(output_grads[k].shape()));
    roots.push_back(out);
    root_grads.push_back(output_grads[k]);
  }
  Grads result(n_in + s.params.size());
  if (roots.empty()) return result;

  // The gradients of the recomputed graph with respect to its detached inputs and the
  // parameters, returned here (not accumulated): the outer backward sums them into the
  // parameters' accumulators, which run once per backward.
  std::vector<Tensor> targets;
  std::vector<std::size_t> slot;
  for (std::size_t i = 0; i < n_in; ++i)
    if (xs[i].defined() && xs[i].requires_grad()) {
      targets.push_back(xs[i]);
      slot.push_back(i);
    }
  for (std::size_t j = 0; j < s.params.size(); ++j) {
    targets.push_back(s.params[j]);
    slot.push_back(n_in + j);
  }
  std::vector<Tensor> unexpected;
  std::vector<Tensor> g = grad(roots, root_grads, targets, /*retain_graph=*/false, &unexpected);
  KILN_CHECK(unexpected.empty(),
             "checkpoint: the recomputed function used {}, which requires grad but was not used by its first run "
             "(its control flow must not change between the forward and the recompute)",
             unexpected.empty() ? "" : unexpected.front().describe());
  for (std::size_t t = 0; t < targets.size(); ++t) result[slot[t]] = std::move(g[t]);
  return result;
}

}  // namespace

std::vector<Tensor> checkpoint(const CheckpointFunction& fn, const std::vector<Tensor>& inputs) {
  KILN_CHECK(fn != nullptr, "checkpoint: the function is empty");
  if (!grad_enabled()) return fn(inputs);

  auto state = std::make_shared<CheckpointState>();
  state->fn = fn;
  state->generator = {default_generator().seed(), default_generator().offset()};
  state->autocast = autocast_dtype();
  std::vector<Tensor> detached(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    state->inputs.emplace_back(inputs[i]);
    state->input_requires_grad.push_back(inputs[i].defined() && inputs[i].requires_grad());
    if (inputs[i].defined()) detached[i] = inputs[i].detach();
  }

  std::vector<Tensor> outs;
  {
    NoGradGuard no_grad;
    GradInputObserver observer;
    RandomTapeScope record(state->tape, /*replay=*/false);
    outs = fn(detached);
    for (const Tensor& t : observer.seen()) {
      KILN_CHECK(t.is_leaf(),
                 "checkpoint: the function uses {}, which requires grad and is not a parameter, without taking it "
                 "as an input; pass it in `inputs`",
                 t.describe());
      state->params.push_back(t);
    }
  }

  // Outputs are fresh views (a returned input or parameter must not become the node's output).
  std::vector<Tensor*> node_outputs;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].defined()) continue;
    outs[k] = outs[k].detach();
    if (!is_floating(outs[k].dtype())) continue;
    state->recorded_outputs.push_back(k);
    node_outputs.push_back(&outs[k]);
  }
  std::vector<Tensor> edges = inputs;
  edges.insert(edges.end(), state->params.begin(), state->params.end());
  if (node_outputs.empty() || !needs_grad(edges)) return outs;
  record("CheckpointBackward", edges, node_outputs,
         [state](const Grads& output_grads) -> Grads { return recompute_backward(*state, output_grads); });
  return outs;
}

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>& inputs)>& fn,
                  const std::vector<Tensor>& inputs) {
  KILN_CHECK(fn != nullptr, "checkpoint: the function is empty");
  return checkpoint(CheckpointFunction([fn](const std::vector<Tensor>& in) { return std::vector<Tensor>{fn(in)}; }),
                    inputs)[0];
}

}  // namespace kiln::autograd
