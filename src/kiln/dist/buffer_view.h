#pragma once
// BufferView: the typed memory a collective reads or writes: where it starts, how many elements,
// of which type, on which device. dist takes these (it sits below tensor/); tensor/collectives.h
// makes them from Tensors.
#include <cstddef>
#include <string>

#include "kiln/dist/element_type.h"
#include "kiln/runtime/device.h"

namespace kiln::dist {

struct BufferView {
  void* data = nullptr;
  std::size_t count = 0;  // elements
  ElementType type = ElementType::F32;
  Device device = Device::cpu();

  std::size_t bytes() const { return count * element_size(type); }
};

// The same for buffers a call only reads (a send, a collective's input).
struct ConstBufferView {
  const void* data = nullptr;
  std::size_t count = 0;
  ElementType type = ElementType::F32;
  Device device = Device::cpu();

  ConstBufferView() = default;
  ConstBufferView(const void* d, std::size_t n, ElementType t, Device dev) : data(d), count(n), type(t), device(dev) {}
  ConstBufferView(const BufferView& b) : data(b.data), count(b.count), type(b.type), device(b.device) {}  // NOLINT
  std::size_t bytes() const { return count * element_size(type); }
};

// "12 x bf16 on cuda:0", for error messages.
std::string describe(const ConstBufferView& buffer);

}  // namespace kiln::dist
