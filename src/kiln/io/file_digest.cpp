#include "kiln/io/file_digest.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "kiln/io/file_closer.h"
#include "kiln/runtime/error.h"

namespace kiln::io {

namespace {

struct DigestContext {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~DigestContext() { EVP_MD_CTX_free(ctx); }
};

const EVP_MD* digest_algorithm(DigestKind kind) { return kind == DigestKind::MD5 ? EVP_md5() : EVP_sha1(); }

std::string finish_hex(DigestContext& context) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  KILN_CHECK(EVP_DigestFinal_ex(context.ctx, digest, &length) == 1, "OpenSSL digest failed");
  static constexpr char kHex[] = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) {
    hex += kHex[digest[i] >> 4];
    hex += kHex[digest[i] & 15];
  }
  return hex;
}

}  // namespace

std::string digest_hex(std::string_view bytes, DigestKind kind) {
  DigestContext context;
  KILN_CHECK(context.ctx && EVP_DigestInit_ex(context.ctx, digest_algorithm(kind), nullptr) == 1 &&
                 EVP_DigestUpdate(context.ctx, bytes.data(), bytes.size()) == 1,
             "OpenSSL digest failed");
  return finish_hex(context);
}

std::string file_digest_hex(const std::filesystem::path& path, DigestKind kind) {
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(path.c_str(), "rb"));
  KILN_CHECK(file, "cannot open '{}' to check its digest: {}", path.string(), std::strerror(errno));
  DigestContext context;
  KILN_CHECK(context.ctx && EVP_DigestInit_ex(context.ctx, digest_algorithm(kind), nullptr) == 1,
             "OpenSSL digest failed");
  std::vector<char> buffer(1 << 20);
  std::size_t n = 0;
  while ((n = std::fread(buffer.data(), 1, buffer.size(), file.get())) > 0) {
    KILN_CHECK(EVP_DigestUpdate(context.ctx, buffer.data(), n) == 1, "OpenSSL digest failed");
  }
  KILN_CHECK(!std::ferror(file.get()), "cannot read '{}': {}", path.string(), std::strerror(errno));
  return finish_hex(context);
}

}  // namespace kiln::io
