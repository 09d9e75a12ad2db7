#include "kiln/dist/halo_exchange.h"

#include <mpi.h>

#include "kiln/runtime/error.h"

namespace kiln::dist {

namespace {
void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  KILN_FAIL("{} failed: {}", call, std::string(text, static_cast<std::size_t>(len)));
}
}  // namespace

HaloExchange::HaloExchange(Communicator comm, std::vector<HaloPeer> peers)
    : peers_(std::move(peers)), comm_(comm.native_handle()), owner_(std::make_shared<Communicator>(std::move(comm))) {}

void HaloExchange::exchange(std::span<const double> send, std::span<double> recv) const {
  if (peers_.empty()) return;
  auto comm = reinterpret_cast<MPI_Comm>(comm_);
  std::vector<MPI_Request> requests(2 * peers_.size(), MPI_REQUEST_NULL);
  for (std::size_t p = 0; p < peers_.size(); ++p) {
    const auto& peer = peers_[p];
    KILN_CHECK(peer.recv_offset + peer.recv_count <= recv.size(), "HaloExchange: receive block past the buffer");
    check_mpi(MPI_Irecv(recv.data() + peer.recv_offset, static_cast<int>(peer.recv_count), MPI_DOUBLE, peer.rank,
                        peer.recv_tag, comm, &requests[p]),
              "MPI_Irecv");
  }
  for (std::size_t p = 0; p < peers_.size(); ++p) {
    const auto& peer = peers_[p];
    KILN_CHECK(peer.send_offset + peer.send_count <= send.size(), "HaloExchange: send block past the buffer");
    check_mpi(MPI_Isend(send.data() + peer.send_offset, static_cast<int>(peer.send_count), MPI_DOUBLE, peer.rank,
                        peer.send_tag, comm, &requests[peers_.size() + p]),
              "MPI_Isend");
  }
  check_mpi(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
}

}  // namespace kiln::dist
