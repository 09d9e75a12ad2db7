// HPL.dat reader. The format is positional: 31 lines, each starting with its value(s) and ending
// with free text. Count lines ("# of Ns") say how many values the next line must hold.
#include "kiln/hpc/hpl/hpl_params.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

#include "kiln/runtime/error.h"

namespace kiln::hpl {

namespace {

constexpr int kLines = 31;
constexpr int kMaxListLength = 20;  // HPL's own limit per list

class DatReader {
 public:
  DatReader(const std::string& text, std::string name, LineOrigin origin)
      : name_(std::move(name)), origin_(std::move(origin)) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) lines_.push_back(line);
    KILN_CHECK(lines_.size() >= kLines, "{}: has {} lines, HPL's format needs {} (see docs/hpl.md)", name_,
               lines_.size(), kLines);
  }

  // Whitespace-separated words of a 1-based line.
  std::vector<std::string> words(int line) const {
    std::istringstream in(lines_[line - 1]);
    std::vector<std::string> out;
    std::string w;
    while (in >> w) out.push_back(w);
    return out;
  }

  // "HPL.dat line 25", or the flag the line was written from.
  std::string where(int line) const { return origin_ ? origin_(line) : fmt::format("{} line {}", name_, line); }

  std::string first_word(int line, const char* what) const {
    auto w = words(line);
    KILN_CHECK(!w.empty(), "{}: expected {}, found an empty line", where(line), what);
    return w[0];
  }

  long integer(int line, const std::string& word, const char* what, long min, long max) const {
    long value = 0;
    auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
    KILN_CHECK(ec == std::errc() && end == word.data() + word.size(), "{}: {} '{}' is not an integer", where(line),
               what, word);
    KILN_CHECK(value >= min && value <= max, "{}: {} {} is out of range [{}, {}]", where(line), what, value, min, max);
    return value;
  }

  long integer(int line, const char* what, long min, long max) const {
    return integer(line, first_word(line, what), what, min, max);
  }

  double real(int line, const char* what) const {
    std::string word = first_word(line, what);
    double value = 0;
    auto [end, ec] = std::from_chars(word.data(), word.data() + word.size(), value);
    KILN_CHECK(ec == std::errc() && end == word.data() + word.size(), "{}: {} '{}' is not a number", where(line), what,
               word);
    return value;
  }

  // A count line followed by a list line with that many integers in [min, max].
  std::vector<long> list(int count_line, const char* what, long min, long max) const {
    long count = integer(count_line, (std::string("number of ") + what).c_str(), 1, kMaxListLength);
    auto w = words(count_line + 1);
    KILN_CHECK(static_cast<long>(w.size()) >= count, "{}: expected {} values for {} ({} says {}), found {}",
               where(count_line + 1), count, what, where(count_line), count, w.size());
    std::vector<long> out;
    for (long i = 0; i < count; ++i) out.push_back(integer(count_line + 1, w[i], what, min, max));
    return out;
  }

  const std::string& line_text(int line) const { return lines_[line - 1]; }

 private:
  std::string name_;
  LineOrigin origin_;
  std::vector<std::string> lines_;
};

template <class T>
std::vector<T> cast_all(const std::vector<long>& v) {
  std::vector<T> out;
  for (long x : v) out.push_back(static_cast<T>(x));
  return out;
}

}  // namespace

