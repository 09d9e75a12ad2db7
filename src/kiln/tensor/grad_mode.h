#pragma once
// Whether operations record the autograd graph (thread-local, like torch.is_grad_enabled).
// Lives in tensor/ so that raw in-place ops below autograd can refuse to modify leaves.
namespace kiln {

bool grad_enabled();
void set_grad_enabled(bool on);

// Scope in which nothing is recorded: optimizer updates, evaluation.
class NoGradGuard {
 public:
  NoGradGuard() : previous_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace kiln
