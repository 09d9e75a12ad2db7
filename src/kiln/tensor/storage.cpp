#include "kiln/tensor/storage.h"

#include "kiln/runtime/backend.h"

namespace kiln {

Storage::Storage(std::size_t bytes, Device device)
    : data_(backend_for(device).allocate(bytes, device.index)), bytes_(bytes), device_(device) {}

Storage::Storage(void* external, std::size_t bytes, Device device)
    : data_(external), bytes_(bytes), device_(device), owned_(false) {}

Storage::~Storage() {
  if (owned_ && data_) backends().get(device_.kind).deallocate(data_, device_.index);
}

}  // namespace kiln
