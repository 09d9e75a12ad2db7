#include "kiln/dist/work.h"

#include "kiln/dist/mpi_check.h"
#include "kiln/dist/work_state.h"
#include "kiln/runtime/error.h"

namespace kiln::dist {

namespace {

// A completed host Work's event: recorded now, so timing and query() work as for device work.
void complete_host(Work::State& s) {
  if (s.completed) return;
  if (!s.requests.empty())
    KILN_MPI_CHECK(MPI_Waitall(static_cast<int>(s.requests.size()), s.requests.data(), MPI_STATUSES_IGNORE));
  for (auto& step : s.finish) step();
  s.finish.clear();
  s.scratch.clear();
  s.int_arrays.clear();
  s.completed = true;
  if (!s.event) s.event.emplace(Device::cpu());
  s.event->record(Stream::current(Device::cpu()));
}

}  // namespace

Work::Work() : state_(std::make_unique<State>()) {
  state_->completed = true;
  state_->event.emplace(Device::cpu());
  state_->event->record(Stream::current(Device::cpu()));
}

Work::Work(std::unique_ptr<State> state) : state_(std::move(state)) {}

Work::Work(Work&&) noexcept = default;

Work& Work::operator=(Work&& other) noexcept {
  if (this != &other) {
    if (state_) {
      try {
        synchronize();
      } catch (...) {  // the run is ending with that error anyway
      }
    }
    state_ = std::move(other.state_);
  }
  return *this;
}

Work::~Work() {
  if (!state_ || state_->completed || !state_->device.is_cpu()) return;
  try {
    complete_host(*state_);
  } catch (...) {  // destructors do not throw; wait() explicitly to see the error
  }
}

void Work::wait() {
  KILN_CHECK(state_ != nullptr, "Work::wait on a moved-from Work");
  if (state_->device.is_cpu()) return complete_host(*state_);
  state_->event->wait(Stream::current(state_->device));
}

void Work::synchronize() {
  KILN_CHECK(state_ != nullptr, "Work::synchronize on a moved-from Work");
  if (state_->device.is_cpu()) return complete_host(*state_);
  state_->event->synchronize();
}

bool Work::is_completed() {
  KILN_CHECK(state_ != nullptr, "Work::is_completed on a moved-from Work");
  if (!state_->device.is_cpu()) return state_->event->query();
  if (state_->completed) return true;
  int done = 1;
  if (!state_->requests.empty())
    KILN_MPI_CHECK(
        MPI_Testall(static_cast<int>(state_->requests.size()), state_->requests.data(), &done, MPI_STATUSES_IGNORE));
  if (done) complete_host(*state_);  // requests are all null now: this only runs the finishing steps
  return done != 0;
}

const Event& Work::event() const {
  KILN_CHECK(state_ != nullptr && state_->event.has_value(),
             "Work::event: host work has its event once it completed (call wait() first)");
  return *state_->event;
}

}  // namespace kiln::dist
