#pragma once
// OrderedDict: a string-keyed map that keeps insertion order, as Python's dict and PyTorch's
// state_dict() do. TensorDict (name -> Tensor) is what state dicts, optimizer state and
// safetensors files are made of.
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/runtime/error.h"
#include "kiln/tensor/tensor.h"

namespace kiln {

template <class V>
class OrderedDict {
 public:
  using Item = std::pair<std::string, V>;

  OrderedDict() = default;
  OrderedDict(std::initializer_list<Item> items) {
    for (const auto& [k, v] : items) insert(k, v);
  }

  // Inserts a new key (an error if it exists) and returns the stored value.
  V& insert(std::string key, V value) {
    KILN_CHECK(!contains(key), "OrderedDict: the key '{}' is already present", key);
    index_.emplace(key, items_.size());
    items_.emplace_back(std::move(key), std::move(value));
    return items_.back().second;
  }
  // Inserts or overwrites (keeping the original position).
  V& set(const std::string& key, V value) {
    if (auto it = index_.find(key); it != index_.end()) return items_[it->second].second = std::move(value);
    return insert(key, std::move(value));
  }
  bool contains(const std::string& key) const { return index_.count(key) != 0; }
  const V* find(const std::string& key) const {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  V* find(const std::string& key) {
    auto it = index_.find(key);
    return it == index_.end() ? nullptr : &items_[it->second].second;
  }
  const V& at(const std::string& key) const {
    const V* v = find(key);
    KILN_CHECK(v != nullptr, "OrderedDict: no key '{}'", key);
    return *v;
  }
  V& at(const std::string& key) {
    V* v = find(key);
    KILN_CHECK(v != nullptr, "OrderedDict: no key '{}'", key);
    return *v;
  }
  std::vector<std::string> keys() const {
    std::vector<std::string> k;
    k.reserve(items_.size());
    for (const auto& item : items_) k.push_back(item.first);
    return k;
  }

  std::size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  const Item& operator[](std::size_t i) const { return items_[i]; }
  Item& operator[](std::size_t i) { return items_[i]; }
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<Item> items_;
  std::unordered_map<std::string, std::size_t> index_;
};

using TensorDict = OrderedDict<Tensor>;

}  // namespace kiln
