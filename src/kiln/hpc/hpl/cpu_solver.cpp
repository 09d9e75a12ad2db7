// HPL on CPUs (HPL_pdgesv + HPL_pdtrsv): right-looking blocked LU of [A|b] over a P x Q grid,
// 2-D block-cyclic with square NB blocks, with look-ahead of depth 0 or 1, then back-substitution
// and the scaled residual check against a freshly generated copy of A.
//
// Each process keeps its local part of [A|b] column-major (rows: its row blocks, columns: its
// column blocks; b is global column N). L is never needed after a step: b is carried along as
// the last column, so it becomes L^-1 P b during the factorisation and only U x = y is left.
#include "kiln/hpc/hpl/cpu_solver.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kiln/hpc/hpl/block_cyclic.h"
#include "kiln/hpc/hpl/hpl_random.h"
#include "kiln/hpc/hpl/huge_page_array.h"
#include "kiln/hpc/hpl/panel_factorization.h"
#include "kiln/runtime/error.h"

// LAPACK's row interchanges (OpenBLAS exports them; Debian ships no LAPACKE header with it).
extern "C" void dlaswp_(const int* n, double* a, const int* lda, const int* k1, const int* k2, const int* ipiv,
                        const int* incx);

namespace kiln::hpl {

namespace {

using dist::BroadcastTopology;
using dist::Communicator;
using dist::ReduceOp;

long padded_leading_dimension(long rows) {
  long ld = std::max(8L, (rows + 7) / 8 * 8);
  // A leading dimension that is a multiple of 4 KiB makes every column map to the same cache sets.
  if (ld % 512 == 0) ld += 8;
  return ld;
}

BroadcastTopology topology_of(Broadcast b) {
  switch (b) {
    case Broadcast::Ring: return BroadcastTopology::Ring;
    case Broadcast::RingModified: return BroadcastTopology::RingModified;
    case Broadcast::TwoRing: return BroadcastTopology::TwoRing;
    case Broadcast::TwoRingModified: return BroadcastTopology::TwoRingModified;
    case Broadcast::Long:
    case Broadcast::LongModified: return BroadcastTopology::Tree;
  }
  return BroadcastTopology::Tree;
}

// The factored panel as every process of the panel's grid row sees it after the broadcast.
struct Panel {
  long j = 0;  // first global column (and row)
  int jb = 0;
  const double* top = nullptr;  // jb x jb: L11 (unit lower) and U11
  long ldt = 0;
  std::vector<long> ipiv;      // global row swapped with row j+k, for k < jb
  const double* l2 = nullptr;  // the local rows below the panel (global rows >= j+jb), jb columns
  long ldl2 = 0;
  long m2 = 0;
  std::vector<double> storage;  // receivers' copy of top, ipiv and l2
};

// Adds the wall time of a scope to a counter (the phase breakdown of KILN_HPL_PHASES=1).
class PhaseTimer {
 public:
  explicit PhaseTimer(double& total) : total_(total), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() { total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double& total_;
  std::chrono::steady_clock::time_point start_;
};

class CpuHpl {
 public:
  CpuHpl(const RunConfig& run, const dist::ProcessGrid& grid)
      : run_(run),
        grid_(grid),
        n_(run.n),
        nb_(run.nb),
        rows_{run.nb, grid.P()},
        cols_{run.nb, grid.Q()},
        myrow_(grid.my_row()),
        mycol_(grid.my_col()),
        mp_(rows_.count(run.n, myrow_)),
        nq_(cols_.count(run.n + 1, mycol_)),
        lda_(padded_leading_dimension(mp_)),
        a_(static_cast<std::size_t>(lda_) * std::max(nq_, 1L)) {}

