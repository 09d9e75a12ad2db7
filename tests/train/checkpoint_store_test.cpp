// CheckpointStore and AsyncCheckpointSaver: what a kill, a full disk or a flipped bit leaves, and
// that load always finds the newest intact checkpoint and says why it passed the others over.
#include "kiln/train/checkpoint_store.h"

#include <nlohmann/json.hpp>

#include "kiln/runtime/backend.h"
#include "kiln/train/async_checkpoint_saver.h"
#include "kiln/train/fault_injection.h"
#include "train_test_util.h"

namespace kiln::train::testing {
namespace checkpoint_store_test {

class Store : public ::testing::Test {
 protected:
  void TearDown() override { set_fault_plan_for_testing(""); }
};

CheckpointContent content(std::int64_t iteration, float value) {
  CheckpointContent c;
  c.iteration = iteration;
  TensorDict weights, moments;
  weights.insert("model.w", Tensor::full({64, 33}, value));
  weights.insert("model.b", Tensor::from_vector<std::int64_t>({1, 2, iteration}));
  moments.insert("optimizer.m", Tensor::full({1000}, value * 2, DType::F64));
  c.files = {{"model.safetensors", weights}, {"optimizer.safetensors", moments}};
  c.metadata = {{"model", "test"}, {"value", std::to_string(value)}};
  return c;
}

float value_of(const LoadedCheckpoint& c) { return c.file("model.safetensors").at("model.w").to_vector<float>()[5]; }

void flip_byte(const fs::path& file, std::uintmax_t at) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(at));
  char c = 0;
  f.get(c);
  f.seekp(static_cast<std::streamoff>(at));
  f.put(static_cast<char>(c ^ 1));
}

TEST_F(Store, SavesAFolderWithAManifestAndLoadsItBack) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  const fs::path dir = store.save(content(120, 1.5f));
  EXPECT_EQ(dir, root / "iter_0000120");
  EXPECT_EQ(read_file(root / "latest_checkpointed_iteration.txt"), "120");
  auto manifest = nlohmann::json::parse(read_file(dir / "manifest.json"));
  EXPECT_EQ(manifest["iteration"], 120);
  ASSERT_EQ(manifest["files"].size(), 2u);
  EXPECT_EQ(manifest["files"][0]["name"], "model.safetensors");
  EXPECT_EQ(manifest["files"][0]["bytes"].get<std::uintmax_t>(), fs::file_size(dir / "model.safetensors"));
  EXPECT_EQ(manifest["files"][0]["crc32c"].get<std::string>().size(), 8u);
  EXPECT_EQ(manifest["metadata"]["value"], "1.500000");

  auto loaded = store.load_newest_intact();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->iteration, 120);
  EXPECT_TRUE(loaded->passed_over.empty());
  EXPECT_EQ(value_of(*loaded), 1.5f);
  EXPECT_EQ(loaded->file("model.safetensors").at("model.b").to_vector<std::int64_t>(),
            (std::vector<std::int64_t>{1, 2, 120}));
  EXPECT_EQ(loaded->file("optimizer.safetensors").at("optimizer.m").to_vector<double>()[999], 3.0);
  EXPECT_EQ(loaded->metadata.at("model"), "test");
  EXPECT_FALSE(store.verify(120).has_value());
  EXPECT_CONTAINS(error_of([&] { loaded->file("nope.safetensors"); }), "has no nope.safetensors");
}

TEST_F(Store, ACorruptedFileIsDetectedAndThePreviousCheckpointUsed) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  store.save(content(10, 1.0f));
  store.save(content(20, 2.0f));
  flip_byte(root / "iter_0000020" / "model.safetensors", 3000);
  auto loaded = store.load_newest_intact();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->iteration, 10);
  EXPECT_EQ(value_of(*loaded), 1.0f);
  ASSERT_EQ(loaded->passed_over.size(), 1u);
  EXPECT_CONTAINS(loaded->passed_over[0], "iter_0000020: model.safetensors: crc32c");
  EXPECT_CONTAINS(loaded->passed_over[0], "the data is damaged");
  ASSERT_TRUE(store.verify(20).has_value());
}

