#include "kiln/train/gpt_trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <string_view>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/io/atomic_file.h"
#include "kiln/io/jsonl_writer.h"
#include "kiln/io/line_plot.h"
#include "kiln/io/tfevents_writer.h"
#include "kiln/models/transformer_linear.h"
#include "kiln/optim/clip_grad.h"
#include "kiln/optim/flat_optimizer.h"
#include "kiln/optim/grad_buffers.h"
#include "kiln/optim/lr_scheduler.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/elapsed.h"
#include "kiln/te/fp8_primary_weights.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/train/async_checkpoint_saver.h"
#include "kiln/train/data_parallel.h"
#include "kiln/train/dualpipe_grads.h"
#include "kiln/train/fault_injection.h"
#include "kiln/train/gpt_checkpoint.h"
#include "kiln/train/heartbeat.h"
#include "kiln/train/nonfinite_guard.h"
#include "kiln/train/pipeline_parallel_state.h"
#include "kiln/train/pipeline_timeline_plot.h"
#include "kiln/train/tensor_parallel_state.h"

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// --exit-signal-handler: the signal only sets this; the loop looks at it between iterations.
volatile std::sig_atomic_t exit_signal = 0;
extern "C" void note_exit_signal(int signal) { exit_signal = signal; }

// Installs the handler for SIGTERM and SIGINT for the lifetime of the run, then puts the previous back.
class ExitSignalScope {
 public:
  explicit ExitSignalScope(bool on) : on_(on) {
    if (!on_) return;
    exit_signal = 0;
    old_term_ = std::signal(SIGTERM, note_exit_signal);
    old_int_ = std::signal(SIGINT, note_exit_signal);
  }
  ~ExitSignalScope() {
    if (!on_) return;
    std::signal(SIGTERM, old_term_);
    std::signal(SIGINT, old_int_);
  }
  ExitSignalScope(const ExitSignalScope&) = delete;
  ExitSignalScope& operator=(const ExitSignalScope&) = delete;

 private:
  bool on_;
  void (*old_term_)(int) = SIG_DFL;
  void (*old_int_)(int) = SIG_DFL;
};

std::int64_t total_iterations(const GptTrainOptions& o) {
  return o.train_iters > 0 ? o.train_iters : o.train_samples / o.effective_global_batch();
}

void check_options(const GptTrainOptions& o) {
  KILN_CHECK(o.micro_batch_size >= 1, "--micro-batch-size must be >= 1, got {}", o.micro_batch_size);
  KILN_CHECK(o.global_batch_size >= 0, "--global-batch-size must be >= 1, got {}", o.global_batch_size);
  KILN_CHECK(o.effective_global_batch() % o.micro_batch_size == 0,
             "--global-batch-size ({}) must be a multiple of --micro-batch-size ({}) (one GPU: the global batch is "
             "that many micro-batches, accumulated)",
             o.global_batch_size, o.micro_batch_size);
  KILN_CHECK(o.effective_global_batch() % (o.micro_batch_size * o.data_parallel_size()) == 0,
             "--global-batch-size ({}) must be a multiple of --micro-batch-size ({}) x the data-parallel size ({} "
             "ranks): each rank accumulates the same number of micro-batches",
             o.effective_global_batch(), o.micro_batch_size, o.data_parallel_size());
  KILN_CHECK(!o.overlap_param_gather || o.use_distributed_optimizer,
             "--overlap-param-gather needs --use-distributed-optimizer (it overlaps the parameters' all-gather)");
  if (o.pipeline_parallel_size() > 1) {
    KILN_CHECK(!o.zero_bubble_schedule || o.num_layers_per_virtual_pipeline_stage == 0,
               "--pipeline-schedule zero-bubble runs one model chunk per rank: it does not take "
               "--num-layers-per-virtual-pipeline-stage ({})",
               o.num_layers_per_virtual_pipeline_stage);
  }
  KILN_CHECK(!o.zero_bubble_schedule || o.pipeline_parallel_size() > 1,
             "--pipeline-schedule zero-bubble needs --pipeline-model-parallel-size above 1");
  KILN_CHECK(!o.dualpipe_schedule || o.pipeline_parallel_size() > 1,
             "--pipeline-schedule dualpipe needs --pipeline-model-parallel-size above 1 (an even number of stages)");
  KILN_CHECK(!o.dualpipe_schedule || !o.zero_bubble_schedule, "give one --pipeline-schedule: dualpipe or zero-bubble");
  KILN_CHECK(!o.dualpipe_schedule || o.num_layers_per_virtual_pipeline_stage == 0,
             "--pipeline-schedule dualpipe holds two model chunks per rank of its own (stage r and a copy of stage "
             "p - 1 - r): it does not take --num-layers-per-virtual-pipeline-stage ({})",
             o.num_layers_per_virtual_pipeline_stage);
  KILN_CHECK(o.profile_schedule.empty() || o.pipeline_parallel_size() > 1,
             "--profile-schedule draws the pipeline schedule: it needs --pipeline-model-parallel-size above 1");
  KILN_CHECK(o.profile_schedule_step >= 1, "--profile-schedule-step must be >= 1, got {}", o.profile_schedule_step);
  KILN_CHECK(o.ddp_bucket_size >= 0, "--ddp-bucket-size must be >= 1 (elements), got {}", o.ddp_bucket_size);
  KILN_CHECK((o.train_iters > 0) != (o.train_samples > 0), "give exactly one of --train-iters and --train-samples");
  KILN_CHECK(o.train_samples == 0 || o.train_samples >= o.effective_global_batch(),
             "--train-samples ({}) is less than one global batch ({})", o.train_samples, o.effective_global_batch());
  KILN_CHECK(std::isfinite(o.lr) && o.lr > 0, "--lr must be a number > 0, got {}", o.lr);
  KILN_CHECK(std::isfinite(o.min_lr) && o.min_lr >= 0 && o.min_lr <= o.lr,
             "--min-lr must be from 0 to --lr ({}), got {}", o.lr, o.min_lr);
  KILN_CHECK(o.lr_warmup_iters >= 0, "--lr-warmup-iters must be >= 0, got {}", o.lr_warmup_iters);
  KILN_CHECK(o.lr_decay_iters >= 0, "--lr-decay-iters must be >= 0, got {}", o.lr_decay_iters);
  KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "--weight-decay must be >= 0, got {}",
             o.weight_decay);
  KILN_CHECK(o.adam_beta1 >= 0 && o.adam_beta1 < 1, "--adam-beta1 must be in [0, 1), got {}", o.adam_beta1);
  KILN_CHECK(o.adam_beta2 >= 0 && o.adam_beta2 < 1, "--adam-beta2 must be in [0, 1), got {}", o.adam_beta2);
  KILN_CHECK(std::isfinite(o.adam_eps) && o.adam_eps > 0, "--adam-eps must be > 0, got {}", o.adam_eps);
  KILN_CHECK(std::isfinite(o.clip_grad) && o.clip_grad >= 0, "--clip-grad must be >= 0 (0: none), got {}", o.clip_grad);
  KILN_CHECK(o.log_interval >= 1, "--log-interval must be >= 1, got {}", o.log_interval);
  KILN_CHECK(o.eval_interval >= 1, "--eval-interval must be >= 1, got {}", o.eval_interval);
  KILN_CHECK(o.eval_iters >= 0, "--eval-iters must be >= 0, got {}", o.eval_iters);
  KILN_CHECK(o.exit_interval >= 0, "--exit-interval must be >= 0, got {}", o.exit_interval);
  KILN_CHECK(o.save_interval >= 0, "--save-interval must be >= 0, got {}", o.save_interval);
  KILN_CHECK(o.save_interval == 0 || !o.save.empty(), "--save-interval needs --save (the folder to write to)");
  KILN_CHECK(o.keep_last >= 0, "--keep-last must be >= 0 (0: keep all), got {}", o.keep_last);
  KILN_CHECK(!(o.finetune && o.load.empty()), "--finetune needs --load (the checkpoint to start from)");
  KILN_CHECK(!(o.no_load_optim && o.load.empty()), "--no-load-optim needs --load");
  if (o.rewind.enabled) {
    check_rewind_options(o.rewind);
    KILN_CHECK(
        o.rewind.snapshot_interval >= 1,
        "--rewind-snapshot-interval must be >= 1 for pretrain-gpt (it rolls back to in-memory snapshots), got {}",
        o.rewind.snapshot_interval);
  }
  for (std::int64_t s : o.skip_batches) KILN_CHECK(s >= 1, "--skip-batches: steps count from 1, got {}", s);
  KILN_CHECK(!o.data_path.empty(), "--data-path is required (the prefix preprocess-data printed)");
}

