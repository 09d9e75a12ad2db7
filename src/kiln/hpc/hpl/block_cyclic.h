#pragma once
// 2-D block-cyclic index arithmetic (ScaLAPACK's numroc / indxg2p / indxg2l), one dimension at a
// time: global index g in blocks of nb dealt round-robin to `procs` processes starting at 0.
#include <cstdint>

namespace kiln::hpl {

struct BlockCyclic {
  long nb;
  int procs;

  int owner(long g) const { return static_cast<int>((g / nb) % procs); }
  long local(long g) const { return (g / (nb * procs)) * nb + g % nb; }
  long global(long l, int me) const { return ((l / nb) * procs + me) * nb + l % nb; }
  // How many of the global indices [0, g) process `me` holds; equally, the local index of the
  // first of its indices >= g.
  long count_before(long g, int me) const {
    long blocks = g / nb;
    long count = (blocks / procs) * nb;
    int rest = static_cast<int>(blocks % procs);
    if (me < rest)
      count += nb;
    else if (me == rest)
      count += g % nb;
    return count;
  }
  long count(long n, int me) const { return count_before(n, me); }
};

}  // namespace kiln::hpl
