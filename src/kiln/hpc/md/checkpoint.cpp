#include "kiln/hpc/md/checkpoint.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "kiln/hpc/md/atomic_write.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'M', 'D', 'C', '1'};

template <class T>
void put(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void put_vectors(std::string& out, const std::vector<Vec3>& v) {
  put(out, static_cast<std::int64_t>(v.size()));
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(Vec3));
}

class Reader {
 public:
  Reader(std::string data, std::string name) : data_(std::move(data)), name_(std::move(name)) {}
  template <class T>
  T get(const char* what) {
    KILN_CHECK(at_ + sizeof(T) <= data_.size(), "{}: truncated checkpoint (reading {})", name_, what);
    T v;
    std::memcpy(&v, data_.data() + at_, sizeof(T));
    at_ += sizeof(T);
    return v;
  }
  std::vector<Vec3> vectors(const char* what, std::int64_t expected) {
    auto n = get<std::int64_t>(what);
    KILN_CHECK(n == expected, "{}: the checkpoint has {} {} but the system has {} atoms", name_, n, what, expected);
    KILN_CHECK(at_ + n * sizeof(Vec3) <= data_.size(), "{}: truncated checkpoint (reading {})", name_, what);
    std::vector<Vec3> v(n);
    std::memcpy(v.data(), data_.data() + at_, n * sizeof(Vec3));
    at_ += n * sizeof(Vec3);
    return v;
  }
  std::string rest() { return data_.substr(at_); }

 private:
  std::string data_, name_;
  std::size_t at_ = 0;
};

}  // namespace

std::string generator_state(const std::mt19937_64& rng, const std::normal_distribution<double>& normal) {
  std::ostringstream out;
  out << rng << ' ' << normal;
  return out.str();
}

void restore_generators(const std::string& state, std::mt19937_64& rng, std::normal_distribution<double>& normal) {
  std::istringstream in(state);
  in >> rng >> normal;
  KILN_CHECK(!in.fail(), "mdrun: the checkpoint's generator state is unreadable");
}

void write_checkpoint(const std::filesystem::path& path, const EngineCheckpoint& c) {
  std::string out(kMagic, sizeof(kMagic));
  put(out, c.next_step);
  put_vectors(out, c.positions);
  put_vectors(out, c.velocities);
  for (double b : c.box) put(out, b);
  put_vectors(out, c.list_positions);
  put(out, c.thermostat_work);
  out += c.generators;
  write_file_atomically(path, out);
}

EngineCheckpoint read_checkpoint(const std::filesystem::path& path, int atom_count) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK(in.good(), "cannot read the checkpoint '{}'", path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string data = ss.str();
  KILN_CHECK(data.size() >= sizeof(kMagic) && std::memcmp(data.data(), kMagic, sizeof(kMagic)) == 0,
             "{}: not a kiln mdrun checkpoint (GROMACS's .cpt files are not read)", path.string());
  Reader r(data.substr(sizeof(kMagic)), path.string());
  EngineCheckpoint c;
  c.next_step = r.get<std::int64_t>("the step");
  c.positions = r.vectors("positions", atom_count);
  c.velocities = r.vectors("velocities", atom_count);
  for (double& b : c.box) b = r.get<double>("the box");
  c.list_positions = r.vectors("pair-list positions", atom_count);
  c.thermostat_work = r.get<double>("the thermostat work");
  c.generators = r.rest();
  KILN_CHECK(!c.generators.empty(), "{}: truncated checkpoint (no generator state)", path.string());
  return c;
}

}  // namespace kiln::md
