#include "kiln/io/safetensors.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

namespace kiln {
namespace safetensors_test {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) { return (fs::temp_directory_path() / name).string(); }

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file from a header string and a data section, built by hand.
std::string make_file(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  std::uint64_t n = header.size();
  std::string bytes(8, '\0');
  std::memcpy(bytes.data(), &n, 8);
  return bytes + header + data;
}

template <class T>
std::string raw(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

TensorDict all_dtypes() {
  TensorDict d;
  d.insert("f64", Tensor::from_vector<double>({-1, -0.5, 0, 0.5, 1, 1.5}, {2, 3}));
  d.insert("f32", Tensor::from_vector<float>({1.5f, -2.25f, 3.0f, 1e-3f}));
  d.insert("bf16", Tensor::from_vector<float>({1.0f, -0.5f, 256.0f}).to(DType::BF16));
  d.insert("f16", Tensor::from_vector<float>({0.5f, -1.0f, 65504.0f}).to(DType::F16));
  d.insert("f8e4m3", Tensor::from_vector<float>({1.0f, -2.0f, 448.0f}).to(DType::F8E4M3));
  d.insert("f8e5m2", Tensor::from_vector<float>({1.0f, -4.0f, 0.25f}).to(DType::F8E5M2));
  d.insert("i64", Tensor::from_vector<std::int64_t>({1, -2, 3, std::int64_t{1} << 40}, {2, 2}));
  d.insert("i32", Tensor::from_vector<std::int32_t>({7, -8, 9}));
  d.insert("u8", Tensor::from_vector<std::uint8_t>({0, 1, 255}));
  d.insert("bool", Tensor::from_vector<bool>({true, false, true}));
  d.insert("scalar", Tensor::scalar(2.5));
  d.insert("empty", Tensor::zeros({0, 4}));
  return d;
}

void expect_same(const Tensor& a, const Tensor& b, const std::string& name) {
  EXPECT_EQ(a.dtype(), b.dtype()) << name;
  EXPECT_EQ(a.shape(), b.shape()) << name;
  ASSERT_EQ(a.nbytes(), b.nbytes()) << name;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  if (ca.nbytes() > 0) {
    EXPECT_EQ(std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()), 0) << name;
  }
}

TEST(Safetensors, RoundTripsEveryDTypeInOrder) {
  std::string path = temp_path("kiln_st_roundtrip.safetensors");
  TensorDict d = all_dtypes();
  d.insert("strided", Tensor::arange(0, 12).reshape({3, 4}).t());
  io::save_safetensors(path, d, {{"format", "pt"}, {"step", "12"}});
  io::SafetensorsFile f = io::load_safetensors(path);
  EXPECT_EQ(f.tensors.keys(), d.keys());
  for (const auto& [name, t] : d) expect_same(f.tensors.at(name), t, name);
  EXPECT_EQ(f.metadata, (io::Metadata{{"format", "pt"}, {"step", "12"}}));
  fs::remove(path);
}

TEST(Safetensors, GoldenBytes) {
  std::string path = temp_path("kiln_st_golden.safetensors");
  TensorDict d;
  d.insert("a", Tensor::from_vector<float>({1.0f, -2.0f}));
  d.insert("b", Tensor::scalar(5, DType::I64));
  io::save_safetensors(path, d, {{"format", "pt"}});
  std::string header = R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                       R"("b":{"dtype":"I64","shape":[],"data_offsets":[8,16]}})";
  std::string expected = make_file(header, raw(std::vector<float>{1.0f, -2.0f}) + raw(std::vector<std::int64_t>{5}));
  EXPECT_EQ(read_bytes(path), expected);
  EXPECT_EQ((read_bytes(path).size() - 16) % 8, 0u);  // header padded to a multiple of 8
  fs::remove(path);
}

TEST(Safetensors, ReadsAHandBuiltFile) {
  // Unpadded header, keys not in data order, as other writers may produce.
  std::string path = temp_path("kiln_st_hand.safetensors");
  std::string header =
      R"({"w":{"dtype":"BF16","shape":[1,2],"data_offsets":[4,8]},"v":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  write_bytes(
      path,
      make_file(header, raw(std::vector<std::int32_t>{-3}) + raw(std::vector<std::uint16_t>{0x3f80, 0xc000}), false));
  io::SafetensorsFile f = io::load_safetensors(path);
  EXPECT_EQ(f.tensors.keys(), (std::vector<std::string>{"v", "w"}));
  EXPECT_EQ(f.tensors.at("v").to_vector<std::int32_t>(), std::vector<std::int32_t>{-3});
  EXPECT_EQ(f.tensors.at("w").dtype(), DType::BF16);
  EXPECT_EQ(f.tensors.at("w").shape(), (Shape{1, 2}));
  EXPECT_EQ(f.tensors.at("w").to_vector<float>(), (std::vector<float>{1.0f, -2.0f}));
  fs::remove(path);
}