TEST_F(Store, TruncatedMissingAndManifestlessCheckpointsArePassedOver) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  store.save(content(1, 1.0f));
  store.save(content(2, 2.0f));
  store.save(content(3, 3.0f));
  store.save(content(4, 4.0f));
  fs::resize_file(root / "iter_0000004" / "optimizer.safetensors", 100);
  fs::remove(root / "iter_0000003" / "model.safetensors");
  fs::remove(root / "iter_0000002" / "manifest.json");
  auto loaded = store.load_newest_intact();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->iteration, 1);
  ASSERT_EQ(store.passed_over().size(), 3u);
  EXPECT_CONTAINS(store.passed_over()[0], "iter_0000004: optimizer.safetensors has 100 bytes");
  EXPECT_CONTAINS(store.passed_over()[1], "iter_0000003: model.safetensors is missing");
  EXPECT_CONTAINS(store.passed_over()[2], "iter_0000002: no manifest.json");
  fs::remove(root / "iter_0000001" / "manifest.json");
  EXPECT_FALSE(store.load_newest_intact().has_value());
  EXPECT_EQ(store.passed_over().size(), 4u);
}

TEST_F(Store, AFullDiskLeavesThePreviousCheckpointIntactWithAClearError) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  store.save(content(10, 1.0f));
  set_fault_plan_for_testing("disk_full_in_save@2");
  const std::string error = error_of([&] { store.save(content(20, 2.0f)); });
  EXPECT_CONTAINS(error, "saving checkpoint " + (root / "iter_0000020").string() + " failed");
  EXPECT_CONTAINS(error, "No space left on device");
  EXPECT_CONTAINS(error, "the newest is " + (root / "iter_0000010").string());
  EXPECT_EQ(store.iterations(), (std::vector<std::int64_t>{10}));
  for (const auto& entry : fs::directory_iterator(root))
    EXPECT_FALSE(entry.path().filename().string().starts_with(".")) << "temporary left: " << entry.path();
  EXPECT_EQ(read_file(root / "latest_checkpointed_iteration.txt"), "10");
  auto loaded = store.load_newest_intact();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->iteration, 10);
  EXPECT_TRUE(loaded->passed_over.empty());
}

TEST_F(Store, KeepLastDeletesTheOldestOnly) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root, {.keep_last = 2});
  for (int i = 1; i <= 5; ++i) store.save(content(i * 10, static_cast<float>(i)));
  EXPECT_EQ(store.iterations(), (std::vector<std::int64_t>{40, 50}));
}

TEST_F(Store, KeepLastNeverDeletesTheOnlyIntactCheckpoint) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root, {.keep_last = 1});
  store.save(content(10, 1.0f));
  set_fault_plan_for_testing("corrupt_checkpoint@2");
  ::testing::internal::CaptureStderr();
  store.save(content(20, 2.0f));  // damaged right after it is written
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_CONTAINS(err, "does not verify");
  EXPECT_EQ(store.iterations(), (std::vector<std::int64_t>{10, 20}));
  auto loaded = store.load_newest_intact();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(loaded->iteration, 10);
}

TEST_F(Store, SavingAnIterationAgainReplacesIt) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  store.save(content(7, 1.0f));
  store.save(content(7, 9.0f));
  auto loaded = store.load_newest_intact();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(value_of(*loaded), 9.0f);
  EXPECT_EQ(store.iterations(), (std::vector<std::int64_t>{7}));
}

TEST_F(Store, TemporariesOfAKilledSaveAreRemovedOnOpen) {
  const fs::path root = scratch_dir() / "ckpt";
  const fs::path stale = root / (".iter_0000009.tmp." + std::to_string(dead_pid()));
  fs::create_directories(stale);
  write_file(stale / "model.safetensors", "half a file");
  ::testing::internal::CaptureStdout();
  CheckpointStore store(root);
  EXPECT_CONTAINS(::testing::internal::GetCapturedStdout(), "stale temporar");
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(store.iterations().empty());
}

TEST_F(Store, IterationFolderNames) {
  EXPECT_EQ(iteration_dir_name(0), "iter_0000000");
  EXPECT_EQ(iteration_dir_name(123456789), "iter_123456789");
  EXPECT_EQ(parse_iteration_dir("iter_0000123"), 123);
  EXPECT_FALSE(parse_iteration_dir("iter_"));
  EXPECT_FALSE(parse_iteration_dir("iter_12x"));
  EXPECT_FALSE(parse_iteration_dir(".iter_0000001.tmp.5"));
}

TEST_F(Store, AnAsyncSaveWritesTheStateOfTheMomentItWasAskedFor) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  AsyncCheckpointSaver saver(store, /*async=*/true);
  CheckpointContent live = content(5, 1.0f);
  const SaveStall stall = saver.save(live);
  EXPECT_GT(stall.bytes, 64u * 33 * 4);
  EXPECT_EQ(stall.write_seconds, 0.0) << "an async save does not write on the caller's thread";
  // Training goes on and changes the weights in place while the save is written.
  live.files[0].second.at("model.w").fill_(42.0f);
  saver.wait();
  auto loaded = store.load_newest_intact();
  ASSERT_TRUE(loaded);
  EXPECT_EQ(value_of(*loaded), 1.0f);
  // A second save while one is in flight waits for it; both land.
  saver.save(content(6, 6.0f));
  saver.save(content(7, 7.0f));
  saver.wait();
  EXPECT_EQ(store.iterations(), (std::vector<std::int64_t>{5, 6, 7}));
  EXPECT_EQ(value_of(*store.load_newest_intact()), 7.0f);
}