  RunResult run() {
    generate();
    grid_.all().barrier();
    auto start = std::chrono::steady_clock::now();
    factor();
    std::vector<double> x = back_substitute();
    double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    seconds = grid_.all().all_reduce_value(seconds, ReduceOp::Max);
    if (std::getenv("KILN_HPL_PHASES") && grid_.all().rank() == 0)
      std::fprintf(
          stderr,
          "kiln hpl phases (rank 0, s): fact %.3f  bcast %.3f  swap+update %.3f (of which swaps %.3f)  solve %.3f  "
          "total %.3f\n",
          phase_seconds_[kFact], phase_seconds_[kBcast], phase_seconds_[kUpdate], phase_seconds_[kSwap],
          phase_seconds_[kSolve], seconds);
    RunResult result = check(x);
    result.seconds = seconds;
    result.gflops = hpl_flops(static_cast<double>(n_)) / seconds / 1e9;
    return result;
  }

 private:
  double& at(long l, long c) { return a_.data()[static_cast<std::size_t>(c) * lda_ + l]; }

  // Fills the local part of [A|b] with HPL's sequence: each local column is a run of row blocks,
  // each started by a jump to its first entry.
  void generate() {
    for (long c = 0; c < nq_; ++c) {
      long gc = cols_.global(c, mycol_);
      for (long l = 0; l < mp_; l += nb_) {
        long gr = rows_.global(l, myrow_);
        long len = std::min<long>(nb_, mp_ - l);
        std::uint64_t x = hpl_state_at(run_.seed, n_, gr, gc);
        for (long t = 0; t < len; ++t) {
          at(l + t, c) = hpl_value(x);
          x = kHplMultiplier * x + kHplIncrement;
        }
      }
    }
  }

  // ---- FACT: the panel engine over this process column (see panel_factorization.h) ----
  class PanelEngine {
   public:
    PanelEngine(CpuHpl& h, long j, int jb, std::vector<double>& top_storage, std::vector<long>& ipiv)
        : h_(h), j_(j), jb_(jb), ipiv_(ipiv) {
      ipiv_.resize(jb);
      pc_ = h.cols_.local(j);
      diag_prow_ = h.rows_.owner(j);
      replicated_ = h.grid_.P() > 1;
      if (replicated_) {
        // Top is a copy on every process of the column, kept identical by the pivot exchange.
        top_storage.assign(static_cast<std::size_t>(jb) * jb, 0.0);
        top_ = top_storage.data();
        ldt_ = jb;
        exchange_.resize(static_cast<std::size_t>(2 * jb + 2));
        gathered_.resize(exchange_.size() * h.grid_.P());
      } else {
        // One process row: Top is the pivot rows themselves, in place.
        top_ = &h.at(j, pc_);
        ldt_ = h.lda_;
      }
    }

    double* top() { return top_; }
    long ldt() const { return ldt_; }
    std::vector<long>& ipiv() { return ipiv_; }

    void factor_column(int k) {
      const long g = j_ + k;
      const long l0 = first_active(k);
      double* column = &h_.at(0, pc_ + k);
      if (!replicated_) {
        long p = g;
        if (l0 < h_.mp_) p = l0 + static_cast<long>(cblas_idamax(static_cast<int>(h_.mp_ - l0), column + l0, 1));
        ipiv_[k] = p;
        if (p != g)
          cblas_dswap(jb_, &h_.at(g, pc_), static_cast<int>(h_.lda_), &h_.at(p, pc_), static_cast<int>(h_.lda_));
        scale_below(k, 1.0 / column[g]);
        return;
      }
      // Every process offers its best candidate row and (the owner of row g) row g itself;
      // all then agree on the pivot and swap.
      std::fill(exchange_.begin(), exchange_.end(), 0.0);
      exchange_[0] = -1.0;
      if (l0 < h_.mp_) {
        long lmax = l0 + static_cast<long>(cblas_idamax(static_cast<int>(h_.mp_ - l0), column + l0, 1));
        exchange_[0] = std::fabs(column[lmax]);
        exchange_[1] = static_cast<double>(h_.rows_.global(lmax, h_.myrow_));
        for (int c = 0; c < jb_; ++c) exchange_[2 + c] = h_.at(lmax, pc_ + c);
      }
      if (h_.myrow_ == diag_prow_) {
        long lg = h_.rows_.local(g);
        for (int c = 0; c < jb_; ++c) exchange_[2 + jb_ + c] = h_.at(lg, pc_ + c);
      }
      h_.grid_.col().all_gather(std::span<const double>(exchange_), std::span<double>(gathered_));
      const std::size_t stride = exchange_.size();
      int winner = -1;
      for (int r = 0; r < h_.grid_.P(); ++r) {
        const double* slot = &gathered_[r * stride];
        if (slot[0] < 0) continue;
        if (winner < 0) {
          winner = r;
          continue;
        }
        const double* best = &gathered_[winner * stride];
        if (slot[0] > best[0] || (slot[0] == best[0] && slot[1] < best[1])) winner = r;
      }
      KILN_CHECK(winner >= 0, "HPL panel at column {}: no candidate pivot row (internal error)", g);
      const double* w = &gathered_[winner * stride];
      const double* d = &gathered_[diag_prow_ * stride + 2 + jb_];
      const long p = static_cast<long>(w[1]);
      ipiv_[k] = p;
      if (p != g && h_.myrow_ == h_.rows_.owner(p)) {
        long lp = h_.rows_.local(p);
        for (int c = 0; c < jb_; ++c) h_.at(lp, pc_ + c) = d[c];
      }
      for (int c = 0; c < jb_; ++c) top_[k + c * ldt_] = w[2 + c];
      scale_below(k, 1.0 / w[2 + k]);
    }

