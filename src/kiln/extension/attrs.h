#pragma once
// Attrs: the non-tensor arguments of a custom op (scalars, flags, names, int lists), by name.
// Example: kiln::call_op("bias_gelu", {x, b}, {{"approximate", "tanh"}, {"alpha", 0.5}}).
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "kiln/runtime/error.h"

namespace kiln {

using AttrValue = std::variant<bool, std::int64_t, double, std::string, std::vector<std::int64_t>>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<const std::string, AttrValue>> values) : values_(values) {}

  Attrs& set(std::string name, AttrValue value);
  bool has(std::string_view name) const { return values_.find(name) != values_.end(); }
  bool empty() const { return values_.empty(); }
  // The value of `name` as T (an int64 attribute reads as double too); throws kiln::Error naming
  // the attribute when it is missing or of another type.
  template <class T>
  T get(std::string_view name) const;
  // As get(), but `fallback` when the attribute is not set.
  template <class T>
  T get(std::string_view name, T fallback) const {
    return has(name) ? get<T>(name) : fallback;
  }
  std::string str() const;  // "{alpha=0.5, approximate="tanh"}": for error messages

 private:
  [[noreturn]] void type_error(std::string_view name, const char* wanted) const;
  const AttrValue& at(std::string_view name) const;

  std::map<std::string, AttrValue, std::less<>> values_;
};

template <class T>
T Attrs::get(std::string_view name) const {
  const AttrValue& v = at(name);
  if constexpr (std::is_same_v<T, double> || std::is_same_v<T, float>) {
    if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<T>(*i);
    if (const auto* d = std::get_if<double>(&v)) return static_cast<T>(*d);
    type_error(name, "a floating-point number");
  } else if constexpr (std::is_same_v<T, bool>) {
    if (const auto* b = std::get_if<bool>(&v)) return *b;
    type_error(name, "a bool");
  } else if constexpr (std::is_integral_v<T>) {
    if (const auto* i = std::get_if<std::int64_t>(&v)) return static_cast<T>(*i);
    type_error(name, "an integer");
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (const auto* s = std::get_if<std::string>(&v)) return *s;
    type_error(name, "a string");
  } else {
    static_assert(std::is_same_v<T, std::vector<std::int64_t>>, "Attrs::get: unsupported attribute type");
    if (const auto* l = std::get_if<std::vector<std::int64_t>>(&v)) return *l;
    type_error(name, "a list of integers");
  }
}

}  // namespace kiln
