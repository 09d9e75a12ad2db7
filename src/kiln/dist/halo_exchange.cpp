#include "kiln/dist/halo_exchange.h"

#include <mpi.h>

#include "kiln/dist/mpi_check.h"
#include "kiln/runtime/error.h"

namespace kiln::dist {

HaloExchange::HaloExchange(Communicator comm, std::vector<HaloPeer> peers)
    : peers_(std::move(peers)), comm_(comm.native_handle()), owner_(std::make_shared<Communicator>(std::move(comm))) {}

void HaloExchange::exchange(std::span<const double> send, std::span<double> recv) const {
  if (peers_.empty()) return;
  auto comm = reinterpret_cast<MPI_Comm>(comm_);
  std::vector<MPI_Request> requests(2 * peers_.size(), MPI_REQUEST_NULL);
  for (std::size_t p = 0; p < peers_.size(); ++p) {
    const auto& peer = peers_[p];
    KILN_CHECK(peer.recv_offset + peer.recv_count <= recv.size(), "HaloExchange: receive block past the buffer");
    KILN_MPI_CHECK(MPI_Irecv(recv.data() + peer.recv_offset, static_cast<int>(peer.recv_count), MPI_DOUBLE, peer.rank,
                             peer.recv_tag, comm, &requests[p]));
  }
  for (std::size_t p = 0; p < peers_.size(); ++p) {
    const auto& peer = peers_[p];
    KILN_CHECK(peer.send_offset + peer.send_count <= send.size(), "HaloExchange: send block past the buffer");
    KILN_MPI_CHECK(MPI_Isend(send.data() + peer.send_offset, static_cast<int>(peer.send_count), MPI_DOUBLE, peer.rank,
                             peer.send_tag, comm, &requests[peers_.size() + p]));
  }
  KILN_MPI_CHECK(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE));
}

}  // namespace kiln::dist