    void solve_top(int r0, int r1, int c0, int c1) {
      if (r1 - r0 <= 1 || c1 <= c0) return;
      cblas_dtrsm(CblasColMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, r1 - r0, c1 - c0, 1.0, t(r0, r0),
                  static_cast<int>(ldt_), t(r0, c0), static_cast<int>(ldt_));
    }

    void update_top(int r0, int r1, int k0, int k1, int c0, int c1) {
      if (r1 <= r0 || k1 <= k0 || c1 <= c0) return;
      cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, r1 - r0, c1 - c0, k1 - k0, -1.0, t(r0, k0),
                  static_cast<int>(ldt_), t(k0, c0), static_cast<int>(ldt_), 1.0, t(r0, c0), static_cast<int>(ldt_));
    }

    void update_active(int first, int k0, int k1, int c0, int c1) {
      const long l = first_active(first);
      const long m = h_.mp_ - l;
      if (m <= 0 || k1 <= k0 || c1 <= c0) return;
      const int lda = static_cast<int>(h_.lda_);
      if (k1 - k0 == 1) {  // a rank-1 update (the columns inside a leaf): DGER, without DGEMM's packing
        cblas_dger(CblasColMajor, static_cast<int>(m), c1 - c0, -1.0, &h_.at(l, pc_ + k0), 1, t(k0, c0),
                   static_cast<int>(ldt_), &h_.at(l, pc_ + c0), lda);
        return;
      }
      cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m), c1 - c0, k1 - k0, -1.0,
                  &h_.at(l, pc_ + k0), lda, t(k0, c0), static_cast<int>(ldt_), 1.0, &h_.at(l, pc_ + c0), lda);
    }

    // The replicated Top becomes the owner's rows j .. j+jb of the panel.
    void finish() {
      if (!replicated_ || h_.myrow_ != diag_prow_) return;
      long lj = h_.rows_.local(j_);
      for (int c = 0; c < jb_; ++c)
        std::memcpy(&h_.at(lj, pc_ + c), &top_[c * ldt_], sizeof(double) * static_cast<std::size_t>(jb_));
    }

   private:
    double* t(int r, int c) { return top_ + r + static_cast<long>(c) * ldt_; }
    long first_active(int k) const { return h_.rows_.count_before(j_ + k, h_.myrow_); }
    void scale_below(int k, double inverse_pivot) {
      long l = first_active(k + 1);
      if (l < h_.mp_) cblas_dscal(static_cast<int>(h_.mp_ - l), inverse_pivot, &h_.at(l, pc_ + k), 1);
    }

    CpuHpl& h_;
    long j_;
    int jb_;
    long pc_;
    int diag_prow_;
    bool replicated_;
    double* top_;
    long ldt_;
    std::vector<long>& ipiv_;
    std::vector<double> exchange_, gathered_;
  };

