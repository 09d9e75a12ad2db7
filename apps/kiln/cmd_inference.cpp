// `kiln inference`: evaluate a trained CIFAR-10 model: accuracy, per-class accuracy, confusion
// matrix; --benchmark adds latency/throughput; --visualize writes inference_results.png.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>

#include "commands.h"
#include "kiln/autograd/functions.h"
#include "kiln/io/image_grid.h"
#include "kiln/models/cifar_models.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/event.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/cifar10_tensors.h"
#include "kiln/train/classifier_eval.h"
#include "kiln/vision/cifar10_format.h"
#include "kiln/vision/image_augment.h"
#include "number_checks.h"

namespace kiln::cli {

namespace {

struct InferenceOptions {
  std::string model = "simple_cnn";
  std::string checkpoint;  // default: runs/cifar10/checkpoints/best.safetensors
  int batch_size = 1000;
  bool benchmark = false;
  bool visualize = false;
  std::string device;
  std::filesystem::path data_dir = "data/cifar10";
  std::filesystem::path out_dir = "runs/cifar10";
  std::int64_t limit_test = 0;
  bool download = true;
};

// Median milliseconds of one forward pass over `batch` images, timed with device events.
double median_forward_ms(nn::UnaryModule& model, const Tensor& x, int reps) {
  NoGradGuard no_grad;
  Device d = x.device();
  for (int i = 0; i < 3; ++i) model.forward(x);
  synchronize(d);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    Event a(d), b(d);
    a.record();
    model.forward(x);
    b.record();
    ms.push_back(b.elapsed_ms(a));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run_inference(const InferenceOptions& o) {
  Device device = o.device.empty() ? (device_count(DeviceKind::CUDA) > 0 ? Device::cuda(0) : Device::cpu())
                                   : Device::parse(o.device);
  auto model = models::make_cifar_model(o.model);
  std::filesystem::path ckpt =
      o.checkpoint.empty() ? o.out_dir / "checkpoints" / "best.safetensors" : std::filesystem::path(o.checkpoint);
  auto meta = train::load_checkpoint(ckpt, o.model, *model, nullptr);
  model->to(device);
  model->eval();
  std::string norm = meta.count("normalization") ? meta.at("normalization") : "half";
  KILN_CHECK(norm == "half" || norm == "cifar",
             "checkpoint {}: metadata 'normalization' is '{}'; expected half or cifar", ckpt.string(), norm);
  auto test = train::load_cifar10(o.data_dir, false, device, o.limit_test, o.download);
  const std::int64_t n = test.images.shape()[0];
  fmt::print("{} from {} (epoch {}) on {}, {} test images\n", o.model, ckpt.string(),
             meta.count("epoch") ? meta.at("epoch") : "?", device.str(), n);

  auto normalize = train::cifar10_normalization(norm);
  auto start = std::chrono::steady_clock::now();
  auto eval = train::evaluate_classifier(*model, test.images, test.labels, normalize, o.batch_size, true);
  double all_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto labels = test.labels.to_vector<std::int64_t>();

  constexpr int k = 10;
  std::vector<std::array<int, k>> confusion(k);
  for (auto& row : confusion) row.fill(0);
  for (std::int64_t i = 0; i < n; ++i) ++confusion[labels[i]][eval.predictions[i]];
  fmt::print("\nTest accuracy: {:.2f}% ({} images), loss {:.4f}\n\nPer-class accuracy:\n", eval.accuracy * 100, n,
             eval.loss);
  for (int c = 0; c < k; ++c) {
    int total = 0;
    for (int p = 0; p < k; ++p) total += confusion[c][p];
    fmt::print("  {:<11} {:6.2f}% ({} images)\n", vision::cifar10::kClassNames[c],
               total ? 100.0 * confusion[c][c] / total : 0.0, total);
  }
  fmt::print("\nConfusion matrix (rows: true class, columns: predicted)\n{:>11}", "");
  for (int p = 0; p < k; ++p) fmt::print(" {:>5.5}", vision::cifar10::kClassNames[p]);
  fmt::print("\n");
  for (int c = 0; c < k; ++c) {
    fmt::print("{:>11}", vision::cifar10::kClassNames[c]);
    for (int p = 0; p < k; ++p) fmt::print(" {:>5}", confusion[c][p]);
    fmt::print("\n");
  }

  if (o.benchmark) {
    fmt::print("\nBenchmark on {} (forward only, CUDA events / host clock, median)\n", device.str());
    backend_for(device).reset_peak_memory(device.index);
    auto normal = normalize;
    for (int b : {1, 8, 32, 64, 128, 256, 512, 1024}) {
      if (b > n) break;
      Tensor idx = Tensor::arange(0, b, 1, DType::I64, device);
      Tensor x = vision::augment_images(test.images, idx, normal);
      double ms = median_forward_ms(*model, x, b <= 64 ? 50 : 20);
      if (b == 1) fmt::print("  single-image latency: {:.3f} ms\n", ms);
      fmt::print("  batch {:>5}: {:8.3f} ms  {:10.0f} images/s\n", b, ms, b * 1000.0 / ms);
    }
    auto mem = backend_for(device).memory_stats(device.index);
    fmt::print("  peak memory: {:.1f} MiB\n", mem.peak_allocated / 1048576.0);
    fmt::print("  all {} test images (batch {}, incl. preprocessing and metrics): {:.3f} s\n", n, o.batch_size,
               all_seconds);
  }

  if (o.visualize) {
    auto host = test.images.to(Device::cpu());
    const auto* px = static_cast<const std::uint8_t*>(host.data_ptr());
    std::vector<io::PredictionSample> samples;
    for (std::int64_t i = 0; i < std::min<std::int64_t>(n, 32); ++i)
      samples.push_back({px + i * 3 * 32 * 32, static_cast<int>(labels[i]), static_cast<int>(eval.predictions[i]),
                         eval.confidences[i]});
    io::PredictionGridOptions grid;
    for (auto name : vision::cifar10::kClassNames) grid.class_names.emplace_back(name);
    grid.title = fmt::format("{} on CIFAR-10 test images", o.model);
    std::filesystem::create_directories(o.out_dir);
    auto png = o.out_dir / "inference_results.png";
    io::write_prediction_grid(png, samples, grid);
    fmt::print("\nWrote {}\n", png.string());
  }
}

}  // namespace

void add_inference(CLI::App& app) {
  auto o = std::make_shared<InferenceOptions>();
  auto* cmd = app.add_subcommand("inference", "Evaluate a trained CIFAR-10 model; benchmark and visualise it");
  cmd->add_option("--model", o->model, fmt::format("model: {}", fmt::join(models::cifar_model_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--checkpoint", o->checkpoint, "weights (default: <out-dir>/checkpoints/best.safetensors)");
  cmd->add_option("--batch-size", o->batch_size, "evaluation batch size")
      ->check(whole_number_at_least(1))
      ->capture_default_str();
  cmd->add_flag("--benchmark", o->benchmark, "latency, throughput over batch sizes 1-1024, peak memory");
  cmd->add_flag("--visualize", o->visualize, "write <out-dir>/inference_results.png");
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N");
  cmd->add_option("--data-dir", o->data_dir, "CIFAR-10 folder")->capture_default_str();
  cmd->add_option("--out-dir", o->out_dir, "where training wrote its checkpoints; plots go here")
      ->capture_default_str();
  cmd->add_option("--limit-test", o->limit_test, "use only the first N test images (0: all)")
      ->check(whole_number_at_least(0));
  cmd->add_flag("!--no-download", o->download, "fail instead of fetching missing data");
  cmd->callback([o] { run_inference(*o); });
}

}  // namespace kiln::cli
