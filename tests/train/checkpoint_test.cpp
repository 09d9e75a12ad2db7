// Loading a training checkpoint converts nothing and skips nothing silently.
#include "kiln/train/checkpoint.h"

#include "kiln/io/safetensors.h"
#include "kiln/models/cifar_models.h"
#include "train_test_util.h"

namespace kiln::train::testing {
namespace checkpoint_test {

struct Saved {
  fs::path file;
  io::SafetensorsFile contents;
};

// A simple_cnn checkpoint with Adam state (one step taken, so the moments exist).
Saved saved_checkpoint(const fs::path& dir) {
  auto model = models::make_cifar_model("simple_cnn");
  optim::Adam adam(model->parameters());
  for (Tensor p : model->parameters()) p.set_grad(Tensor::ones(p.shape()));
  adam.step();
  const fs::path file = dir / "ck.safetensors";
  save_checkpoint(file, *model, &adam, {{"model", "simple_cnn"}, {"epoch", "1"}});
  return {file, io::load_safetensors(file.string())};
}

TEST(Checkpoint, ATensorOfAnotherDtypeIsRefusedEvenWithTheSameByteCount) {
  Saved s = saved_checkpoint(scratch_dir());
  const std::string name = s.contents.tensors.keys().front();  // a float32 weight
  ASSERT_TRUE(name.starts_with("model."));
  const Tensor& w = s.contents.tensors.at(name);
  ASSERT_EQ(w.dtype(), DType::F32);
  TensorDict changed;
  for (const auto& [k, t] : s.contents.tensors) changed.insert(k, k == name ? t.to(DType::I32) : t);  // 4 bytes too
  io::save_safetensors(s.file.string(), changed, s.contents.metadata);
  auto model = models::make_cifar_model("simple_cnn");
  const std::string error = error_of([&] { load_checkpoint(s.file, "simple_cnn", *model, nullptr); });
  EXPECT_CONTAINS(error, "checkpoint " + s.file.string() + ": tensor '" + name + "' is int32");
  EXPECT_CONTAINS(error, "is float32");
}

TEST(Checkpoint, OptimizerStateOfAnotherDtypeIsRefused) {
  Saved s = saved_checkpoint(scratch_dir());
  TensorDict changed;
  for (const auto& [k, t] : s.contents.tensors)
    changed.insert(k, k == "optimizer.state.0.exp_avg" ? t.to(DType::I32) : t);
  io::save_safetensors(s.file.string(), changed, s.contents.metadata);
  auto model = models::make_cifar_model("simple_cnn");
  optim::Adam adam(model->parameters());
  const std::string error = error_of([&] { load_checkpoint(s.file, "simple_cnn", *model, &adam); });
  EXPECT_CONTAINS(error, "checkpoint " + s.file.string());
  EXPECT_CONTAINS(error, "state.0.exp_avg is int32 but parameter 0 is float32");
}

TEST(Checkpoint, IncompleteOptimizerStateIsRefusedNamingWhatIsMissing) {
  Saved s = saved_checkpoint(scratch_dir());
  TensorDict changed;
  for (const auto& [k, t] : s.contents.tensors)
    if (k != "optimizer.state.3.exp_avg_sq") changed.insert(k, t);
  io::save_safetensors(s.file.string(), changed, s.contents.metadata);
  auto model = models::make_cifar_model("simple_cnn");
  optim::Adam adam(model->parameters());
  const std::string error = error_of([&] { load_checkpoint(s.file, "simple_cnn", *model, &adam); });
  EXPECT_CONTAINS(error, "the Adam state is incomplete (1 of ");
  EXPECT_CONTAINS(error, "optimizer.state.3.exp_avg_sq");
  EXPECT_CONTAINS(error, "--reset-optimizer");
  // Without an optimizer (inference, or --reset-optimizer) the weights load.
  EXPECT_NO_THROW(load_checkpoint(s.file, "simple_cnn", *model, nullptr));
}

}  // namespace checkpoint_test
}  // namespace kiln::train::testing