  // Factors the panel at global column j (this process column owns it) into panel slot `slot`.
  // With Q > 1 it is packed for the row broadcast as [Top (jb*jb) | ipiv (jb) | L2 (m2 x jb)];
  // with Q = 1 the update reads Top and L2 where they are.
  void factor_panel(long j, int jb, int slot) {
    PhaseTimer timer(phase_seconds_[kFact]);
    Panel& panel = panels_[slot];
    PanelEngine engine(*this, j, jb, top_storage_[slot], panel.ipiv);
    PanelOptions options{run_.pfact, run_.rfact, run_.nbmin, run_.ndiv};
    factor_panel_node(engine, 0, jb, options);
    engine.finish();
    panel.j = j;
    panel.jb = jb;
    panel.m2 = mp_ - rows_.count_before(j + jb, myrow_);
    const long l2 = mp_ - panel.m2;
    const long pc = cols_.local(j);
    if (grid_.Q() == 1) {
      panel.top = engine.top();
      panel.ldt = engine.ldt();
      panel.l2 = &at(l2, pc);
      panel.ldl2 = lda_;
      return;
    }
    auto& packed = panel.storage;
    packed.resize(static_cast<std::size_t>(jb) * jb + jb + static_cast<std::size_t>(panel.m2) * jb);
    for (int c = 0; c < jb; ++c)
      for (int r = 0; r < jb; ++r) packed[r + static_cast<std::size_t>(c) * jb] = engine.top()[r + c * engine.ldt()];
    for (int k = 0; k < jb; ++k) packed[static_cast<std::size_t>(jb) * jb + k] = static_cast<double>(panel.ipiv[k]);
    double* dst = packed.data() + static_cast<std::size_t>(jb) * jb + jb;
    for (int c = 0; c < jb; ++c)
      if (panel.m2 > 0)
        std::memcpy(dst + static_cast<std::size_t>(c) * panel.m2, &at(l2, pc + c), sizeof(double) * panel.m2);
  }

  // BCAST: the panel's owner column sends it along each grid row (nothing to send when Q = 1).
  void broadcast_panel(long j, int jb, int slot) {
    if (grid_.Q() == 1) return;
    PhaseTimer timer(phase_seconds_[kBcast]);
    const int root = size_panel_copy(j, jb, slot);
    grid_.row().broadcast(std::span<double>(panels_[slot].storage), root, topology_of(run_.bcast));
    unpack_panel(slot);
  }

  // The same in two halves, for the look-ahead: the next panel's owner starts sending as soon as
  // it has factored it, the others post their receives before their own update, and everyone
  // finishes at the start of the next step. With the one-call broadcast after the update, every
  // receiver waited there for the owner's panel factorisation (5-9% of the run on a 1 x 2 grid).
  void start_panel_broadcast(long j, int jb, int slot) {
    if (grid_.Q() == 1) return;
    const int root = size_panel_copy(j, jb, slot);
    pending_[slot] =
        grid_.row().start_broadcast(std::span<double>(panels_[slot].storage), root, topology_of(run_.bcast));
  }
  // A receiver waits for the panel here. The root does not wait for its sends: with large
  // messages they complete only once every receiver has taken the data, at the end of its own
  // update, and waiting for that here tied the two processes of a 1 x 2 grid together every
  // step. Its sends are finished when the slot is next written (release_slot).
  void finish_panel_broadcast(int slot, bool root) {
    PhaseTimer timer(phase_seconds_[kBcast]);
    if (!root) pending_[slot].finish();
    unpack_panel(slot);
  }
  // Before a slot takes a new panel: its last broadcast, if this process was the root, is done.
  void release_slot(int slot) {
    if (!pending_[slot].active()) return;
    PhaseTimer timer(phase_seconds_[kBcast]);
    pending_[slot].finish();
  }

