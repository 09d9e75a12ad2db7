#pragma once
// The deleter of a std::unique_ptr<std::FILE, FileCloser>: the C stdio handles that libpng and the
// digest reader need, closed on every path out of the function.
#include <cstdio>

namespace kiln::io {

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

}  // namespace kiln::io