// pretrain-gpt reserves the host arena in the background after its first step, so that the first
// save is a copy into it, not an allocation (which page-locking makes seconds long for a large state).
TEST_F(Store, AReservedArenaTakesTheFirstAsyncSaveWithoutGrowing) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  AsyncCheckpointSaver saver(store, /*async=*/true);
  EXPECT_EQ(saver.arena_bytes(), 0u);
  saver.reserve(content(1, 1.0f));
  saver.wait();
  const std::size_t reserved = saver.arena_bytes();
  EXPECT_GE(reserved, (64u * 33 * 4) + 1000u * 8);
  saver.save(content(4, 4.0f));
  saver.wait();
  EXPECT_EQ(saver.arena_bytes(), reserved) << "the save used the reserved arena";
  EXPECT_EQ(value_of(*store.load_newest_intact()), 4.0f);
  saver.reserve(content(5, 5.0f));  // already large enough: nothing to do
  saver.wait();
  EXPECT_EQ(saver.arena_bytes(), reserved);
  AsyncCheckpointSaver sync(store, /*async=*/false);
  sync.reserve(content(1, 1.0f));
  EXPECT_EQ(sync.arena_bytes(), 0u) << "a synchronous saver has no arena";
}

// On a GPU the snapshot goes through the pinned host arena; the checkpoint holds the values of
// the moment of the save, byte for byte.
TEST_F(Store, AnAsyncSaveOfDeviceTensors) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA device";
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  AsyncCheckpointSaver saver(store, /*async=*/true);
  CheckpointContent host = content(3, 2.5f), live = host;
  for (auto& [file, tensors] : live.files) {
    TensorDict on_device;
    for (const auto& [name, t] : tensors) on_device.insert(name, t.to(Device::cuda(0)));
    tensors = on_device;
  }
  saver.save(live);
  live.files[0].second.at("model.w").fill_(-1.0f);
  saver.wait();
  auto loaded = store.load_newest_intact();
  ASSERT_TRUE(loaded);
  for (const auto& [file, tensors] : host.files)
    for (const auto& [name, t] : tensors)
      EXPECT_EQ(loaded->file(file).at(name).to_vector<double>(), t.to_vector<double>()) << name;
}

TEST_F(Store, AnAsyncSaveErrorSurfacesAtTheNextCall) {
  const fs::path root = scratch_dir() / "ckpt";
  CheckpointStore store(root);
  AsyncCheckpointSaver saver(store, /*async=*/true);
  saver.save(content(1, 1.0f));
  saver.wait();
  set_fault_plan_for_testing("disk_full_in_save@2");
  saver.save(content(2, 2.0f));
  const std::string error = error_of([&] { saver.wait(); });
  EXPECT_CONTAINS(error, "the background save of iteration 2 failed");
  EXPECT_CONTAINS(error, "No space left on device");
  EXPECT_CONTAINS(error, "iter_0000001");
  EXPECT_NO_THROW(saver.wait()) << "reported once";
  EXPECT_EQ(store.load_newest_intact()->iteration, 1);
}

TEST_F(Store, MalformedFaultPlansAreRefused) {
  EXPECT_CONTAINS(error_of([] { set_fault_plan_for_testing("nan_loss"); }), "'nan_loss' has no '@<number>'");
  EXPECT_CONTAINS(error_of([] { set_fault_plan_for_testing("meteor@3"); }), "unknown fault 'meteor'");
  EXPECT_CONTAINS(error_of([] { set_fault_plan_for_testing("crash@0"); }), "'0' is not a whole number >= 1");
  set_fault_plan_for_testing("spike@3,nan_loss@4");
  EXPECT_FALSE(fault_fires(FaultKind::Spike, 2));
  EXPECT_TRUE(fault_fires(FaultKind::Spike, 3));
  EXPECT_FALSE(fault_fires(FaultKind::Spike, 3)) << "once";
  EXPECT_TRUE(loss_fault_factor(4).has_value());
  set_fault_plan_for_testing("");
  EXPECT_FALSE(loss_fault_factor(4).has_value());
}

}  // namespace checkpoint_store_test
}  // namespace kiln::train::testing