  // Sizes this process's copy of panel j, [Top | ipiv | L2] (the owner's is already packed), and
  // returns the root of its row broadcast.
  int size_panel_copy(long j, int jb, int slot) {
    Panel& panel = panels_[slot];
    panel.j = j;
    panel.jb = jb;
    panel.m2 = mp_ - rows_.count_before(j + jb, myrow_);
    panel.storage.resize(static_cast<std::size_t>(jb) * jb + jb + static_cast<std::size_t>(panel.m2) * jb);
    return cols_.owner(j);
  }
  void unpack_panel(int slot) {
    Panel& panel = panels_[slot];
    const int jb = panel.jb;
    panel.top = panel.storage.data();
    panel.ldt = jb;
    panel.ipiv.resize(jb);
    for (int k = 0; k < jb; ++k)
      panel.ipiv[k] = static_cast<long>(panel.storage[static_cast<std::size_t>(jb) * jb + k]);
    panel.l2 = panel.storage.data() + static_cast<std::size_t>(jb) * jb + jb;
    panel.ldl2 = std::max(panel.m2, 1L);
  }

  // SWAP: applies the panel's row interchanges to local columns [c0, c1).
  void apply_swaps(const Panel& panel, long c0, long c1) {
    PhaseTimer timer(phase_seconds_[kSwap]);
    if (grid_.P() == 1) {
      // LAPACK's dlaswp from OpenBLAS: threaded over columns and unrolled over several columns at
      // once, so more of the scattered pivot rows' cache misses are in flight (a column-at-a-time
      // loop took 13% of the run at N=6000). Its pivots are 1-based rows of the block at row j.
      swap_rows_.resize(static_cast<std::size_t>(panel.jb));
      for (int k = 0; k < panel.jb; ++k) swap_rows_[k] = static_cast<int>(panel.ipiv[k] - panel.j + 1);
      const int width = static_cast<int>(c1 - c0), ld = static_cast<int>(lda_), first = 1, last = panel.jb, step = 1;
      dlaswp_(&width, &at(panel.j, c0), &ld, &first, &last, swap_rows_.data(), &step);
      return;
    }
    // Over a process column: the sequence of swaps is a permutation of at most 2*jb rows. Work out
    // where each changed row's new content comes from, then move rows process to process.
    std::map<long, long> source;  // destination row -> original row now wanted there
    auto current = [&](long r) {
      auto it = source.find(r);
      return it == source.end() ? r : it->second;
    };
    for (int k = 0; k < panel.jb; ++k) {
      long g = panel.j + k, p = panel.ipiv[k];
      if (p == g) continue;
      long sg = current(g), sp = current(p);
      source[g] = sp;
      source[p] = sg;
    }
    const int P = grid_.P();
    const long width = c1 - c0;
    auto& outgoing = outgoing_;
    auto& incoming = incoming_;
    outgoing.resize(P);
    incoming.resize(P);
    for (auto& o : outgoing) o.clear();
    std::vector<long> incoming_rows(P, 0);
    for (auto [dst, src] : source) {
      if (dst == src) continue;
      int from = rows_.owner(src), to = rows_.owner(dst);
      if (from == myrow_) {
        long ls = rows_.local(src);
        for (long c = c0; c < c1; ++c) outgoing[to].push_back(at(ls, c));
      }
      if (to == myrow_) incoming_rows[from] += 1;
    }
    for (int d = 0; d < P; ++d) {
      int to = (myrow_ + d) % P, from = (myrow_ - d + P) % P;
      incoming[from].resize(static_cast<std::size_t>(incoming_rows[from] * width));
      if (d == 0) {
        incoming[from] = outgoing[to];
        continue;
      }
      grid_.col().send_recv(std::span<const double>(outgoing[to]), to, std::span<double>(incoming[from]), from, 17);
    }
    std::vector<std::size_t> cursor(P, 0);
    for (auto [dst, src] : source) {
      if (dst == src || rows_.owner(dst) != myrow_) continue;
      int from = rows_.owner(src);
      long ld = rows_.local(dst);
      for (long c = c0; c < c1; ++c) at(ld, c) = incoming[from][cursor[from]++];
    }
  }

