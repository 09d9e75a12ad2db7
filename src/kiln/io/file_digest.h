#pragma once
// Hex digests (MD5, SHA-1) of files and byte strings, to check downloads against published sums.
// OpenSSL's EVP interface (libssl-dev) computes them: a maintained, tested implementation is worth
// one Debian dependency more than a hand-written hash whose bugs would pass corrupt data as good.
#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>

namespace kiln::io {

enum class DigestKind { MD5, SHA1 };

// Lower-case hex digest of a file's bytes; throws naming the file if it cannot be read.
std::string file_digest_hex(const std::filesystem::path& path, DigestKind kind);
std::string digest_hex(std::string_view bytes, DigestKind kind);

}  // namespace kiln::io