std::unique_ptr<optim::WarmupDecayLR> make_schedule(const GptTrainOptions& o, std::int64_t iterations) {
  optim::WarmupDecayOptions w;
  w.max_lr = o.lr;
  w.min_lr = o.min_lr;
  w.warmup_iters = o.lr_warmup_iters;
  w.decay_iters = o.lr_decay_iters > 0 ? o.lr_decay_iters : iterations;
  const std::string& s = o.lr_decay_style;
  if (s == "constant")
    w.style = optim::DecayStyle::Constant;
  else if (s == "linear")
    w.style = optim::DecayStyle::Linear;
  else if (s == "cosine")
    w.style = optim::DecayStyle::Cosine;
  else if (s == "inverse-square-root")
    w.style = optim::DecayStyle::InverseSquareRoot;
  else if (s == "WSD")
    w.style = optim::DecayStyle::WSD;
  else
    KILN_FAIL("--lr-decay-style: unknown style '{}': constant, linear, cosine, inverse-square-root or WSD", s);
  if (w.style == optim::DecayStyle::WSD) {
    const std::string& ws = o.lr_wsd_decay_style;
    w.wsd_style = ws == "exponential" ? optim::WsdDecayStyle::Exponential
                  : ws == "linear"    ? optim::WsdDecayStyle::Linear
                  : ws == "cosine"    ? optim::WsdDecayStyle::Cosine
                  : ws == "minus_sqrt"
                      ? optim::WsdDecayStyle::MinusSqrt
                      : throw Error(fmt::format("--lr-wsd-decay-style: unknown style '{}': exponential, linear, "
                                                "cosine or minus_sqrt",
                                                ws));
    KILN_CHECK(o.lr_wsd_decay_iters > 0, "--lr-decay-style WSD needs --lr-wsd-decay-iters (the anneal's length)");
    w.wsd_decay_iters = o.lr_wsd_decay_iters;
  }
  KILN_CHECK(w.style == optim::DecayStyle::Constant || w.style == optim::DecayStyle::InverseSquareRoot ||
                 w.decay_iters > w.warmup_iters,
             "--lr-decay-iters ({}) must exceed --lr-warmup-iters ({})", w.decay_iters, w.warmup_iters);
  KILN_CHECK(w.style != optim::DecayStyle::WSD || w.wsd_decay_iters <= w.decay_iters - w.warmup_iters,
             "--lr-wsd-decay-iters ({}) must not exceed --lr-decay-iters - --lr-warmup-iters ({})", w.wsd_decay_iters,
             w.decay_iters - w.warmup_iters);
  return std::make_unique<optim::WarmupDecayLR>(w);
}

// Megatron's parameter groups: no weight decay on biases and 1-D parameters (norm weights).
std::vector<optim::ParamGroup> weight_decay_groups(const nn::Module& model, double weight_decay) {
  optim::ParamGroup decay, no_decay;
  decay.weight_decay = weight_decay;
  no_decay.weight_decay = 0.0;
  for (const auto& [name, p] : model.named_parameters()) {
    if (!p.requires_grad()) continue;
    (p.dim() == 1 || name.ends_with(".bias") ? no_decay : decay).params.push_back(p);
  }
  std::vector<optim::ParamGroup> groups;
  if (!decay.params.empty()) groups.push_back(std::move(decay));
  if (!no_decay.params.empty()) groups.push_back(std::move(no_decay));
  return groups;
}

// A micro-batch: tokens and labels [B, T] (the labels are the tokens shifted by one), mask of ones.
struct Batch {
  Tensor tokens, labels, loss_mask;
};

// Reads the samples of whole global batches: prepare() gathers them on the host (while the device
// still runs the previous step), upload() copies them in one transfer per tensor (a host-to-device
// copy from pageable memory waits for the device: once per global batch, not per micro-batch) and
// hands out the micro-batches as views.
class BatchReader {
 public:
  // Data parallelism: rank `rank` of `ranks` reads, of each group of `ranks` consecutive
  // micro-batches, the rank-th (Megatron's MegatronPretrainingSampler).
  BatchReader(std::int64_t micro_batch, std::int64_t seq_length, Device device, int rank = 0, int ranks = 1)
      : micro_batch_(micro_batch), seq_length_(seq_length), device_(device), rank_(rank), ranks_(ranks) {}

  void prepare(const data::TokenDataset& dataset, std::int64_t first_sample, std::int64_t micro_batches) {
    const std::size_t t = static_cast<std::size_t>(seq_length_);
    rows_ = micro_batches * micro_batch_;
    tokens_.resize(static_cast<std::size_t>(rows_) * t);
    labels_.resize(tokens_.size());
    for (std::int64_t b = 0; b < rows_; ++b) {
      const std::int64_t m = b / micro_batch_, j = b % micro_batch_;
      const std::int64_t index = first_sample + (m * ranks_ + rank_) * micro_batch_ + j;
      dataset.sample(index, sample_);
      KILN_CHECK(sample_.size() == t + 1, "sample {} has {} tokens, expected --seq-length + 1 = {}", index,
                 sample_.size(), t + 1);
      for (std::size_t i = 0; i < t; ++i) {
        tokens_[static_cast<std::size_t>(b) * t + i] = sample_[i];
        labels_[static_cast<std::size_t>(b) * t + i] = sample_[i + 1];
      }
    }
  }

  std::vector<Batch> upload() {
    if (!mask_.defined()) mask_ = Tensor::ones({micro_batch_, seq_length_}, DType::F32, device_);
    Tensor tokens = Tensor::from_vector(tokens_, {rows_, seq_length_}, device_);
    Tensor labels = Tensor::from_vector(labels_, {rows_, seq_length_}, device_);
    std::vector<Batch> out;
    for (std::int64_t r = 0; r < rows_; r += micro_batch_)
      out.push_back({tokens.slice(0, r, r + micro_batch_), labels.slice(0, r, r + micro_batch_), mask_});
    return out;
  }

  // One micro-batch: global micro-batch (m * ranks + rank) of the samples from first_sample.
  Batch read(const data::TokenDataset& dataset, std::int64_t first_sample) {
    prepare(dataset, first_sample, 1);
    return upload().front();
  }

 private:
  std::int64_t micro_batch_, seq_length_, rows_ = 0;
  Device device_;
  int rank_, ranks_;
  std::vector<std::int32_t> sample_;
  std::vector<std::int64_t> tokens_, labels_;
  Tensor mask_;
};

// Keeps the lines of log.jsonl up to `iteration` (a resumed run continues it; lines of a killed run
// past its checkpoint, and a torn last line, go).
void trim_log(const fs::path& path, std::int64_t iteration) {
  std::ifstream in(path);
  if (!in) return;
  std::string line, kept;
  bool changed = false;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("iteration", std::int64_t{0}) > iteration) {
      changed = true;
      continue;
    }
    kept += line + "\n";
  }
  if (!changed) return;
  io::AtomicFile out(path);
  out.write(kept);
  out.commit();
}

// True when `load` holds any iter_* folder (a checkpoint, intact or not: load decides).
bool has_checkpoint_folders(const fs::path& load) {
  std::error_code ec;
  if (!fs::is_directory(load, ec)) return false;
  for (const auto& entry : fs::directory_iterator(load, ec))
    if (entry.is_directory() && parse_iteration_dir(entry.path().filename().string())) return true;
  return false;
}

void write_loss_curve(const fs::path& log_path, const fs::path& png, const std::string& title) {
  std::ifstream in(log_path);
  io::LineSeries train, val;
  train.label = "training loss";
  train.red = 0.12, train.green = 0.47, train.blue = 0.71;
  train.markers = false;
  val.label = "validation loss";
  val.red = 1.0, val.green = 0.5, val.blue = 0.05;
  std::string line;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    const double it = static_cast<double>(j.value("iteration", std::int64_t{0}));
    if (j.contains("lm_loss")) train.x.push_back(it), train.y.push_back(j["lm_loss"].get<double>());
    if (j.contains("validation_loss")) val.x.push_back(it), val.y.push_back(j["validation_loss"].get<double>());
  }
  if (train.x.empty()) return;
  io::PlotPanel panel;
  panel.title = "loss";
  panel.x_label = "iteration";
  panel.y_label = "cross-entropy (nats)";
  panel.series.push_back(std::move(train));
  if (!val.x.empty()) panel.series.push_back(std::move(val));
  io::LineFigure figure;
  figure.title = title;
  figure.panel_width = 900;  // the model's description is the title: one wide panel holds it
  figure.panels.push_back(std::move(panel));
  io::write_line_figure(png, figure);
}

}  // namespace

std::int64_t GptTrainOptions::num_micro_batches() const {
  return effective_global_batch() / (micro_batch_size * data_parallel_size());
}

std::optional<double> device_peak_tflops(Device device, bool bf16) {
  if (!device.is_cuda()) return std::nullopt;
  const std::string name = backend_for(device).properties(device.index).name;
  auto has = [&](const char* s) { return name.find(s) != std::string::npos; };
  // f32 matmuls run in true FP32 unless KILN_ALLOW_TF32 lets them use TF32 tensor cores (ops/cuda/gemm.cpp).
  const char* tf32_env = std::getenv("KILN_ALLOW_TF32");
  const bool tf32 = tf32_env && tf32_env[0] != '\0' && std::string_view(tf32_env) != "0";
  if (has("H100") || has("H200") || has("H800") || has("GH200")) return bf16 ? 989.0 : tf32 ? 494.5 : 66.9;
  if (has("A100") || has("A800")) return bf16 ? 312.0 : tf32 ? 156.0 : 19.5;
  return std::nullopt;
}