  // SWAP + UPDATE of local columns [c0, c1): U12 = L11^-1 A12 on the panel's grid row, sent down
  // the grid column, then A22 -= L21 U12.
  void update(const Panel& panel, long c0, long c1) {
    if (c1 <= c0) return;
    PhaseTimer timer(phase_seconds_[kUpdate]);
    const int jb = panel.jb;
    const long width = c1 - c0;
    apply_swaps(panel, c0, c1);
    const int diag_prow = rows_.owner(panel.j);
    const double* u = nullptr;
    long ldu = 0;
    if (myrow_ == diag_prow) {
      long lj = rows_.local(panel.j);
      cblas_dtrsm(CblasColMajor, CblasLeft, CblasLower, CblasNoTrans, CblasUnit, jb, static_cast<int>(width), 1.0,
                  panel.top, static_cast<int>(panel.ldt), &at(lj, c0), static_cast<int>(lda_));
      u = &at(lj, c0);
      ldu = lda_;
    }
    if (grid_.P() > 1) {
      u_buffer_.resize(static_cast<std::size_t>(jb) * width);
      if (myrow_ == diag_prow)
        for (long c = 0; c < width; ++c)
          std::memcpy(&u_buffer_[c * jb], u + c * ldu, sizeof(double) * static_cast<std::size_t>(jb));
      grid_.col().broadcast(std::span<double>(u_buffer_), diag_prow, topology_of(run_.bcast));
      u = u_buffer_.data();
      ldu = jb;
    }
    if (panel.m2 > 0) {
      long l2 = mp_ - panel.m2;
      // While a look-ahead broadcast is in flight, the DGEMM goes in column chunks with a poll of
      // the broadcast between them, as HPL's update does: MPI moves a message only inside MPI calls.
      const bool polling = poll_columns_ > 0 && (pending_[0].active() || pending_[1].active());
      const long chunk = polling ? poll_columns_ : width;
      for (long b0 = 0; b0 < width; b0 += chunk) {
        const long bw = std::min(chunk, width - b0);
        cblas_dgemm(CblasColMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(panel.m2), static_cast<int>(bw), jb,
                    -1.0, panel.l2, static_cast<int>(panel.ldl2), u + b0 * ldu, static_cast<int>(ldu), 1.0,
                    &at(l2, c0 + b0), static_cast<int>(lda_));
        if (polling)
          for (auto& pending : pending_) pending.poll();
      }
    }
  }

  // The main loop (HPL_pdgesv0 / HPL_pdgesvK1): with look-ahead, the owner of the next panel
  // updates and factors it before the rest of its trailing columns, so the next broadcast can
  // leave while the others are still updating.
  void factor() {
    // Panels alternate between two slots (buffers are kept, not reallocated, from step to step),
    // so with look-ahead the next panel is factored while this one is still being applied.
    bool next_factored = false;
    int slot = 0;
    for (long j = 0; j < n_; j += nb_, slot ^= 1) {
      const int jb = static_cast<int>(std::min<long>(nb_, n_ - j));
      // A slot's earlier broadcast was released before the look-ahead wrote this panel into it;
      // without look-ahead there are no pending broadcasts.
      if (mycol_ == cols_.owner(j) && !next_factored) factor_panel(j, jb, slot);
      if (pending_[slot].active())
        finish_panel_broadcast(slot, mycol_ == cols_.owner(j));
      else
        broadcast_panel(j, jb, slot);
      const Panel& panel = panels_[slot];
      const long trail = cols_.count_before(j + jb, mycol_);
      const long next = j + jb;
      next_factored = false;
      if (run_.depth >= 1 && next < n_) {
        const int jbn = static_cast<int>(std::min<long>(nb_, n_ - next));
        release_slot(slot ^ 1);
        if (mycol_ == cols_.owner(next)) {
          update(panel, trail, trail + jbn);
          factor_panel(next, jbn, slot ^ 1);
          next_factored = true;
          start_panel_broadcast(next, jbn, slot ^ 1);
          update(panel, trail + jbn, nq_);
        } else {
          start_panel_broadcast(next, jbn, slot ^ 1);
          update(panel, trail, nq_);
        }
      } else {
        update(panel, trail, nq_);
      }
    }
    release_slot(0);
    release_slot(1);
  }

