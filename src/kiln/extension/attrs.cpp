#include "kiln/extension/attrs.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace kiln {

Attrs& Attrs::set(std::string name, AttrValue value) {
  values_.insert_or_assign(std::move(name), std::move(value));
  return *this;
}

const AttrValue& Attrs::at(std::string_view name) const {
  auto it = values_.find(name);
  KILN_CHECK(it != values_.end(), "attribute '{}' is not set (attributes: {})", name, str());
  return it->second;
}

void Attrs::type_error(std::string_view name, const char* wanted) const {
  KILN_FAIL("attribute '{}' is not {} (attributes: {})", name, wanted, str());
}

std::string Attrs::str() const {
  std::string out = "{";
  for (const auto& [name, value] : values_) {
    if (out.size() > 1) out += ", ";
    out += name + "=";
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, std::string>)
            out += fmt::format("\"{}\"", v);
          else
            out += fmt::format("{}", v);
        },
        value);
  }
  return out + "}";
}

}  // namespace kiln
