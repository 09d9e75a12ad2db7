#pragma once
// The local matrix of the CPU HPL, in 2 MiB-aligned memory the kernel is asked to back with
// transparent huge pages. The update's DGEMM packs panels that stride across thousands of columns
// and the row swaps touch one entry per column: with 4 KiB pages every column is its own TLB entry.
// Where THP is off (or "never"), madvise fails quietly and this is ordinary memory.
#include <sys/mman.h>

#include <cstddef>
#include <cstdlib>
#include <new>

namespace kiln::hpl {

class HugePageArray {
 public:
  explicit HugePageArray(std::size_t count) {
    constexpr std::size_t kHugePage = std::size_t{2} << 20;
    const std::size_t bytes = (count * sizeof(double) + kHugePage - 1) / kHugePage * kHugePage;
    data_ = static_cast<double*>(std::aligned_alloc(kHugePage, bytes));
    if (data_ == nullptr) throw std::bad_alloc();
    madvise(data_, bytes, MADV_HUGEPAGE);  // advice only; failure leaves normal pages
    // Not zero-filled: the solver's generate() writes every entry, so each page is touched once.
  }
  ~HugePageArray() { std::free(data_); }
  HugePageArray(const HugePageArray&) = delete;
  HugePageArray& operator=(const HugePageArray&) = delete;
  double* data() const { return data_; }

 private:
  double* data_ = nullptr;
};

}  // namespace kiln::hpl