  // Solves U x = y block by block from the bottom (HPL_pdtrsv). y, the transformed b, is spread
  // along each grid row; partial sums U_ik x_k stay with the processes owning U_ik and are
  // reduced along the row only when block i is solved. Returns the whole x on every process.
  std::vector<double> back_substitute() {
    PhaseTimer timer(phase_seconds_[kSolve]);
    const long bcol_owner = cols_.owner(n_);
    std::vector<double> y(static_cast<std::size_t>(std::max(mp_, 1L)), 0.0);
    if (mycol_ == bcol_owner)
      for (long l = 0; l < mp_; ++l) y[l] = at(l, cols_.local(n_));
    grid_.row().broadcast(std::span<double>(y), static_cast<int>(bcol_owner));
    std::vector<double> w(y.size(), 0.0);
    std::vector<double> x(static_cast<std::size_t>(n_), 0.0);
    std::vector<double> xk(static_cast<std::size_t>(nb_));
    const long blocks = (n_ + nb_ - 1) / nb_;
    for (long kb = blocks - 1; kb >= 0; --kb) {
      const long k0 = kb * nb_;
      const int kbs = static_cast<int>(std::min<long>(nb_, n_ - k0));
      const int pr = rows_.owner(k0), pc = cols_.owner(k0);
      std::span<double> xs(xk.data(), kbs);
      if (myrow_ == pr) {
        const long lr = rows_.local(k0);
        std::vector<double> t(w.begin() + lr, w.begin() + lr + kbs);
        grid_.row().all_reduce(std::span<double>(t), ReduceOp::Sum);
        if (mycol_ == pc) {
          for (int i = 0; i < kbs; ++i) xk[i] = y[lr + i] - t[i];
          cblas_dtrsv(CblasColMajor, CblasUpper, CblasNoTrans, CblasNonUnit, kbs, &at(lr, cols_.local(k0)),
                      static_cast<int>(lda_), xk.data(), 1);
        }
      }
      if (mycol_ == pc) {
        grid_.col().broadcast(xs, pr);
        const long above = rows_.count_before(k0, myrow_);
        if (above > 0)
          cblas_dgemv(CblasColMajor, CblasNoTrans, static_cast<int>(above), kbs, 1.0, &at(0, cols_.local(k0)),
                      static_cast<int>(lda_), xk.data(), 1, 1.0, w.data(), 1);
        if (myrow_ == pr) std::copy(xk.begin(), xk.begin() + kbs, x.begin() + k0);
      }
    }
    grid_.all().all_reduce(std::span<double>(x), ReduceOp::Sum);
    return x;
  }

  RunResult check(const std::vector<double>& x) { return check_cpu_solution(run_, grid_, x); }

  const RunConfig& run_;
  const dist::ProcessGrid& grid_;
  long n_;
  long nb_;
  BlockCyclic rows_, cols_;
  int myrow_, mycol_;
  long mp_, nq_, lda_;
  HugePageArray a_;
  enum Phase { kFact, kBcast, kUpdate, kSwap, kSolve, kPhases };
  double phase_seconds_[kPhases] = {};  // printed with KILN_HPL_PHASES=1
  Panel panels_[2];
  dist::PendingBroadcast pending_[2];  // a panel's row broadcast started by the look-ahead
  // Columns of the update's DGEMM between two polls of a pending broadcast (KILN_HPL_POLL_COLUMNS;
  // 0, the default: no polling). On the 2-core machine's 1 x 2 grid polling every 512 columns
  // measured 0.94 of hpcc against 0.98-1.01 without: the chunked DGEMM cost more than it saved.
  long poll_columns_ =
      std::getenv("KILN_HPL_POLL_COLUMNS") ? std::max(0L, std::atol(std::getenv("KILN_HPL_POLL_COLUMNS"))) : 0;
  std::vector<double> top_storage_[2];
  std::vector<double> u_buffer_;
  std::vector<int> swap_rows_;
  std::vector<std::vector<double>> outgoing_, incoming_;
};

}  // namespace