std::string eta_text(double s) {
  const long long total = std::isfinite(s) && s > 0 ? static_cast<long long>(s + 0.5) : 0;
  return total >= 3600 ? fmt::format("{}h{:02}m{:02}s", total / 3600, total / 60 % 60, total % 60)
                       : fmt::format("{}m{:02}s", total / 60, total % 60);
}

std::string format_log_line(const GptLogRecord& r) {
  const double mib = 1048576.0;
  std::string auxiliary;  // MTP: " | mtp_1 loss: ..." after lm loss, as Megatron's log line
  for (const auto& [name, value] : r.auxiliary_losses) auxiliary += fmt::format(" | {} loss: {:.6E}", name, value);
  return fmt::format(
      " iteration {:>8}/{:>8} | consumed samples: {:>10} | elapsed time per iteration (ms): {:.1f} | learning rate: "
      "{:.6E} | lm loss: {:.6E}{} | grad norm: {:.3f} | tokens/s: {:.0f} | throughput per GPU (TFLOP/s/GPU): {:.1f} | "
      "MFU: {} | mem alloc/reserved/peak (MiB): {:.0f}/{:.0f}/{:.0f} | ETA {}",
      r.iteration, r.train_iters, r.consumed_samples, r.seconds_per_iteration * 1000, r.lr, r.loss, auxiliary,
      r.grad_norm, r.tokens_per_second, r.tflops_per_gpu,
      r.mfu ? fmt::format("{:.1f}%", *r.mfu * 100) : std::string("n/a"), r.memory_allocated / mib,
      r.memory_reserved / mib, r.memory_peak / mib, eta_text(r.eta_seconds));
}

namespace {

// The layout of a state split by `inner` within the parts `outer` splits it into: made whole by
// `inner` first, then by `outer`; sliced the other way round.
ModelStateLayout composed(const ModelStateLayout& inner, const ModelStateLayout& outer) {
  return ModelStateLayout{.whole = [inner, outer](const TensorDict& local) { return outer.whole(inner.whole(local)); },
                          .local = [inner, outer](const TensorDict& whole) { return inner.local(outer.local(whole)); }};
}

// ", sequence parallel" when the layout has sequence-parallel parameters (and how its collectives run).
std::string tensor_parallel_note(const LanguageModelHandle& handle) {
  for (const auto& [name, split] : handle.tensor_parallel_layout)
    if (split.sequence_parallel)
      return handle.tp_comm_overlap ? ", sequence parallel, all-gathers / reduce-scatters under the GEMMs"
                                    : ", sequence parallel";
  return "";
}

}  // namespace

