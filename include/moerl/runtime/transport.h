#pragma once
// What the Mailbox sends frames through: MPI between processes
// (runtime/mpi_transport.h), or queues between threads of one process
// (runtime/in_process_transport.h), so that the protocols between roles can
// be unit-tested with threads as ranks. The Mailbox keeps everything else:
// framing, validation, timeouts on receives and the error messages.
//
// A transport delivers frames between each pair of ranks in the order they
// were sent (MPI's non-overtaking rule), matched by tag (the message type)
// and source.

#include <mpi.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace moerl::runtime {

struct ReceivedFrame {
  int source = -1;
  std::vector<std::uint8_t> bytes;
};

enum class SendResult { SendDelivered, SendPeerLost, SendTimedOut };

class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Sends `frame` to `destination` under `tag` and waits at most timeout_s
  // for the send to complete.
  virtual SendResult send(int destination, int tag, const std::vector<std::uint8_t>& frame, double timeout_s) = 0;
  // The oldest frame under `tag` from `source` (MPI_ANY_SOURCE: from anyone),
  // taken out of the queue; nullopt when none has arrived, or when its sender
  // died while its bytes were on the way.
  virtual std::optional<ReceivedFrame> poll(int tag, int source) = 0;
  // The MPI communicator underneath; MPI_COMM_NULL for one that has none.
  virtual MPI_Comm mpi_comm() const { return MPI_COMM_NULL; }
  // A rank that lives outside that communicator (an env worker that joined
  // the running job, runtime/env_join.h) is reached through `intercomm`, at
  // `remote_rank` there. Transports without MPI cannot do this (they throw).
  virtual void route_peer(int rank, MPI_Comm intercomm, int remote_rank) = 0;
  virtual bool has_route(int rank) const { return (void)rank, false; }
  // Ranks that MPI reports dead, except those reached through a route now
  // (the rank's first process died; the one that joined in its place lives).
  virtual std::vector<int> failed_peers() const { return {}; }
};

}  // namespace moerl::runtime