RunResult check_cpu_solution(const RunConfig& run, const dist::ProcessGrid& grid, const std::vector<double>& x) {
  KILN_CHECK(static_cast<long>(x.size()) == run.n, "HPL check: x has {} entries for N={}", x.size(), run.n);
  const long n = run.n, nb = run.nb;
  const BlockCyclic rows{run.nb, grid.P()}, cols{run.nb, grid.Q()};
  const int myrow = grid.my_row(), mycol = grid.my_col();
  const long mp = rows.count(n, myrow), nq = cols.count(n + 1, mycol);
  std::vector<double> ax(static_cast<std::size_t>(std::max(mp, 1L)), 0.0), row_abs(ax.size(), 0.0);
  for (long c = 0; c < nq; ++c) {
    long gc = cols.global(c, mycol);
    if (gc >= n) continue;  // b
    for (long l = 0; l < mp; l += nb) {
      long gr = rows.global(l, myrow);
      long len = std::min<long>(nb, mp - l);
      std::uint64_t s = hpl_state_at(run.seed, n, gr, gc);
      for (long t = 0; t < len; ++t) {
        double a = hpl_value(s);
        ax[l + t] += a * x[gc];
        row_abs[l + t] += std::fabs(a);
        s = kHplMultiplier * s + kHplIncrement;
      }
    }
  }
  grid.row().all_reduce(std::span<double>(ax), ReduceOp::Sum);
  grid.row().all_reduce(std::span<double>(row_abs), ReduceOp::Sum);
  double norm_r = 0, norm_a = 0, norm_b = 0;
  for (long l = 0; l < mp; ++l) {
    double b = hpl_value(hpl_state_at(run.seed, n, rows.global(l, myrow), n));
    norm_r = max_abs_keeping_nan(norm_r, ax[l] - b);
    norm_a = max_abs_keeping_nan(norm_a, row_abs[l]);
    norm_b = max_abs_keeping_nan(norm_b, b);
  }
  // MPI's MAX may drop a NaN as std::max does: whether any process saw one travels on its own.
  int nan_here = std::isnan(norm_r) || std::isnan(norm_a) || std::isnan(norm_b) ? 1 : 0;
  const bool nan_anywhere = grid.all().all_reduce_value(nan_here, ReduceOp::Max) != 0;
  RunResult r;
  r.norm_r = grid.all().all_reduce_value(norm_r, ReduceOp::Max);
  r.norm_a = grid.all().all_reduce_value(norm_a, ReduceOp::Max);
  r.norm_b = grid.all().all_reduce_value(norm_b, ReduceOp::Max);
  if (nan_anywhere) r.norm_r = std::numeric_limits<double>::quiet_NaN();
  for (double v : x) r.norm_x = max_abs_keeping_nan(r.norm_x, v);
  const double eps = std::numeric_limits<double>::epsilon() / 2;  // HPL's eps: the unit roundoff
  r.residual = r.norm_r / (eps * (r.norm_a * r.norm_x + r.norm_b) * static_cast<double>(n));
  r.passed = std::isfinite(r.residual) && r.residual < run.threshold;
  return r;
}

RunResult solve_on_cpu(const RunConfig& run, const dist::ProcessGrid& grid) {
  KILN_CHECK(grid.in_grid(), "solve_on_cpu called on a process outside the {} x {} grid", grid.P(), grid.Q());
  CpuHpl hpl(run, grid);
  return hpl.run();
}

std::size_t cpu_bytes_per_process(const RunConfig& run, int my_row, int my_col) {
  BlockCyclic rows{run.nb, run.p}, cols{run.nb, run.q};
  const double mp = static_cast<double>(rows.count(run.n, my_row));
  const double nq = static_cast<double>(cols.count(run.n + 1, my_col));
  const double nb = run.nb;
  // [A|b] + panel (packed and received) + U block + swap buffers + vectors of length N.
  double doubles = (mp + 16) * nq + 2 * (mp + nb) * nb + 3 * nb * nq + 4.0 * static_cast<double>(run.n);
  return static_cast<std::size_t>(doubles * sizeof(double));
}

}  // namespace kiln::hpl
