#pragma once
// Fault injection for the tests of the training machinery: the failures large runs die of, made
// to happen on purpose at a chosen moment. One environment variable, read once per process:
//
//   KILN_FAULT=nan_loss@12,spike@20,crash@30,kill_in_save@2,disk_full_in_save@3,corrupt_checkpoint@4
//
//   nan_loss@S            the loss of training step S is multiplied by NaN (so are its gradients)
//   spike@S               the loss of step S is multiplied by kSpikeFactor (its gradients too)
//   crash@S               the process kills itself (SIGKILL) just before step S
//   hang@S                the process stops just before step S, for good (sleeps; no heartbeat,
//                         no exit): a hung rank, for `kiln launch`'s heartbeat timeout
//   kill_in_save@N        the process kills itself (SIGKILL) half-way through writing save N
//   disk_full_in_save@N   a write of save N fails with ENOSPC, as a full disk makes it
//   corrupt_checkpoint@N  after save N is complete, one byte of its first tensor file is flipped
//
// Steps count training batches from the start of the run, 1-based (the same numbering as the
// checkpoints' iterations: step S is the batch that makes iteration S); saves count the
// checkpoint saves of this process, 1-based. Each fault fires at most once per process, the first
// time its step is computed, so a rewind that replays step S does not meet its fault again (a
// rerun of the data after a real spike would not either, since the batch is skipped). A trainer
// that judges steps in batches (train-cifar10 with --rewind: per snapshot interval) computes a few
// steps in vain after a bad one; faults planned there fire then, and are rolled back with them.
//
// Two more variables, for jobs of several ranks that `kiln launch` restarts (docs/launch.md):
//   KILN_FAULT_RANK=R     only the rank R of the job (the launcher's rank, dist/launch_environment.h)
//                         plans the faults; the other ranks ignore KILN_FAULT
//   KILN_FAULT_ONCE=DIR   a fault fires only if it can create the marker file DIR/<fault>@<N>
//                         (exclusively): once across every process and restart that shares DIR,
//                         so the restarted job runs through
//
// Zero cost when unset: every hook is an inline test of one process-wide flag, false unless
// KILN_FAULT names something. A malformed KILN_FAULT is an error naming the bad entry.
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>

namespace kiln::train {

enum class FaultKind { NanLoss, Spike, Crash, Hang, KillInSave, DiskFullInSave, CorruptCheckpoint };

inline constexpr double kSpikeFactor = 1000.0;

namespace detail {
extern std::atomic<bool> g_faults_armed;  // true when KILN_FAULT (or a test) planned any fault
bool fault_fires(FaultKind kind, std::int64_t at);
}  // namespace detail

// Parses KILN_FAULT the first time; later calls return at once. Call it at the start of a run so
// a malformed value fails before any work.
void arm_faults_from_environment();

// Replaces the plan (tests): `spec` in KILN_FAULT's syntax, "" for none; fired faults are forgotten.
void set_fault_plan_for_testing(const std::string& spec);

// True (once) when a fault of `kind` is planned at `at` (a step or a save number).
inline bool fault_fires(FaultKind kind, std::int64_t at) {
  return detail::g_faults_armed.load(std::memory_order_relaxed) && detail::fault_fires(kind, at);
}

// The factor the loss of step `step` is multiplied by (NaN, kSpikeFactor), or nullopt: no fault.
std::optional<double> loss_fault_factor(std::int64_t step);

// SIGKILLs the process when crash@step is planned; stops it for good when hang@step is.
void crash_if_planned(std::int64_t step);

// The name of a fault kind as KILN_FAULT spells it.
const char* fault_name(FaultKind kind);

}  // namespace kiln::train