Parameters parse_hpl_dat(const std::string& text, const std::string& name, const LineOrigin& origin) {
  DatReader dat(text, name, origin);
  Parameters p;
  p.output_file = dat.first_word(3, "an output file name");
  p.device_out = static_cast<int>(dat.integer(4, "device out", 0, 1 << 20));
  p.ns = dat.list(5, "Ns", 1, 1L << 40);
  p.nbs = cast_all<int>(dat.list(7, "NBs", 1, 1 << 20));
  p.column_major_map = dat.integer(9, "PMAP", 0, 1) == 1;
  auto count_grids = dat.integer(10, "number of process grids", 1, kMaxListLength);
  auto pw = dat.words(11), qw = dat.words(12);
  KILN_CHECK(static_cast<long>(pw.size()) >= count_grids, "{}: expected {} values for Ps ({} says {}), found {}",
             dat.where(11), count_grids, dat.where(10), count_grids, pw.size());
  KILN_CHECK(static_cast<long>(qw.size()) >= count_grids, "{}: expected {} values for Qs ({} says {}), found {}",
             dat.where(12), count_grids, dat.where(10), count_grids, qw.size());
  for (long i = 0; i < count_grids; ++i) {
    p.ps.push_back(static_cast<int>(dat.integer(11, pw[i], "P", 1, 1 << 20)));
    p.qs.push_back(static_cast<int>(dat.integer(12, qw[i], "Q", 1, 1 << 20)));
  }
  p.threshold = dat.real(13, "the residual threshold");
  // A run passes when its scaled residual is below the threshold: NaN or <= 0 would fail every run
  // (netlib HPL skips the check instead, which would publish an unchecked result).
  KILN_CHECK(std::isfinite(p.threshold) && p.threshold > 0,
             "{} line 13: the residual threshold {} must be a positive finite number (HPL's is 16.0)", name,
             dat.first_word(13, "the residual threshold"));
  p.pfacts = cast_all<Factorization>(dat.list(14, "PFACTs", 0, 2));
  p.nbmins = cast_all<int>(dat.list(16, "NBMINs", 1, 1 << 20));
  p.ndivs = cast_all<int>(dat.list(18, "NDIVs", 2, 1 << 20));
  p.rfacts = cast_all<Factorization>(dat.list(20, "RFACTs", 0, 2));
  p.bcasts = cast_all<Broadcast>(dat.list(22, "BCASTs", 0, 5));
  p.depths = cast_all<int>(dat.list(24, "DEPTHs", 0, 1));
  p.swap = static_cast<SwapAlgorithm>(dat.integer(26, "SWAP", 0, 2));
  p.swap_threshold = static_cast<int>(dat.integer(27, "swapping threshold", 0, 1 << 30));
  p.l1_transposed = dat.integer(28, "L1 form", 0, 1) == 0;
  p.u_transposed = dat.integer(29, "U form", 0, 1) == 0;
  p.equilibration = dat.integer(30, "EQUIL", 0, 1) == 1;
  p.align = static_cast<int>(dat.integer(31, "ALIGN", 1, 1 << 20));
  return p;
}

Parameters read_hpl_dat(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "cannot open HPL input file '{}'", path);
  std::stringstream ss;
  ss << in.rdbuf();
  return parse_hpl_dat(ss.str(), path);
}

std::vector<RunConfig> expand_runs(const Parameters& p) {
  std::vector<RunConfig> runs;
  for (std::size_t g = 0; g < p.ps.size(); ++g)
    for (long n : p.ns)
      for (int nb : p.nbs)
        for (int depth : p.depths)
          for (Broadcast bcast : p.bcasts)
            for (Factorization rfact : p.rfacts)
              for (Factorization pfact : p.pfacts)
                for (int nbmin : p.nbmins)
                  for (int ndiv : p.ndivs) {
                    RunConfig r;
                    r.n = n;
                    r.nb = nb;
                    r.p = p.ps[g];
                    r.q = p.qs[g];
                    r.column_major_map = p.column_major_map;
                    r.pfact = pfact;
                    r.nbmin = nbmin;
                    r.ndiv = ndiv;
                    r.rfact = rfact;
                    r.bcast = bcast;
                    r.depth = depth;
                    r.swap = p.swap;
                    r.swap_threshold = p.swap_threshold;
                    r.threshold = p.threshold;
                    runs.push_back(r);
                  }
  return runs;
}

char factorization_letter(Factorization f) {
  switch (f) {
    case Factorization::Left: return 'L';
    case Factorization::Crout: return 'C';
    case Factorization::Right: return 'R';
  }
  return '?';
}

const char* factorization_name(Factorization f) {
  switch (f) {
    case Factorization::Left: return "Left";
    case Factorization::Crout: return "Crout";
    case Factorization::Right: return "Right";
  }
  return "?";
}

const char* broadcast_name(Broadcast b) {
  switch (b) {
    case Broadcast::Ring: return "1ring";
    case Broadcast::RingModified: return "1ringM";
    case Broadcast::TwoRing: return "2ring";
    case Broadcast::TwoRingModified: return "2ringM";
    case Broadcast::Long: return "Blong";
    case Broadcast::LongModified: return "BlongM";
  }
  return "?";
}

const char* swap_name(SwapAlgorithm s) {
  switch (s) {
    case SwapAlgorithm::BinaryExchange: return "Binary-exchange";
    case SwapAlgorithm::Long: return "Spread-roll (long)";
    case SwapAlgorithm::Mix: return "Mix";
  }
  return "?";
}

std::string variant_code(const RunConfig& r) {
  return fmt::format("W{}{}{}{}{}{}{}", r.column_major_map ? 'C' : 'R', r.depth, static_cast<int>(r.bcast),
                     factorization_letter(r.rfact), r.ndiv, factorization_letter(r.pfact), r.nbmin);
}

}  // namespace kiln::hpl