GptTrainSummary train_language_model(LanguageModelHandle handle, const GptTrainOptions& o,
                                     const GptTrainCallbacks& callbacks) {
  check_options(o);
  KILN_CHECK(handle.module && (handle.loss || handle.pipeline) && handle.seq_length > 0,
             "train_language_model: an incomplete model handle");
  // Data parallelism: rank 0 speaks, logs and writes checkpoints; the values it logs are the
  // group's (losses averaged over the ranks).
  const int dp_rank = o.data_parallel_rank(), dp_size = o.data_parallel_size();
  const int tp_size = o.tensor_parallel_size();
  // Context parallelism: the ranks of a cp group read the same samples (their dp rank's) and hold
  // parts of each sequence; the gradients (and the logged losses) are averaged over dp x cp.
  const int cp_size = o.context_parallel_size();
  KILN_CHECK(cp_size == 1 || (o.data_context_parallel && o.data_context_parallel->size() == dp_size * cp_size),
             "train_language_model: a context-parallel group of {} ranks needs the dp x cp group of {} ranks", cp_size,
             dp_size * cp_size);
  const dist::Communicator* grad_group = cp_size > 1       ? &*o.data_context_parallel
                                         : o.data_parallel ? &*o.data_parallel
                                                           : nullptr;
  const int grad_size = grad_group != nullptr ? grad_group->size() : 1;
  const int pp_size = o.pipeline_parallel_size();
  KILN_CHECK(pp_size == 1 || handle.pipeline,
             "train_language_model: a pipeline group of {} ranks, but the model handle has no pipeline stage", pp_size);
  const bool rank0 = o.is_first_rank();
  // Every rank of the run (tensor-parallel groups inside data-parallel ones): the tensor-parallel
  // barrier holds rank 0's group, the data-parallel one then holds every rank behind a rank of it.
  auto barrier_all = [&] {
    if (tp_size > 1) o.tensor_parallel->barrier();
    if (cp_size > 1) o.context_parallel->barrier();
    if (pp_size > 1) o.pipeline_parallel->barrier();
    if (dp_size > 1) o.data_parallel->barrier();
  };
  // `values` as the run's rank 0 has them, on every rank: each group's rank 0 sends its own along,
  // inner groups first, so after the last every rank holds what rank 0 of rank 0's groups held.
  // (The reductions leave every rank the same numbers already; the rewind decision must not rest on
  // an all-reduce's rounding being the same everywhere.)
  auto same_on_every_rank = [&](std::span<double> values) {
    if (tp_size > 1) o.tensor_parallel->broadcast(values, 0);
    if (cp_size > 1) o.context_parallel->broadcast(values, 0);
    if (pp_size > 1) o.pipeline_parallel->broadcast(values, 0);
    if (dp_size > 1) o.data_parallel->broadcast(values, 0);
  };
  KILN_CHECK(tp_size == 1 || !handle.tensor_parallel_layout.empty(),
             "train_language_model: a tensor-parallel group of {} ranks, but the model has no tensor-parallel layout",
             tp_size);
  auto say = [&](const std::string& text) {
    if (!rank0) return;
    if (callbacks.message)
      callbacks.message(text);
    else
      fmt::print("{}\n", text);
    std::fflush(stdout);
  };
  const Device device = o.device;
  backend_for(device);
  const std::int64_t iterations = total_iterations(o);
  const std::int64_t gbs = o.effective_global_batch(), micro = o.num_micro_batches();
  const std::int64_t seq = handle.seq_length;
  auto schedule = make_schedule(o, iterations);

  // Data: the train split holds every sample the run reads; validation and test a fixed set of
  // --eval-iters global batches each (every evaluation reads the same samples, so the curve
  // compares like with like).
  data::GptDatasetConfig data_config{.sequence_length = seq, .seed = o.seed, .cache_dir = o.data_cache_path};
  const std::int64_t eval_samples = std::max<std::int64_t>(o.eval_iters * gbs, 1);
  for (const auto& part : o.data_path)
    for (const char* ext : {".bin", ".idx"}) {
      const fs::path file = part.prefix + ext;
      KILN_CHECK(fs::exists(file),
                 "--data-path: {} does not exist. The prefix is what `kiln preprocess-data` printed (without "
                 ".bin/.idx); make it with `kiln preprocess-data --input <text or jsonl> --output-prefix <prefix> "
                 "--tokenizer-type ...`",
                 file.string());
    }
  std::array<std::shared_ptr<const data::TokenDataset>, 3> datasets;
  try {
    // Rank 0 builds the index caches first; the others then read them (no ranks writing one file).
    auto build = [&] {
      datasets =
          data::build_gpt_datasets(o.data_path, o.split, {iterations * gbs, eval_samples, eval_samples}, data_config);
    };
    if (rank0) build();
    barrier_all();
    if (!rank0) build();
  } catch (const Error& e) {
    KILN_FAIL(
        "--data-path: {}\nIf the data files are damaged or incomplete (a copy cut short, preprocess-data killed), "
        "run `kiln preprocess-data` again to rebuild them",
        e.what());
  }
  KILN_CHECK(datasets[0], "--split '{}' leaves no training data", o.split);
  KILN_CHECK(datasets[0]->size() >= iterations * gbs, "the training data holds {} samples, the run needs {}",
             datasets[0]->size(), iterations * gbs);
  const bool evaluate = o.eval_iters > 0 && datasets[1] != nullptr;
  if (o.eval_iters > 0 && !datasets[1])
    say(fmt::format("note: --split '{}' leaves no validation data: no evaluation", o.split));

  // The model on its device, in its training dtype, its parameters in flat buffers with fp32 grads.
  nn::Module& model = *handle.module;
  model.to(device);
  if (o.bf16) model.to(DType::BF16);
  model.train();
  // --fp8-param-gather: the FP8 linears' weights become fp8 bytes before the buffers are laid out,
  // so they get an fp8 parameter buffer of their own (1 byte a weight, all-gathered as such).
  std::optional<te::Fp8PrimaryWeights> fp8_weights;
  if (handle.fp8_param_gather) fp8_weights.emplace(models::fp8_linear_weights(model), *handle.fp8_param_gather);
  // Buckets as Megatron's DDP makes them: one per buffer without overlap (one reduction after
  // backward), max(40M, 1M x dp) elements with it; --ddp-bucket-size overrides.
  optim::GradBufferOptions buffer_options{.grad_dtype = DType::F32};
  if (grad_size > 1) {
    buffer_options.bucket_size = o.ddp_bucket_size > 0   ? o.ddp_bucket_size
                                 : o.overlap_grad_reduce ? std::max<std::int64_t>(40'000'000, 1'000'000 * grad_size)
                                                         : 0;
    if (o.use_distributed_optimizer) buffer_options.shard_count = grad_size;
  }
  // Expert parallelism: the experts' gradients in buffers of their own (reduced and sharded over the
  // expert-data-parallel group).
  // The ranks over which the experts differ: the expert-parallel group, times the
  // expert-tensor-parallel one when each expert is split too (ProcessGroups::tp_ep()).
  const int ep_size = handle.expert_parallel_layout.empty() ? 1 : o.process_groups->tp_ep().size();
  std::vector<Tensor> expert_params;
  for (const auto& [name, p] : model.named_parameters())
    if (handle.expert_parallel_layout.contains(name)) expert_params.push_back(p);
  optim::GradBufferOptions expert_buffer_options = buffer_options;
  // (The gradient group is dp x cp: with context parallelism alone the expert buffers shard too.)
  if (ep_size > 1 && o.use_distributed_optimizer && grad_size > 1)
    expert_buffer_options.shard_count = o.process_groups->expert_dp().size();
  optim::GradBuffers buffers(model.parameters(), buffer_options, expert_params, expert_buffer_options);
  std::optional<ExpertParallelGrads> ep_grads;
  if (ep_size > 1) {
    // Under sequence parallelism the experts' copies on the tensor-parallel ranks see each rank's own
    // tokens (the tensor-parallel layout marks them sequence-parallel): no copies of a token.
    bool sequence_parallel = false;
    for (const auto& [name, split] : handle.expert_parallel_layout)
      sequence_parallel = sequence_parallel || models::split_of(handle.tensor_parallel_layout, name).sequence_parallel;
    ep_grads.emplace(ExpertParallelGrads{.expert_data_parallel = o.process_groups->expert_dp(),
                                         .expert_parallel = o.process_groups->tp_ep(),
                                         .sequence_parallel_size = sequence_parallel ? tp_size : 1});
  }
  std::optional<DataParallel> dp;
  std::optional<TensorParallelGrads> tp_grads;
  if (tp_size > 1) {
    // The parameters every rank of the group holds whole (counted once in the norm), and of those
    // the sequence-parallel ones (their gradients summed over the group).
    tp_grads.emplace(TensorParallelGrads{.group = *o.tensor_parallel, .replicated = {}, .sequence_parallel = {}});
    for (const auto& [name, p] : model.named_parameters()) {
      const models::TensorParallelSplit split = models::split_of(handle.tensor_parallel_layout, name);
      // Experts split over an expert-parallel group are not tensor-parallel duplicates: with expert
      // tensor parallelism 1 the expert-parallel group may be the tensor-parallel one itself (tp 2,
      // ep 2), whose ranks hold different experts; their squares are added over it (ExpertParallelGrads).
      if (!split.replicated() || handle.expert_parallel_layout.contains(name)) continue;
      tp_grads->replicated.push_back(p);
      if (split.sequence_parallel) tp_grads->sequence_parallel.push_back(p);
    }
  }
  std::optional<PipelineParallelGrads> pp_grads;
  // DualPipe: the two copies of each stage get the sum of their gradients after backward (collective
  // over the pipeline group: splits its pairs of ranks).
  std::optional<DualPipeGrads> dualpipe_grads;
  if (pp_size > 1 && handle.pipeline->dualpipe) dualpipe_grads.emplace(*handle.pipeline, *o.pipeline_parallel);
  if (pp_size > 1) {
    pp_grads.emplace(
        PipelineParallelGrads{.group = *o.pipeline_parallel, .not_counted = {}, .completed_after_backward = {}});
    if (handle.pipeline->tied_copy.defined()) pp_grads->not_counted.push_back(handle.pipeline->tied_copy);
    if (dualpipe_grads) {
      // The copies are counted in the norm by their originals; every gradient changes in the pair's
      // sum after backward, so no bucket is reduced from backward's callbacks.
      for (const Tensor& p : dualpipe_grads->mirror_parameters()) pp_grads->not_counted.push_back(p);
      for (const Tensor& p : dualpipe_grads->parameters()) pp_grads->completed_after_backward.push_back(p);
    }
    // Tied embeddings, MTP's embedding copy: their gradients get the embedding group's sum after the
    // schedule (below). The last stage's copies count in the norm through their originals.
    const Tensor& shared = handle.pipeline->shared_embedding;
    if (shared.defined()) {
      pp_grads->completed_after_backward.push_back(shared);
      // MTP's untied copy on the last stage (a tied copy is not counted above).
      if (!handle.pipeline->mirror_state_names.empty() && !shared.is_same(handle.pipeline->tied_copy))
        pp_grads->not_counted.push_back(shared);
    }
  }
  if (grad_size > 1 || tp_size > 1 || pp_size > 1) {
    const dist::Communicator& any = tp_size > 1 ? *o.tensor_parallel : pp_size > 1 ? *o.pipeline_parallel : *grad_group;
    dp.emplace(buffers, grad_group ? *grad_group : any.split(any.rank(), 0),  // else this rank alone
               DataParallelOptions{.distributed_optimizer = o.use_distributed_optimizer && grad_size > 1,
                                   .overlap_grad_reduce = o.overlap_grad_reduce,
                                   .overlap_param_gather = o.overlap_param_gather},
               std::move(tp_grads), std::move(ep_grads), std::move(pp_grads));
  }
  optim::AdamOptions adam{
      .lr = o.lr, .beta1 = o.adam_beta1, .beta2 = o.adam_beta2, .eps = o.adam_eps, .weight_decay = o.weight_decay};
  optim::FlatAdamW optimizer(buffers, weight_decay_groups(model, o.weight_decay), adam,
                             dp ? dp->optimizer_shard() : optim::FlatOptimizer::Shard{});
  // The fp8 weights' masters start from the values the weights had (then released; every
  // data-parallel rank built the same model from --seed, so they agree), and are cast
  // into the weights after each step; with the distributed optimizer each rank casts its shard
  // (scales from amaxes reduced over the data-parallel group) and start_param_gather gathers the bytes.
  const dist::Communicator* fp8_shard_group = dp && dp->options().distributed_optimizer ? &dp->group() : nullptr;
  auto cast_fp8_weights = [&](bool after_step) {
    if (!fp8_weights) return;
    fp8_weights->cast_masters(optimizer.fp8_master_pieces(), fp8_shard_group, after_step);
    if (!after_step && dp) {
      dp->start_param_gather();
      dp->finish_param_gather();
    }
  };
  if (fp8_weights) {
    const std::vector<Tensor> values = fp8_weights->take_initial_values();
    for (std::size_t i = 0; i < values.size(); ++i) optimizer.set_master(fp8_weights->weight(i), values[i]);
  }
  // What checkpoints save and load: the distributed optimizer's shards gathered into the
  // non-distributed format (so a checkpoint loads at any data-parallel size), else the optimizer.
  std::optional<GatheredOptimizerState> gathered;
  if (dp && o.use_distributed_optimizer && grad_group != nullptr)
    gathered.emplace(optimizer, *grad_group, std::vector<std::string>{"exp_avg", "exp_avg_sq"},
                     ep_size > 1 ? std::optional<dist::Communicator>(o.process_groups->expert_dp()) : std::nullopt);
  optim::Optimizer& dp_checkpointed = gathered ? static_cast<optim::Optimizer&>(*gathered) : optimizer;
  // Tensor parallelism: checkpoints hold whole tensors, gathered over the group on save and sliced
  // on load (so a checkpoint loads at any tensor-parallel size, and into one process).
  std::optional<TensorParallelState> tp_state;
  std::optional<TensorParallelOptimizerState> tp_optimizer;
  std::optional<ModelStateLayout> model_layout;
  if (tp_size > 1) {
    tp_state.emplace(model, handle.tensor_parallel_layout, *o.tensor_parallel);
    tp_optimizer.emplace(dp_checkpointed, *tp_state);
    model_layout = tp_state->model_state_layout();
  }
  // Expert parallelism alike: the experts gathered whole over the expert-parallel group on save and
  // sliced on load. With tensor parallelism too the two compose: the experts are whole on every
  // tensor-parallel rank (replicated in the tensor-parallel layout) and the dense tensors whole on
  // every expert-parallel rank (absent from the expert layout), so each gather leaves the other's
  // tensors as they are; the expert gather runs inside the tensor-parallel one.
  std::optional<TensorParallelState> ep_state;
  std::optional<TensorParallelOptimizerState> ep_optimizer;
  // Expert tensor parallelism: each expert's slices gathered over the expert-tensor-parallel group
  // first (into the rank's expert-parallel block), then the blocks over the expert-parallel group.
  std::optional<TensorParallelState> etp_state;
  std::optional<TensorParallelOptimizerState> etp_optimizer;
  if (!handle.expert_tensor_parallel_layout.empty()) {
    etp_state.emplace(model, handle.expert_tensor_parallel_layout, o.process_groups->expert_tp());
    etp_optimizer.emplace(dp_checkpointed, *etp_state);
  }
  if (ep_size > 1) {
    ep_state.emplace(model, handle.expert_parallel_layout, o.process_groups->ep());
    ep_optimizer.emplace(etp_optimizer ? static_cast<optim::Optimizer&>(*etp_optimizer) : dp_checkpointed, *ep_state);
    ModelStateLayout ep_view = ep_state->model_state_layout();
    if (etp_state) ep_view = composed(etp_state->model_state_layout(), ep_view);
    if (tp_size > 1) {
      tp_optimizer.reset();
      tp_optimizer.emplace(*ep_optimizer, *tp_state);
      model_layout = composed(tp_state->model_state_layout(), ep_view);
    } else {
      model_layout = ep_view;
    }
  }
  // Pipeline parallelism: the stages' tensors gathered into the one-process checkpoint alike.
  std::optional<PipelineParallelState> pp_state;
  std::optional<PipelineOptimizerState> pp_optimizer;
  std::optional<PipelineExecutor> pipeline;
  if (pp_size > 1) {
    pp_state.emplace(model, *handle.pipeline, *o.pipeline_parallel);
    // Under tensor and expert parallelism too, the stage's shards are made whole over those groups
    // first (as above), then gathered over the stages (and sliced in the opposite order on load).
    pp_optimizer.emplace(tp_optimizer   ? static_cast<optim::Optimizer&>(*tp_optimizer)
                         : ep_optimizer ? static_cast<optim::Optimizer&>(*ep_optimizer)
                                        : dp_checkpointed,
                         *pp_state);
    if (model_layout) {
      model_layout = composed(*model_layout, pp_state->model_state_layout());
    } else {
      model_layout = pp_state->model_state_layout();
    }
    // The schedule's sizes, refused now rather than at the first step (interleaving needs the
    // micro-batches to be a multiple of the stages).
    if (o.dualpipe_schedule)
      sim::check_dualpipe_sizes(pp_size, static_cast<int>(micro));
    else
      (void)sim::pipeline_actions(0, pp_size, static_cast<int>(micro), handle.pipeline->chunks);
    pipeline.emplace(*handle.pipeline, *o.pipeline_parallel, device, o.bf16 ? DType::BF16 : DType::F32,
                     o.dualpipe_schedule      ? PipelineScheduleKind::DualPipe
                     : o.zero_bubble_schedule ? PipelineScheduleKind::ZeroBubble
                                              : PipelineScheduleKind::OneF1B);
  }
  // Tied embeddings under pipeline parallelism: the first stage's word embeddings and the last
  // stage's copy get the sum of both gradients (Megatron's embedding group), so they stay equal.
  const bool shares_embedding = pp_size > 1 && handle.pipeline->shared_embedding.defined();
  KILN_CHECK(!shares_embedding || (o.process_groups && o.process_groups->in_embedding_group()),
             "train_language_model: a stage holding tied word embeddings outside the embedding group");
  optim::Optimizer& checkpointed = pp_optimizer   ? static_cast<optim::Optimizer&>(*pp_optimizer)
                                   : tp_optimizer ? static_cast<optim::Optimizer&>(*tp_optimizer)
                                   : ep_optimizer ? static_cast<optim::Optimizer&>(*ep_optimizer)
                                                  : dp_checkpointed;
  const ModelStateLayout* layout = model_layout ? &*model_layout : nullptr;
  const std::vector<Tensor> params = model.parameters();

  auto shape_flags = handle.shape_flags;
  shape_flags.emplace_back("--bf16", o.bf16 ? "true" : "false");
  GptCheckpointState state;
  std::int64_t start_iteration = 0, consumed = 0;
  double carried_loss_sum = 0;
  std::int64_t window_iterations = 0;
  std::set<std::int64_t> skipped = o.skip_batches;
  if (!o.load.empty() && has_checkpoint_folders(o.load)) {
    GptCheckpointState fresh_rng;
    if (o.finetune) capture_rng_state(model, fresh_rng);
    const bool load_optimizer = !o.finetune && !o.no_load_optim;
    state = load_gpt_checkpoint(o.load, model, load_optimizer ? &checkpointed : nullptr, shape_flags, layout);
    if (fp8_weights && load_optimizer) {
      cast_fp8_weights(false);  // the bytes of the loaded masters, as the saving run had them
    } else if (fp8_weights) {
      // Weights only: the masters follow the loaded weights (their FP8 values).
      for (std::size_t i = 0; i < fp8_weights->size(); ++i)
        optimizer.set_master(fp8_weights->weight(i), te::fp8_primary_weight_value(fp8_weights->primary(i)));
    }
    for (const auto& reason : state.passed_over) say(fmt::format("--load: passed over {}", reason));
    if (o.finetune) {
      // Megatron's --finetune: the weights only; iteration 0, fresh optimizer, this run's seed.
      say(
          fmt::format("--finetune: loaded the model of {} (iteration {}); training starts at iteration 0 with a "
                      "fresh optimizer",
                      state.folder.string(), state.iteration));
      restore_rng_state(model, fresh_rng);
      state = GptCheckpointState{};
    }
    if (!o.finetune && handle.after_random_state_load) handle.after_random_state_load();
    if (!o.finetune)
      for (std::int64_t s : parse_skip_list(state.skipped_batches, state.folder.string())) skipped.insert(s);
    if (o.no_load_optim && !o.finetune)
      say("--no-load-optim: the optimizer starts afresh (the checkpoint's moments are not loaded)");
    start_iteration = state.iteration;
    consumed = state.consumed_train_samples;
    carried_loss_sum = state.window_loss_sum;
    window_iterations = state.window_iterations;
    KILN_CHECK(consumed == start_iteration * gbs,
               "--load: the checkpoint consumed {} samples in {} iterations, which is not {} per iteration: pass "
               "--global-batch-size {}",
               consumed, start_iteration, gbs, start_iteration > 0 ? consumed / start_iteration : gbs);
    if (!o.finetune)
      say(fmt::format("loaded checkpoint {} (iteration {}, {} samples consumed)", state.folder.string(),
                      start_iteration, consumed));
    if (start_iteration >= iterations)
      say(fmt::format(
          "the checkpoint is at iteration {}, the run has {}: nothing to train (raise --train-iters to go on)",
          start_iteration, iterations));
  } else {
    if (!o.load.empty()) say(fmt::format("--load {}: no checkpoint there yet, starting afresh", o.load.string()));
  }

  fs::path log_dir = !o.log_dir.empty() ? o.log_dir : !o.save.empty() ? o.save : o.tensorboard_dir;
  std::unique_ptr<io::JsonlWriter> log;
  if (!log_dir.empty() && rank0) {
    if (start_iteration > 0) trim_log(log_dir / "log.jsonl", start_iteration);
    log = std::make_unique<io::JsonlWriter>(
        log_dir / "log.jsonl", start_iteration > 0 ? io::JsonlWriter::Mode::Append : io::JsonlWriter::Mode::Truncate);
  }
  std::unique_ptr<io::TfEventsWriter> events;
  if (!o.tensorboard_dir.empty() && rank0) events = std::make_unique<io::TfEventsWriter>(o.tensorboard_dir);

  const std::optional<double> peak = device_peak_tflops(device, o.bf16);
  const int etp_size = handle.expert_tensor_parallel_layout.empty() ? 1 : o.process_groups->expert_tp().size();
  const std::string expert_note =
      etp_size > 1 ? fmt::format(", experts over {} expert-parallel x {} expert-tensor-parallel ranks",
                                 ep_size / etp_size, etp_size)
                   : fmt::format(", experts over {} expert-parallel ranks", ep_size);
  say(fmt::format(
      "training {} on {}{}{}{}{}: {} iterations of {} samples ({} micro-batches of {}{}) x {} tokens, {} {}, lr {} "
      "({}), "
      "{:.1f} MFLOP/token",
      handle.description, device.str(),
      tp_size > 1 ? fmt::format(" x {} tensor-parallel ranks{}{}", tp_size,
                                handle.tensor_parallel_layout.empty() ? "" : tensor_parallel_note(handle),
                                // With one data-parallel rank the expert note below is not printed.
                                ep_size > 1 && dp_size == 1 ? expert_note : "")
                  : std::string(),
      cp_size > 1 ? fmt::format(" x {} context-parallel ranks", cp_size) : std::string(),
      pp_size > 1
          ? fmt::format(" x {} pipeline stages ({}{})", pp_size,
                        o.dualpipe_schedule ? "DualPipe, both directions, two copies of each stage, weight gradients "
                                              "deferred"
                        : o.zero_bubble_schedule      ? "zero-bubble ZB-H1, weight gradients deferred"
                        : handle.pipeline->chunks > 1 ? "interleaved 1F1B"
                                                      : "1F1B",
                        handle.pipeline->chunks > 1 && !o.dualpipe_schedule
                            ? fmt::format(", {} model chunks per rank", handle.pipeline->chunks)
                            : std::string())
          : std::string(),
      dp_size > 1 ? fmt::format(" x {} data-parallel ranks{}{}{}", dp_size, ep_size > 1 ? expert_note : "",
                                o.use_distributed_optimizer ? ", distributed optimizer" : "",
                                o.overlap_grad_reduce ? ", gradient reduction overlapped with backward" : "")
                  : std::string(),
      iterations, gbs, micro, o.micro_batch_size, dp_size > 1 ? " per rank" : "", seq, o.bf16 ? "bf16" : "fp32",
      "AdamW", o.lr, o.lr_decay_style, handle.flops_per_token / 1e6));

  std::optional<CheckpointStore> store;
  std::optional<AsyncCheckpointSaver> saver;
  if (!o.save.empty() && rank0) {
    store.emplace(o.save, CheckpointStoreOptions{.keep_last = o.keep_last});
    saver.emplace(*store, o.async_save);
  }
  NonFiniteGuard guard(device);
  // bf16: the linears' weight-gradient GEMMs add straight into the fp32 gradient buffers.
  const autograd::GradientAccumulationFusionScope fusion(o.bf16 && o.gradient_accumulation_fusion);
  BatchReader reader(o.micro_batch_size, seq, device, dp_rank, dp_size),
      eval_reader(o.micro_batch_size, seq, device, dp_rank, dp_size);
  if (start_iteration < iterations) reader.prepare(*datasets[0], consumed, micro);
  Tensor window_loss = Tensor::full({}, carried_loss_sum, DType::F32, device);
  Tensor iteration_loss = Tensor::zeros({}, DType::F32, device);
  // MTP: the handle's auxiliary losses, per iteration and per log window, by name in first-seen order.
  // The window counts its own iterations: it is not checkpointed (a resume or rewind starts it
  // afresh), so its mean covers the iterations this process added since the last log line.
  std::vector<std::pair<std::string, Tensor>> auxiliary_iteration, auxiliary_window;
  std::int64_t auxiliary_window_iterations = 0;
  auto clear_auxiliary_window = [&] {
    for (auto& [name, sum] : auxiliary_window) sum.zero_();
    auxiliary_window_iterations = 0;
  };
  auto add_named = [&](std::vector<std::pair<std::string, Tensor>>& list, const std::string& name, const Tensor& v) {
    for (auto& [n, sum] : list)
      if (n == name) return void(sum.add_(v));
    list.emplace_back(name, Tensor::zeros({}, DType::F32, device));
    list.back().second.add_(v);
  };
  Tensor grad_norm = Tensor::zeros({}, DType::F32, device);
  const bool draw_progress = o.progress && isatty(STDERR_FILENO);

  GptTrainSummary summary;
  summary.start_iteration = start_iteration;
  summary.skipped_batches = skipped;
  auto run_start = Clock::now();
  auto window_start = Clock::now();
  double paused_seconds = 0;  // evaluation and checkpoints inside the window, not training time
  double last_seconds_per_iteration = 0;

  auto stop_if_diverged = [&](std::int64_t last_good_save) {
    auto bad = guard.first_bad_step();
    if (!bad) return;
    if (draw_progress) fmt::print(stderr, "\n");
    const std::int64_t it = start_iteration + *bad;
    KILN_FAIL(
        "the loss or the gradients are not finite (NaN or inf) at iteration {}: training diverged. {}. Lower --lr, "
        "lengthen --lr-warmup-iters, or keep --clip-grad on (1.0, Megatron's default)",
        it,
        last_good_save > 0 ? fmt::format("The last checkpoint is iteration {} in {} (continue from it with --load)",
                                         last_good_save, o.save.string())
                           : std::string("No checkpoint was written"));
  };
  std::int64_t last_save = start_iteration > 0 && o.load == o.save ? start_iteration : 0;

  auto run_eval = [&](const data::TokenDataset& dataset, std::int64_t iteration, const std::string& split) {
    NoGradGuard no_grad;
    model.eval();
    Tensor sum = Tensor::zeros({}, DType::F32, device);
    const std::int64_t batches = o.eval_iters * micro;
    if (dp) dp->finish_param_gather();
    if (pipeline) {
      // One global batch's micro-batches at a time through the stages.
      for (std::int64_t first = 0; first < batches; first += micro) {
        std::vector<PipelineMicroBatch> step;
        for (std::int64_t m = first; m < std::min(batches, first + micro); ++m) {
          Batch b = eval_reader.read(dataset, m * o.micro_batch_size * dp_size);
          step.push_back({b.tokens, b.labels, b.loss_mask});
        }
        sum.add_(pipeline->forward_only(step));
      }
    } else {
      for (std::int64_t m = 0; m < batches; ++m) {
        Batch b = eval_reader.read(dataset, m * o.micro_batch_size * dp_size);
        sum.add_(handle.loss(b.tokens, b.labels, b.loss_mask).detach().to(DType::F32));
      }
    }
    if (dp) dp->sum(sum);
    model.train();
    GptEvalRecord r{
        .iteration = iteration, .loss = sum.item() / static_cast<double>(batches * grad_size), .split = split};
    r.perplexity = std::exp(std::min(20.0, r.loss));  // Megatron's cap
    summary.evals.push_back(r);
    say(fmt::format(" {} loss at iteration {} | lm loss value: {:.6E} | lm loss PPL: {:.6E}", split, iteration, r.loss,
                    r.perplexity));
    const std::string key = split == "validation" ? "validation" : "test";
    if (log) log->write({{"iteration", iteration}, {key + "_loss", r.loss}, {key + "_ppl", r.perplexity}});
    if (events) {
      events->add_scalar(fmt::format("lm loss {}", key), static_cast<float>(r.loss), iteration);
      events->add_scalar(fmt::format("lm loss {} ppl", key), static_cast<float>(r.perplexity), iteration);
    }
    if (callbacks.on_eval) callbacks.on_eval(r);
  };

  auto save = [&](std::int64_t iteration) {
    stop_if_diverged(last_save);  // never a checkpoint of a diverged model
    if (dp) dp->finish_param_gather();
    if (!rank0) {
      // The gathers are collective: rank 0 writes what they gather (the random state, then the model,
      // as gpt_checkpoint_content takes them).
      if (pp_state) {
        GptCheckpointState s;
        capture_rng_state(model, s);
        pp_state->complete_rng_state(s);
      }
      if (layout) (void)layout->whole(model.state_dict());
      if (gathered || tp_optimizer || ep_optimizer || pp_optimizer) (void)checkpointed.state_dict();
      last_save = iteration;
      return;
    }
    GptCheckpointState s;
    s.iteration = iteration;
    s.consumed_train_samples = consumed;
    capture_rng_state(model, s);
    if (pp_state) pp_state->complete_rng_state(s);  // every stage's dropout streams
    s.window_iterations = window_iterations;
    s.window_loss_sum = window_loss.item();
    s.shape_flags = shape_flags;
    s.all_flags = handle.all_flags;
    s.skipped_batches = skip_list_text(skipped);
    const SaveStall stall = saver->save(gpt_checkpoint_content(model, checkpointed, s, layout));
    const fs::path folder = store->dir_of(iteration);
    summary.checkpoints_written.push_back(folder);
    summary.max_save_stall_seconds = std::max(summary.max_save_stall_seconds, stall.total());
    last_save = iteration;
    if (saver->async())
      say(
          fmt::format("saving checkpoint {} (iteration {}) in the background; the step waited {:.3f} s ({:.3f} s for "
                      "the previous save, {:.3f} s copying {:.1f} MiB to the host)",
                      folder.string(), iteration, stall.total(), stall.wait_seconds, stall.copy_seconds,
                      static_cast<double>(stall.bytes) / 1048576.0));
    else
      say(fmt::format("saved checkpoint {} (iteration {}, {:.3f} s)", folder.string(), iteration, stall.total()));
    if (log)
      log->write({{"iteration", iteration},
                  {"event", "checkpoint"},
                  {"async", saver->async()},
                  {"stall_seconds", stall.total()},
                  {"bytes", stall.bytes}});
    if (events) events->add_scalar("checkpoint/stall_ms", static_cast<float>(stall.total() * 1000), iteration);
  };

  // --rewind: the state to roll back to, on the host. Taken every --rewind-snapshot-interval steps
  // and after every log line, evaluation and save, so a rollback never repeats an output.
  struct RewindSnapshot {
    std::int64_t iteration = 0, consumed = 0, window_iterations = 0;
    double window_loss_sum = 0;
    GptCheckpointSnapshot state;
  };
  std::optional<RewindPolicy> policy;
  AnomalyDetector detector(o.rewind.thresholds);
  RewindSnapshot snapshot;
  auto take_snapshot = [&](std::int64_t iteration) {
    if (dp) dp->finish_param_gather();
    GptCheckpointState s;
    s.iteration = iteration;
    capture_rng_state(model, s);
    snapshot.iteration = iteration;
    snapshot.consumed = consumed;
    snapshot.window_iterations = window_iterations;
    snapshot.window_loss_sum = window_loss.item();
    snapshot.state = snapshot_gpt_checkpoint(model, optimizer, std::move(s));
  };
  auto restore_snapshot = [&] {
    model.load_state_dict(snapshot.state.model, /*strict=*/true);
    optimizer.load_state_dict(snapshot.state.optimizer);
    cast_fp8_weights(false);
    restore_rng_state(model, snapshot.state.state);
    consumed = snapshot.consumed;
    window_iterations = snapshot.window_iterations;
    clear_auxiliary_window();  // MTP: the rolled-back iterations leave the window
    window_loss.fill_(snapshot.window_loss_sum);
  };
  if (o.rewind.enabled) {
    policy.emplace(o.rewind);
    if (start_iteration < iterations) take_snapshot(start_iteration);
  }
  arm_faults_from_environment();
  // `kiln launch` watches each rank's beats (KILN_HEARTBEAT_DIR; off without it): one per iteration.
  Heartbeat heartbeat = Heartbeat::from_environment();

  backend_for(device).reset_peak_memory(device.index);
  std::int64_t exited_at = 0;  // --exit-interval or a signal stopped the run there
  std::string exit_reason;
  ExitSignalScope signals(o.exit_signal_handler);
  double lr = 0;
  bool arena_reserved = false;
  std::int64_t pipeline_steps = 0;  // --profile-schedule counts the trained steps
  for (std::int64_t it = start_iteration + 1; it <= iterations; ++it) {
    crash_if_planned(it);  // (a fault "before step S": the rank's last beat says S - 1)
    heartbeat.beat(it);
    if (saver) saver->check();
    if (saver && !arena_reserved && it > start_iteration + 1) {
      // The optimizer's state exists after the first step: page-lock the async saver's host copy now,
      // in the background, not in the first save's stall.
      saver->reserve(gpt_checkpoint_content(model, optimizer, GptCheckpointState{}));
      arena_reserved = true;
    }
    lr = schedule->get_lr(it - 1) * (policy ? policy->lr_scale(it) : 1.0);
    const bool skip = skipped.contains(it);
    if (skip) {
      // A skipped global batch: its samples are consumed, nothing is trained on them.
      consumed += gbs;
      if (it < iterations) reader.prepare(*datasets[0], consumed, micro);
    } else {
      optimizer.set_lr(lr);
      if (dp) dp->finish_param_gather();  // --overlap-param-gather: the weights are needed now
      optimizer.zero_grad();
      iteration_loss.zero_();
      for (auto& [name, sum] : auxiliary_iteration) sum.zero_();  // MTP
      const std::vector<Batch> batches = reader.upload();
      const std::optional<double> fault = loss_fault_factor(it);
      if (pipeline) {
        // The schedule's forwards and backwards over the stages; the loss is the last stage's, sent to
        // every stage.
        std::vector<PipelineMicroBatch> step;
        for (const Batch& b : batches) step.push_back({b.tokens, b.labels, b.loss_mask});
        buffers.set_grad_sync_enabled(false);
        // KILN_FAULT nan_loss@S / spike@S: the last stage's losses and their gradients, as below.
        const double fault_factor = fault ? *fault : 1.0;
        Tensor loss_sum =
            pipeline->train_step(step, (micro > 1 ? 1.0 / static_cast<double>(micro) : 1.0) * fault_factor,
                                 [&](bool last) { buffers.set_grad_sync_enabled(last); });
        iteration_loss.add_(fault ? loss_sum * fault_factor : loss_sum);
        if (handle.auxiliary_losses)  // MTP: the last stage's sums over the micro-batches, on every stage
          for (const auto& [name, value] : handle.auxiliary_losses())
            add_named(auxiliary_iteration, name, value.to(DType::F32) * (1.0 / static_cast<double>(micro)));
        ++pipeline_steps;
        if (!o.profile_schedule.empty() && pipeline_steps == o.profile_schedule_step)
          draw_pipeline_timeline(o.profile_schedule, *o.pipeline_parallel, pipeline->timeline(), it,
                                 handle.pipeline->chunks, rank0, say, o.dualpipe_schedule);
      }
      for (std::int64_t m = 0; m < (pipeline ? 0 : micro); ++m) {
        const Batch& b = batches[static_cast<std::size_t>(m)];
        // As Megatron's no_sync(): bucket readiness is tracked on the last micro-batch only (where data
        // parallelism will start its reductions).
        buffers.set_grad_sync_enabled(m + 1 == micro);
        Tensor loss = handle.loss(b.tokens, b.labels, b.loss_mask);
        if (fault) loss = loss * *fault;  // KILN_FAULT nan_loss@S / spike@S: the loss and its gradients
        // Each micro-batch's share of the global batch's mean: the gradients add up in the buffers.
        (micro > 1 ? loss * (1.0 / static_cast<double>(micro)) : loss).backward();
        NoGradGuard no_grad;
        iteration_loss.add_(loss.detach().to(DType::F32));
        if (handle.auxiliary_losses)  // MTP
          for (const auto& [name, value] : handle.auxiliary_losses())
            add_named(auxiliary_iteration, name, value.to(DType::F32) * (1.0 / static_cast<double>(micro)));
      }
      buffers.finish_backward();
      if (dualpipe_grads) dualpipe_grads->sum();
      if (shares_embedding)
        dist::all_reduce(o.process_groups->embedding(), handle.pipeline->shared_embedding.grad()).wait();
      if (micro > 1) iteration_loss.mul_(1.0 / static_cast<double>(micro));
      if (dp) {
        // The gradients' average over the ranks (started during backward with --overlap-grad-reduce),
        // and the losses logged as the group's mean: the single-process run's values.
        dp->finish_grad_sync();
        dp->average(iteration_loss);
        for (auto& [name, sum] : auxiliary_iteration) dp->average(sum);  // MTP
      }
      if (dp) {
        if (!policy) guard.record(iteration_loss, params);  // with --rewind the check below judges each step
        grad_norm = dp->clip_grad_norm(params, o.clip_grad);
      } else {
        // One pass over the gradients for the non-finite check and the norm (it was two: 2 x 2.6 ms a
        // step for the Llama-3.2-1B shape on an H100).
        const Tensor squares = optim::sum_of_squares(optim::gradients_of(params));
        if (!policy) guard.record_squares(iteration_loss, squares);  // with --rewind the check below judges
        grad_norm = sqrt(squares);                                   // as optim::grad_norm computes it
        if (o.clip_grad > 0) {
          // f32 buffers: the clip coefficient goes into AdamW's kernel, which multiplies each gradient as
          // it reads it (bit for bit the scaled buffers' step) instead of a pass of its own (4.3 ms a step
          // for the Llama-3.2-1B shape on an H100). 16-bit buffers keep the pass: its product rounds.
          const auto& flat = buffers.flat_grads();
          if (std::ranges::all_of(flat, [](const Tensor& g) { return g.dtype() == DType::F32; }))
            optimizer.set_grad_scale(optim::clip_coefficient(grad_norm, o.clip_grad));
          else
            optim::clip_to_norm_(flat, grad_norm, o.clip_grad);
        }
      }
      optimizer.step();
      cast_fp8_weights(true);
      if (dp) dp->start_param_gather();
      if (handle.after_optimizer_step) handle.after_optimizer_step();  // MoE: expert bias
      consumed += gbs;
      if (policy) {
        // One sync per step: the loss and the gradient norm are judged before anything else uses them.
        std::array<double, 2> judged = {iteration_loss.item(), grad_norm.item()};
        same_on_every_rank(judged);  // one decision on every rank: all roll back or none
        const double loss_value = judged[0], norm_value = judged[1];
        if (auto anomaly = detector.check(loss_value, norm_value)) {
          RewindEvent e{.step = it,
                        .anomaly = *anomaly,
                        .loss = loss_value,
                        .grad_norm = norm_value,
                        .restored_to = snapshot.iteration,
                        .source = "memory snapshot"};
          policy->record(e);  // throws the report when the budget is spent
          restore_snapshot();
          skipped.insert(it);
          summary.skipped_batches = skipped;
          summary.rewinds.push_back(e);
          if (draw_progress) fmt::print(stderr, "\n");
          say(
              fmt::format("rewind at iteration {}: {}: {}; rolled back to iteration {} (memory snapshot); global batch "
                          "{} is skipped from now on{}",
                          it, anomaly->kind, anomaly->detail, snapshot.iteration, it,
                          o.rewind.lr_steps > 0 && o.rewind.lr_factor < 1
                              ? fmt::format("; lr x{} for {} steps", o.rewind.lr_factor, o.rewind.lr_steps)
                              : std::string()));
          if (log) {
            json line = rewind_event_json(e);
            line["iteration"] = snapshot.iteration;  // a resume's trim keeps it with its snapshot
            line["event"] = "rewind";
            log->write(line);
          }
          if (events) events->add_scalar("rewind/count", static_cast<float>(summary.rewinds.size()), it);
          it = snapshot.iteration;  // the loop's ++ resumes after the snapshot
          reader.prepare(*datasets[0], consumed, micro);
          continue;
        }
        detector.accept(loss_value, norm_value);
      }
      if (it < iterations) reader.prepare(*datasets[0], consumed, micro);  // while the device runs the step
      window_loss.add_(iteration_loss);
      for (const auto& [name, sum] : auxiliary_iteration) add_named(auxiliary_window, name, sum);  // MTP
      if (!auxiliary_iteration.empty()) ++auxiliary_window_iterations;
      ++window_iterations;
    }

    if (it % o.log_interval == 0 || it == iterations) {
      synchronize(device);
      stop_if_diverged(last_save);
      const double elapsed = seconds_since(window_start) - paused_seconds;
      GptLogRecord r;
      r.iteration = it;
      r.train_iters = iterations;
      r.consumed_samples = consumed;
      r.loss = window_loss.item() / static_cast<double>(std::max<std::int64_t>(window_iterations, 1));
      for (const auto& [name, sum] : auxiliary_window)  // MTP
        r.auxiliary_losses.emplace_back(
            name, sum.item() / static_cast<double>(std::max<std::int64_t>(auxiliary_window_iterations, 1)));
      r.lr = lr;
      r.grad_norm = grad_norm.item();
      // A window begun before a resume counts only the iterations this process ran for the timing.
      const std::int64_t timed = std::min<std::int64_t>(window_iterations, it - start_iteration);
      r.seconds_per_iteration = elapsed / static_cast<double>(std::max<std::int64_t>(timed, 1));
      last_seconds_per_iteration = r.seconds_per_iteration;
      r.tokens_per_second = static_cast<double>(gbs * seq) / r.seconds_per_iteration;
      // The whole run's FLOPs shared by its ranks (Megatron's throughput per GPU).
      r.tflops_per_gpu = handle.flops_per_token * r.tokens_per_second / 1e12 /
                         static_cast<double>(dp_size * tp_size * cp_size * pp_size);
      if (peak) r.mfu = r.tflops_per_gpu / *peak;
      const MemoryStats mem = backend_for(device).memory_stats(device.index);
      r.memory_allocated = mem.allocated;
      r.memory_reserved = mem.reserved;
      r.memory_peak = mem.peak_allocated;
      r.eta_seconds = r.seconds_per_iteration * static_cast<double>(iterations - it);
      summary.logs.push_back(r);
      if (draw_progress) fmt::print(stderr, "\r{:120}\r", "");
      json extras = json::object();  // MoE: per-expert load, dropped slots, aux losses
      const std::string extra_text = handle.log_extras ? handle.log_extras(extras) : std::string();
      say(format_log_line(r) + extra_text);
      if (log) {
        json line = {{"iteration", it},
                     {"consumed_samples", consumed},
                     {"lm_loss", r.loss},
                     {"lr", r.lr},
                     {"grad_norm", r.grad_norm},
                     {"seconds_per_iteration", r.seconds_per_iteration},
                     {"tokens_per_second", r.tokens_per_second},
                     {"tflops_per_gpu", r.tflops_per_gpu},
                     {"memory_allocated", r.memory_allocated},
                     {"memory_reserved", r.memory_reserved},
                     {"memory_peak", r.memory_peak}};
        line["mfu"] = r.mfu ? json(*r.mfu) : json(nullptr);
        line.update(extras);
        for (const auto& [name, value] : r.auxiliary_losses) line[name + "_loss"] = value;  // MTP
        log->write(line);
      }
      if (events) {
        events->add_scalar("lm loss", static_cast<float>(r.loss), it);
        for (const auto& [name, value] : r.auxiliary_losses)  // MTP
          events->add_scalar(name + " loss", static_cast<float>(value), it);
        events->add_scalar("learning-rate", static_cast<float>(r.lr), it);
        events->add_scalar("grad-norm", static_cast<float>(r.grad_norm), it);
        events->add_scalar("throughput/tokens_per_second", static_cast<float>(r.tokens_per_second), it);
        events->add_scalar("throughput/tflops_per_gpu", static_cast<float>(r.tflops_per_gpu), it);
        if (r.mfu) events->add_scalar("throughput/mfu", static_cast<float>(*r.mfu), it);
        events->add_scalar("memory/allocated_mib", static_cast<float>(r.memory_allocated / 1048576.0), it);
        events->add_scalar("memory/reserved_mib", static_cast<float>(r.memory_reserved / 1048576.0), it);
        events->add_scalar("memory/peak_mib", static_cast<float>(r.memory_peak / 1048576.0), it);
      }
      if (callbacks.on_log) callbacks.on_log(r);
      window_loss.zero_();
      clear_auxiliary_window();  // MTP
      window_iterations = 0;
      window_start = Clock::now();
      paused_seconds = 0;
    } else if (draw_progress) {
      fmt::print(stderr, "\r iteration {}/{} ({:.0f}%), ETA {}   ", it, iterations,
                 100.0 * static_cast<double>(it) / static_cast<double>(iterations),
                 last_seconds_per_iteration > 0 ? eta_text(last_seconds_per_iteration * (iterations - it))
                                                : std::string("..."));
    }

    const auto pause_start = Clock::now();
    if (evaluate && it % o.eval_interval == 0) {
      stop_if_diverged(last_save);
      run_eval(*datasets[1], it, "validation");
    }
    if (!o.save.empty() && o.save_interval > 0 && it % o.save_interval == 0) save(it);
    if (policy && it < iterations &&
        (policy->snapshot_due(it) || it % o.log_interval == 0 || (evaluate && it % o.eval_interval == 0) ||
         (o.save_interval > 0 && it % o.save_interval == 0)))
      take_snapshot(it);
    paused_seconds += seconds_since(pause_start);
    if (o.exit_interval > 0 && it % o.exit_interval == 0 && it < iterations) {
      exited_at = it;
      exit_reason = fmt::format("--exit-interval {}", o.exit_interval);
      break;
    }
    // Data parallelism: a signal that reached any rank stops them all at the same iteration.
    int signal_seen = o.exit_signal_handler ? static_cast<int>(exit_signal) : 0;
    if (o.exit_signal_handler && tp_size > 1)
      signal_seen = o.tensor_parallel->all_reduce_value(signal_seen, dist::ReduceOp::Max);
    if (o.exit_signal_handler && cp_size > 1)
      signal_seen = o.context_parallel->all_reduce_value(signal_seen, dist::ReduceOp::Max);
    if (o.exit_signal_handler && pp_size > 1)
      signal_seen = o.pipeline_parallel->all_reduce_value(signal_seen, dist::ReduceOp::Max);
    if (o.exit_signal_handler && dp_size > 1)
      signal_seen = o.data_parallel->all_reduce_value(signal_seen, dist::ReduceOp::Max);
    if (signal_seen != 0 && it < iterations) {
      exited_at = it;
      exit_reason = fmt::format("{} received, --exit-signal-handler", signal_seen == SIGTERM ? "SIGTERM" : "SIGINT");
      break;
    }
  }
  heartbeat.finish();  // the final save and evaluations are not iterations
  if (dp) dp->finish_param_gather();
  synchronize(device);
  stop_if_diverged(last_save);
  summary.final_loss = iteration_loss.item();
  if (exited_at > 0) {
    if (!o.save.empty() && last_save != exited_at) save(exited_at);
    say(fmt::format("exiting at iteration {} ({})", exited_at, exit_reason));
    summary.iterations = exited_at;
  } else {
    const std::int64_t done = std::max(iterations, start_iteration);
    if (!o.save.empty() && last_save != done && done > start_iteration) save(done);
    if (evaluate && done > start_iteration && done % o.eval_interval != 0) run_eval(*datasets[1], done, "validation");
    if (o.eval_iters > 0 && datasets[2] && done > start_iteration) run_eval(*datasets[2], done, "test");
    summary.iterations = done;
  }
  if (saver) saver->wait();  // the last checkpoint is on disk (or its error is thrown)
  barrier_all();             // ... before any rank goes on to read it
  summary.skipped_batches = skipped;
  if (dualpipe_grads) {
    // The copies must have taken identical steps: a difference is a bug, said rather than hidden.
    summary.dualpipe_copy_difference = dualpipe_grads->copy_difference();
    if (summary.dualpipe_copy_difference != 0)
      say(fmt::format("warning: --pipeline-schedule dualpipe: the two copies of a stage differ by up to {} (a bug)",
                      summary.dualpipe_copy_difference));
  }
  summary.seconds = seconds_since(run_start);
  if (log) {  // rank 0
    log.reset();
    write_loss_curve(log_dir / "log.jsonl", log_dir / "loss_curve.png", handle.description);
    say(fmt::format("wrote {} and {}", (log_dir / "log.jsonl").string(), (log_dir / "loss_curve.png").string()));
  }
  return summary;
}

}  // namespace kiln::train
