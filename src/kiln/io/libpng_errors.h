#pragma once
// libpng reports errors through a callback that must not return; Kiln's png reader and writer
// longjmp back to a setjmp in a frame without C++ objects and turn the message into kiln::Error.
// Internal to io/ (not installed API).
#include <png.h>

#include <cstdio>

namespace kiln::io::detail {

struct PngErrorState {
  char message[256] = "unknown libpng error";
};

[[noreturn]] inline void png_error_to_longjmp(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngErrorState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof(state->message), "%s", message);
  png_longjmp(png, 1);
}

inline void png_ignore_warning(png_structp, png_const_charp) {}

}  // namespace kiln::io::detail