TEST(Safetensors, AnEmptyTensorWithAHugeDimensionRoundTrips) {
  // [2^62, 0]: no elements, so no bytes; the save's copy must not walk 2^62 empty rows (a fuzzer
  // input that timed out, fuzz/corpus/safetensors/empty_with_huge_dim.safetensors).
  const std::string path = temp_path("kiln_st_empty_huge.safetensors"),
                    copy = temp_path("kiln_st_empty_huge2.safetensors");
  write_bytes(path, make_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904,0],"data_offsets":[0,0]}})", ""));
  const io::SafetensorsFile f = io::load_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 1u);
  EXPECT_EQ(f.tensors.at("a").shape(), (Shape{4611686018427387904, 0}));
  EXPECT_EQ(f.tensors.at("a").numel(), 0);
  io::save_safetensors(copy, f.tensors, f.metadata);
  EXPECT_EQ(io::load_safetensors(copy).tensors.at("a").shape(), (Shape{4611686018427387904, 0}));
  fs::remove(path);
  fs::remove(copy);
}

void expect_load_error(const std::string& bytes, const std::string& what) {
  std::string path = temp_path("kiln_st_corrupt.safetensors");
  write_bytes(path, bytes);
  try {
    io::load_safetensors(path);
    ADD_FAILURE() << "expected an error mentioning '" << what << "'";
  } catch (const Error& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_NE(msg.find(what), std::string::npos) << msg;
  }
  fs::remove(path);
}

TEST(Safetensors, CorruptFilesGiveClearErrors) {
  const std::string f32x2 = raw(std::vector<float>{1, 2});
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  expect_load_error("abc", "truncated");
  expect_load_error(make_file(ok, f32x2).substr(0, 20), "beyond the file");
  expect_load_error(make_file(ok, f32x2.substr(0, 4)), "reach beyond");
  expect_load_error(make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})", f32x2), "not valid JSON");
  expect_load_error(make_file(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", f32x2),
                    "unknown dtype \"F33\"");
  expect_load_error(make_file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", f32x2), "needs 12 bytes");
  expect_load_error(make_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                              R"("b":{"dtype":"F32","shape":[1],"data_offsets":[2,6]}})",
                              f32x2),
                    "overlap");
  expect_load_error(make_file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", f32x2), "negative");
  expect_load_error(make_file(R"({"a":{"dtype":"F32","shape":[2]}})", f32x2), "data_offsets");
  // Shapes whose element or byte count wraps around 2^64 to the zero bytes the offsets span.
  expect_load_error(make_file(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
                    "tensor 'a': shape [4294967296,4294967296] of F32 holds more elements or bytes than 2^63");
  expect_load_error(make_file(R"({"a":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,0]}})", ""),
                    "more elements or bytes than 2^63");
  expect_load_error(make_file(R"({"a":{"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,0]}})", ""),
                    "more elements or bytes than 2^63");
  EXPECT_THROW(io::load_safetensors(temp_path("kiln_st_does_not_exist.safetensors")), Error);
}

