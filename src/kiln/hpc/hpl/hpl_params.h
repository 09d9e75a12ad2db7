#pragma once
// HPL's input: the lists of HPL.dat (every combination is one run of a sweep) and one run's values.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace kiln::hpl {

// Left-, Crout- or right-looking, for the panel's columns (PFACT) and its recursion (RFACT).
enum class Factorization : std::uint8_t { Left = 0, Crout = 1, Right = 2 };
// HPL's BCAST codes: increasing ring, modified ring, two rings, modified two rings, long
// (bandwidth-reducing), modified long.
enum class Broadcast : std::uint8_t { Ring = 0, RingModified, TwoRing, TwoRingModified, Long, LongModified };
enum class SwapAlgorithm : std::uint8_t { BinaryExchange = 0, Long = 1, Mix = 2 };

struct Parameters {
  std::string output_file;  // HPL.dat line 3, used when device_out is neither 6 nor 7
  int device_out = 6;       // 6 = stdout, 7 = stderr, other = output_file
  std::vector<long> ns;
  std::vector<int> nbs;
  bool column_major_map = false;  // PMAP
  std::vector<int> ps, qs;        // grids, pairwise
  double threshold = 16.0;
  std::vector<Factorization> pfacts;
  std::vector<int> nbmins;
  std::vector<int> ndivs;
  std::vector<Factorization> rfacts;
  std::vector<Broadcast> bcasts;
  std::vector<int> depths;
  SwapAlgorithm swap = SwapAlgorithm::Mix;
  int swap_threshold = 64;
  bool l1_transposed = true;  // L1 / U storage forms: kiln stores both in the matrix (see docs/hpl.md)
  bool u_transposed = true;
  bool equilibration = true;
  int align = 8;
};

// One run of the sweep.
struct RunConfig {
  long n = 0;
  int nb = 0;
  int p = 1, q = 1;
  bool column_major_map = false;
  Factorization pfact = Factorization::Right;
  int nbmin = 4;
  int ndiv = 2;
  Factorization rfact = Factorization::Crout;
  Broadcast bcast = Broadcast::RingModified;
  int depth = 1;
  SwapAlgorithm swap = SwapAlgorithm::Mix;
  int swap_threshold = 64;
  double threshold = 16.0;
  std::uint32_t seed = 100;  // HPL_ISEED
};

// Where a line's values came from, for error messages. By default "<name> line <n>"; `kiln hpl`
// writes its flags as HPL.dat text and names the flag instead ("kiln hpl --depth").
using LineOrigin = std::function<std::string(int line)>;

// Parses HPL's 31-line HPL.dat. Errors throw kiln::Error naming the file, the line and the value.
Parameters parse_hpl_dat(const std::string& text, const std::string& name = "HPL.dat", const LineOrigin& origin = {});
Parameters read_hpl_dat(const std::string& path);

// Every combination, in HPL's loop order (grid, N, NB, DEPTH, BCAST, RFACT, PFACT, NBMIN, NDIV).
std::vector<RunConfig> expand_runs(const Parameters& params);

// HPL's one-letter codes and names, for the encoded variant (WR11C2R4) and the parameter echo.
char factorization_letter(Factorization f);
const char* factorization_name(Factorization f);
const char* broadcast_name(Broadcast b);
const char* swap_name(SwapAlgorithm s);
// "WR11C2R4": wall time, row/column-major map, DEPTH, BCAST, RFACT, NDIV, PFACT, NBMIN.
std::string variant_code(const RunConfig& run);

}  // namespace kiln::hpl
