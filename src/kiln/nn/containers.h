#pragma once
// Sequential (a chain of Tensor -> Tensor modules) and ModuleList (an indexed list of modules
// whose parameters are registered; the owner decides how to call them).
#include <initializer_list>
#include <memory>
#include <vector>

#include "kiln/nn/module.h"

namespace kiln::nn {

class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  Sequential(std::initializer_list<std::shared_ptr<UnaryModule>> modules);
  explicit Sequential(std::vector<std::shared_ptr<UnaryModule>> modules);

  // Appends under the next index ("0", "1", ...) or an explicit name.
  Sequential& push_back(std::shared_ptr<UnaryModule> module);
  Sequential& push_back(const std::string& name, std::shared_ptr<UnaryModule> module);
  Tensor forward(const Tensor& x) override;

  std::size_t size() const { return modules_.size(); }
  const std::shared_ptr<UnaryModule>& operator[](std::size_t i) const;
  template <class M>
  std::shared_ptr<M> at(std::size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    KILN_CHECK(m != nullptr, "Sequential: module {} is a {}, not the requested type", i, (*this)[i]->type_name());
    return m;
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<UnaryModule>> modules_;
};

class ModuleList : public Module {
 public:
  ModuleList() : Module("ModuleList") {}
  ModuleList(std::initializer_list<std::shared_ptr<Module>> modules);

  ModuleList& push_back(std::shared_ptr<Module> module);  // registered as "0", "1", ...
  std::size_t size() const { return modules_.size(); }
  const std::shared_ptr<Module>& operator[](std::size_t i) const;
  template <class M>
  std::shared_ptr<M> at(std::size_t i) const {
    auto m = std::dynamic_pointer_cast<M>((*this)[i]);
    KILN_CHECK(m != nullptr, "ModuleList: module {} is a {}, not the requested type", i, (*this)[i]->type_name());
    return m;
  }
  auto begin() const { return modules_.begin(); }
  auto end() const { return modules_.end(); }

 private:
  std::vector<std::shared_ptr<Module>> modules_;
};

}  // namespace kiln::nn
