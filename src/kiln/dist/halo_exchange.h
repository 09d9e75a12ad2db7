#pragma once
// HaloExchange: the neighbour exchange of a domain-decomposed stencil code (HPCG, later MD). Each
// peer gets one packed block of doubles and sends one back; all receives are posted before any send
// so the exchange cannot deadlock however the peers are listed. Buffers are host memory: GPU codes
// stage through the host (or pass device pointers when MPI is CUDA-aware).
#include <cstddef>
#include <span>
#include <vector>

#include "kiln/dist/communicator.h"

namespace kiln::dist {

struct HaloPeer {
  int rank = 0;
  int send_tag = 0;  // the tag this peer expects from us
  int recv_tag = 0;  // the tag we expect from this peer
  std::size_t send_offset = 0;
  std::size_t send_count = 0;
  std::size_t recv_offset = 0;
  std::size_t recv_count = 0;
};

class HaloExchange {
 public:
  HaloExchange() = default;
  HaloExchange(Communicator comm, std::vector<HaloPeer> peers);

  const std::vector<HaloPeer>& peers() const { return peers_; }
  bool empty() const { return peers_.empty(); }
  // send[peer.send_offset, +send_count) goes to each peer; recv[peer.recv_offset, +recv_count) is
  // filled from it. Blocks until every message has arrived.
  void exchange(std::span<const double> send, std::span<double> recv) const;

 private:
  std::vector<HaloPeer> peers_;
  std::intptr_t comm_ = 0;
  std::shared_ptr<Communicator> owner_;  // keeps the MPI communicator alive
};

}  // namespace kiln::dist
