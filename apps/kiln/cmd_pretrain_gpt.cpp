// `kiln pretrain-gpt`: Megatron-LM's pretrain_gpt.py with Megatron's flag names, on one device or, under
// mpirun, data- and tensor-parallel over MPI ranks (docs/parallel.md).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "commands.h"
#include "kiln/data/tokenizer_factory.h"
#include "kiln/dist/launch_environment.h"
#include "kiln/dist/process_groups.h"
#include "kiln/io/atomic_file.h"
#include "kiln/runtime/backend.h"
#include "kiln/train/gpt_pretrain.h"
#include "pretrain_gpt_flags.h"

namespace kiln::cli {

namespace {

// Copies the tokenizer's files into <save>/tokenizer/ under import-hf's names (tokenizer.json,
// vocab.json, merges.txt; a --tokenizer-model folder as tokenizer/model/), so a checkpoint folder is self-contained:
// generate and export-hf read them there before the recorded paths (which may be relative to another working
// directory).
void copy_tokenizer_into_save(const data::TokenizerSpec& spec, const std::filesystem::path& save) {
  namespace fs = std::filesystem;
  const fs::path dir = save / "tokenizer";
  auto copy = [&](const fs::path& from, const std::string& name) {
    if (from.empty()) return;
    const fs::path to = dir / name;
    std::error_code ec;
    if (fs::exists(to, ec) && fs::equivalent(from, to, ec)) return;  // already the checkpoint's own copy
    std::ifstream in(from, std::ios::binary);
    KILN_CHECK(in.good(), "cannot read the tokenizer file {} to copy it into {}", from.string(), dir.string());
    std::stringstream bytes;
    bytes << in.rdbuf();
    io::AtomicFile out(to);
    out.write(bytes.str());
    out.commit();
  };
  if (!spec.model.empty() && fs::is_directory(spec.model)) {
    // --tokenizer-model a folder (GPT-2's files, or a Hugging Face folder): its files, as a folder.
    for (const auto& entry : fs::directory_iterator(spec.model))
      if (entry.is_regular_file()) copy(entry.path(), fmt::format("model/{}", entry.path().filename().string()));
  } else {
    copy(spec.model, "tokenizer.json");
  }
  copy(spec.vocab_file, "vocab.json");
  copy(spec.merge_file, "merges.txt");
}

// True when an MPI launcher (mpirun / mpiexec of Open MPI or MPICH, srun with PMIx or PMI-2, kiln
// launch over either) started more than one process: only then does pretrain-gpt start MPI (a plain
// run never touches it). srun with PMIx sets no size variable of PMIx's: Slurm's SLURM_NTASKS tells.
bool launched_as_several_ranks() {
  const auto position = dist::launch_position_from_environment();
  if (position && position->size > 1) return true;
  for (const char* name : {"PMIX_SIZE", "MPI_LOCALNRANKS"})
    if (const char* v = std::getenv(name); v != nullptr && std::atoi(v) > 1) return true;
  return false;
}

// Data, tensor, context, pipeline and expert parallelism: the world's ranks in Megatron's layout
// (tp x cp x dp x pp, the tensor-parallel ranks adjacent, the pipeline stages farthest apart; experts
// over etp x ep x edp x pp), and one GPU per rank on each node.
void join_parallel_groups(PretrainGptFlags& f) {
  const int tp = f.config.tensor_model_parallel_size, pp = f.pipeline_model_parallel_size;
  // Expert parallelism: the expert-parallel ranks are tensor- and data-parallel ranks of the dense
  // layers (Megatron's expert rank generator: etp x ep x edp x pp; with etp 1, whole experts, and tp
  // 2 and ep 2 the expert-parallel groups are the tensor-parallel pairs; with etp 2 the pairs split
  // each expert and the expert-parallel groups stride over them).
  const int ep = f.config.expert_model_parallel_size, etp = f.config.expert_tensor_parallel_size;
  const int cp = f.config.context_parallel_size;
  if (!launched_as_several_ranks()) {
    if (tp > 1)
      throw CLI::ValidationError("--tensor-model-parallel-size",
                                 fmt::format("{} needs {} or a multiple of {} ranks: launch with mpirun -np {} (or "
                                             "srun); this is one process",
                                             tp, tp, tp, tp));
    if (ep > 1)
      throw CLI::ValidationError("--expert-model-parallel-size",
                                 fmt::format("{} needs {} or a multiple of {} ranks: launch with mpirun -np {} (or "
                                             "srun); this is one process",
                                             ep, ep, ep, ep));
    if (etp > 1)
      throw CLI::ValidationError("--expert-tensor-parallel-size",
                                 fmt::format("{} needs {} or a multiple of {} ranks: launch with mpirun -np {} (or "
                                             "srun); this is one process",
                                             etp, etp, etp, etp));
    if (cp > 1)
      throw CLI::ValidationError("--context-parallel-size",
                                 fmt::format("{} needs a multiple of {} ranks (x --tensor-model-parallel-size): launch "
                                             "with mpirun -np {} (or srun); this is one process",
                                             cp, cp, cp * tp));
    if (pp > 1)
      throw CLI::ValidationError("--pipeline-model-parallel-size",
                                 fmt::format("{} needs {} or a multiple of {} ranks: launch with mpirun -np {} (or "
                                             "srun); this is one process",
                                             pp, pp, pp, pp));
    return;
  }
  dist::Communicator world = dist::Communicator::world();
  if (world.size() == 1 && tp == 1 && ep == 1 && etp == 1 && cp == 1 && pp == 1) return;
  if (world.size() % tp != 0)
    throw CLI::ValidationError("--tensor-model-parallel-size",
                               fmt::format("{} does not divide the world of {} ranks (mpirun -np {}): the ranks "
                                           "are tensor-parallel groups of {} times data-parallel ranks",
                                           tp, world.size(), world.size(), tp));
  if (world.size() % ep != 0)
    throw CLI::ValidationError("--expert-model-parallel-size",
                               fmt::format("{} does not divide the world of {} ranks (mpirun -np {}): the ranks "
                                           "are expert-parallel groups of {} times expert-data-parallel ranks",
                                           ep, world.size(), world.size(), ep));
  if (world.size() % (tp * cp) != 0)
    throw CLI::ValidationError("--context-parallel-size",
                               fmt::format("{} x --tensor-model-parallel-size {} does not divide the world of {} ranks "
                                           "(mpirun -np {}): the world is tp x cp x dp",
                                           cp, tp, world.size(), world.size()));
  if (world.size() % (tp * cp * pp) != 0)
    throw CLI::ValidationError("--pipeline-model-parallel-size",
                               fmt::format("{} (x --tensor-model-parallel-size {} x --context-parallel-size {}) does "
                                           "not divide the world of {} ranks (mpirun -np {}): the ranks are {} "
                                           "pipeline stages times data-parallel ranks",
                                           pp, tp, cp, world.size(), world.size(), pp));
  // (After the dense sizes' checks, which name the flags a user most likely got wrong.)
  if (etp > 1 && world.size() % (etp * ep * pp) != 0)
    throw CLI::ValidationError("--expert-tensor-parallel-size",
                               fmt::format("{} x --expert-model-parallel-size {} x --pipeline-model-parallel-size {} "
                                           "does not divide the world of {} ranks (mpirun -np {}): the experts' ranks "
                                           "are etp x ep x edp x pp",
                                           etp, ep, pp, world.size(), world.size()));
  auto groups = std::make_shared<const dist::ProcessGroups>(
      world, dist::ParallelSizes{.tp = tp, .pp = pp, .cp = cp, .ep = ep, .etp = etp});
  auto& o = f.options;
  o.data_parallel = groups->dp();  // the sampler's ranks; the gradients reduce over dp x cp
  if (tp > 1) o.tensor_parallel = groups->tp();
  if (cp > 1) {
    o.context_parallel = groups->cp();
    o.data_context_parallel = groups->dp_cp();
  }
  if (pp > 1) o.pipeline_parallel = groups->pp();
  o.process_groups = groups;
  if (o.device.is_cuda() && f.device.empty()) {
    const int local_rank = world.split_node_local().rank();
    o.device = Device::cuda(local_rank % device_count(DeviceKind::CUDA));
  }
}

}  // namespace

void add_pretrain_gpt(CLI::App& app) {
  auto f = std::make_shared<PretrainGptFlags>();
  auto* cmd = app.add_subcommand(
      "pretrain-gpt", "Train a GPT-2 or Llama style model from scratch (Megatron-LM's pretrain_gpt.py flags)");
  cmd->footer(
      "Example (a tiny GPT on tinyshakespeare, CPU):\n"
      "  kiln preprocess-data --input input.txt --output-prefix data/shakespeare --tokenizer-type GPT2BPETokenizer "
      "--vocab-file vocab.json --merge-file merges.txt\n"
      "  kiln pretrain-gpt --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "
      "--micro-batch-size 8 --global-batch-size 16 --train-iters 200 --lr 1e-3 --lr-decay-style cosine "
      "--data-path data/shakespeare_text_document --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json "
      "--merge-file merges.txt --save runs/tiny --save-interval 100\n"
      "See docs/llm.md for every flag.");
  add_pretrain_gpt_flags(cmd, *f, GptFlagsFor::PretrainGpt);

  cmd->callback([f, cmd] {
    resolve_pretrain_gpt_flags(cmd, *f, GptFlagsFor::PretrainGpt);
    join_parallel_groups(*f);
    auto& c = f->config;
    auto& o = f->options;
    const bool rank0 = o.is_first_rank();
    const bool has_tokenizer = !f->tokenizer.type.empty();
    // The command line as given, for the checkpoints' record.
    std::vector<std::pair<std::string, std::string>> all_flags;
    for (const CLI::Option* opt : cmd->get_options()) {
      if (opt->count() == 0 || opt->get_group().empty()) continue;
      std::string value;
      for (const auto& r : opt->results()) value += (value.empty() ? "" : " ") + r;
      all_flags.emplace_back(opt->get_name(), value);
    }
    if (has_tokenizer && !o.save.empty() && rank0) copy_tokenizer_into_save(f->tokenizer.spec(), o.save);
    auto summary = train::pretrain_gpt(c, o, all_flags);
    if (!rank0) return;
    fmt::print("done: {} iterations in {:.1f} s{}\n", summary.iterations - summary.start_iteration, summary.seconds,
               summary.checkpoints_written.empty()
                   ? std::string()
                   : fmt::format(", last checkpoint {} (saves held training up at most {:.3f} s{})",
                                 summary.checkpoints_written.back().string(), summary.max_save_stall_seconds,
                                 o.async_save ? ", written in the background" : ""));
    if (!summary.rewinds.empty() || !summary.skipped_batches.empty())
      fmt::print(
          "Rewinds: {} in this run; skipped global batches (iterations): {} (rerun with --skip-batches {} to "
          "reproduce)\n",
          summary.rewinds.size(), train::skip_list_text(summary.skipped_batches),
          train::skip_list_text(summary.skipped_batches));
  });
}

}  // namespace kiln::cli
