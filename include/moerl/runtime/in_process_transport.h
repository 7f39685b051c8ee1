#pragma once
// Threads as ranks: an InProcessHub holds one queue of frames per rank, and
// each thread talks through its own InProcessTransport (hub.transport(rank))
// behind a Mailbox. Sends are buffered and complete at once (as MPI's eager
// sends of small frames do); receives take the oldest matching frame, so
// frames between two ranks keep their order. For tests of the protocols
// between roles without mpirun; the real MPI tests stay.

#include <deque>
#include <memory>
#include <mutex>

#include "moerl/runtime/transport.h"

namespace moerl::runtime {

class InProcessHub : public std::enable_shared_from_this<InProcessHub> {
 public:
  static std::shared_ptr<InProcessHub> create(int ranks);
  int size() const { return static_cast<int>(queues_.size()); }
  // The transport of rank `rank` (0 <= rank < size()); it keeps the hub alive.
  std::unique_ptr<Transport> transport(int rank);

 private:
  friend class InProcessTransport;
  struct QueuedFrame {
    int source;
    int tag;
    std::vector<std::uint8_t> bytes;
  };
  explicit InProcessHub(int ranks) : queues_(static_cast<size_t>(ranks)) {}
  std::mutex mutex_;
  std::vector<std::deque<QueuedFrame>> queues_;  // by destination rank
};

}  // namespace moerl::runtime