TEST(Safetensors, SaveIsAtomic) {
  fs::path dir = fs::temp_directory_path() / "kiln_st_atomic";
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::string path = (dir / "m.safetensors").string();
  TensorDict first;
  first.insert("x", Tensor::ones({4}));
  io::save_safetensors(path, first);
  // A failing save (undefined tensor) leaves the old file untouched and no temporary behind.
  TensorDict bad;
  bad.insert("y", Tensor::zeros({1000}));
  bad.insert("z", Tensor());
  EXPECT_THROW(io::save_safetensors(path, bad), Error);
  EXPECT_EQ(io::load_safetensors(path).tensors.at("x").to_vector<float>(), std::vector<float>(4, 1.0f));
  // Overwriting works and leaves only the target file.
  TensorDict second;
  second.insert("y", Tensor::zeros({2}));
  io::save_safetensors(path, second);
  EXPECT_EQ(io::load_safetensors(path).tensors.keys(), std::vector<std::string>{"y"});
  int files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(dir)) ++files;
  EXPECT_EQ(files, 1);
  fs::remove_all(dir);
}

std::string run_command(const std::string& cmd, int& status) {
  std::string out;
  FILE* f = popen(cmd.c_str(), "r");
  if (!f) {
    status = -1;
    return out;
  }
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) out.append(buf, n);
  status = pclose(f);
  return out;
}

TEST(Safetensors, IndependentPythonReaderAgrees) {
  int status = 0;
  run_command("python3 -c 'import json, struct' 2>/dev/null", status);
  if (status != 0) GTEST_SKIP() << "python3 not found";
  std::string path = temp_path("kiln_st_python.safetensors");
  TensorDict d = all_dtypes();
  io::save_safetensors(path, d, {{"format", "pt"}});
  std::string out = run_command("python3 " KILN_SOURCE_DIR "/tests/parity/read_safetensors.py " + path, status);
  ASSERT_EQ(status, 0) << out;
  nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["metadata"]["format"], "pt");
  for (const auto& [name, t] : d) {
    const auto& e = j["tensors"][name];
    EXPECT_EQ(e["dtype"].get<std::string>(), io::safetensors_dtype_name(t.dtype())) << name;
    EXPECT_EQ(e["shape"].get<Shape>(), t.shape()) << name;
    if (t.dtype() == DType::F8E4M3 || t.dtype() == DType::F8E5M2 || t.dtype() == DType::U8) continue;
    std::vector<double> want = t.to_vector<double>();
    ASSERT_EQ(e["values"].size(), want.size()) << name;
    for (std::size_t i = 0; i < want.size(); ++i) {
      const auto& v = e["values"][i];
      EXPECT_EQ(v.is_boolean() ? (v.get<bool>() ? 1.0 : 0.0) : v.get<double>(), want[i]) << name;
    }
  }
  fs::remove(path);
}

// Writes build/parity/kiln_written.safetensors for tests/parity/check_safetensors_pkg.py (run
// where the safetensors package is installed), and reads the package's file back when present.
TEST(Safetensors, WritesParityFile) {
  fs::path dir = fs::path(KILN_BINARY_DIR) / "parity";
  fs::create_directories(dir);
  TensorDict d = all_dtypes();
  io::save_safetensors((dir / "kiln_written.safetensors").string(), d, {{"format", "pt"}});
  fs::path pkg = dir / "pkg_written.safetensors";
  if (!fs::exists(pkg))
    GTEST_SKIP() << "wrote " << (dir / "kiln_written.safetensors").string() << "; " << pkg.string()
                 << " is missing, so reading the safetensors package's file is not checked (run "
                    "tests/parity/check_safetensors_pkg.py where the package is installed)";
  io::SafetensorsFile f = io::load_safetensors(pkg.string());
  EXPECT_EQ(f.metadata.at("writer"), "safetensors-python");
  for (const char* name : {"f64", "f32", "f16", "i64", "i32", "u8", "bool", "scalar", "empty"})
    expect_same(f.tensors.at(name), d.at(name), name);
}

}  // namespace safetensors_test
}  // namespace kiln
