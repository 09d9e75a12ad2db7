#include "kiln/nn/containers.h"

#include <string>

namespace kiln::nn {

Sequential::Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules) : UnaryModule("Sequential") {
  for (const auto& m : modules) push_back(m);
}

Sequential::Sequential(std::vector<std::shared_ptr<UnaryModule>> modules) : UnaryModule("Sequential") {
  for (auto& m : modules) push_back(std::move(m));
}

Sequential& Sequential::push_back(std::shared_ptr<UnaryModule> module) {
  return push_back(std::to_string(modules_.size()), std::move(module));
}

Sequential& Sequential::push_back(const std::string& name, std::shared_ptr<UnaryModule> module) {
  register_module(name, module);
  modules_.push_back(std::move(module));
  return *this;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (const auto& m : modules_) y = m->forward(y);
  return y;
}

const std::shared_ptr<UnaryModule>& Sequential::operator[](std::size_t i) const {
  KILN_CHECK(i < modules_.size(), "Sequential: index {} out of range (size {})", i, modules_.size());
  return modules_[i];
}

ModuleList::ModuleList(std::initializer_list<std::shared_ptr<Module>> modules) : Module("ModuleList") {
  for (const auto& m : modules) push_back(m);
}

ModuleList& ModuleList::push_back(std::shared_ptr<Module> module) {
  register_module(std::to_string(modules_.size()), module);
  modules_.push_back(std::move(module));
  return *this;
}

const std::shared_ptr<Module>& ModuleList::operator[](std::size_t i) const {
  KILN_CHECK(i < modules_.size(), "ModuleList: index {} out of range (size {})", i, modules_.size());
  return modules_[i];
}

}  // namespace kiln::nn
