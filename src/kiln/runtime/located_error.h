#pragma once
// Errors that know the source line they were thrown from. KILN_CHECK / KILN_FAIL and the checked
// vendor calls throw these. what() stays "<message> (<file>:<line>)", so logs and tests keep the
// location; message() is the text alone, which is what users of the `kiln` command line see (the
// location only with --verbose or KILN_VERBOSE=1).
#include <exception>
#include <string>

#include "kiln/runtime/error.h"

namespace kiln {

// The part a located error adds: its message without the location, and the location.
class SourceLocated {
 public:
  SourceLocated(std::string message, std::string file, int line)
      : message_(std::move(message)), file_(std::move(file)), line_(line) {}
  virtual ~SourceLocated() = default;

  const std::string& message() const { return message_; }
  const std::string& file() const { return file_; }  // relative to the repository, see short_source_path
  int line() const { return line_; }

 private:
  std::string message_;
  std::string file_;
  int line_;
};

class LocatedError : public Error, public SourceLocated {
 public:
  LocatedError(const std::string& message, const char* file, int line);
};

class LocatedOutOfMemoryError : public OutOfMemoryError, public SourceLocated {
 public:
  LocatedOutOfMemoryError(const std::string& message, const char* file, int line);
};

// __FILE__ shortened to the part below the checkout ("kiln/ops/matmul.cpp", "apps/kiln/main.cpp"):
// builds without ccache's base_dir see absolute paths, which say nothing useful and differ per machine.
const char* short_source_path(const char* file);

// What to show a user for an exception: a located error's message without its location (or with it,
// when with_location), anything else's what().
std::string error_message(const std::exception& e, bool with_location = false);

}  // namespace kiln
