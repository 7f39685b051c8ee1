#pragma once
// Collectives over one group of ranks, behind one interface with two
// backends: MPI (host memory, CPU runs) and NCCL (device memory, GPU runs;
// bootstrapped over MPI). Topology (which ranks, which group) is decided by
// runtime::World; this layer only moves bytes.
//
// Every operation is non-blocking underneath and every wait takes a timeout:
// a collective that a peer never joins ends in a CommTimeout naming the
// operation, the group and the members that are not in it
// (comm/stall_inspector.h), not in a hung job.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "moerl/core/error.h"

namespace moerl::comm {

class CommTimeout : public Error {
 public:
  using Error::Error;
};

// A member of the group died (or the group was revoked after one did), under
// a fault-tolerant MPI: the group is unusable; every survivor calls
// Communicator::survivors() and goes on with the group it returns.
class PeerFailure : public Error {
 public:
  using Error::Error;
};

enum class DataType { Float32, Float64, Int64, Byte };
size_t element_size(DataType type);
const char* data_type_name(DataType type);

// A collective in flight.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // True once complete; never blocks.
  virtual bool test() = 0;
  // Blocks until complete or throws CommTimeout after timeout_s, naming the
  // members that are not in the collective.
  void wait(double timeout_s);
  virtual std::string describe() const = 0;
  // Which members are not in this collective, asked of them for up to
  // grace_s (StallInspector); "" where the backend cannot tell.
  virtual std::string missing_members(double grace_s) { return ""; }
  // describe() and the missing members, for a wait of timeout_s that ran
  // out: what a caller with its own deadline wording appends.
  std::string stall_report(double timeout_s);
  // "<describe()> did not complete within <timeout_s> s: <missing members>".
  std::string timeout_message(double timeout_s);
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;  // "mpi" or "nccl"
  // "sync group (learner 0 + 2 actors)": how errors name the group.
  virtual const std::string& name() const = 0;
  // The member's rank in MPI_COMM_WORLD: how a survivor learns whom a
  // renumbered group (survivors()) still holds.
  virtual int world_rank_of(int member) const = 0;

  virtual std::unique_ptr<CommRequest> broadcast_async(void* data, size_t count, DataType type, int root) = 0;
  virtual std::unique_ptr<CommRequest> allreduce_sum_async(void* data, size_t count, DataType type) = 0;
  // counts and displacements in elements, one per rank.
  virtual std::unique_ptr<CommRequest> alltoallv_async(const void* send, const std::vector<size_t>& send_counts,
                                                       const std::vector<size_t>& send_displs, void* receive,
                                                       const std::vector<size_t>& receive_counts,
                                                       const std::vector<size_t>& receive_displs, DataType type) = 0;
  virtual std::unique_ptr<CommRequest> barrier_async() = 0;

  // The same members, for small host messages that may stay posted for a
  // long time (the weight sync keeps a header broadcast posted until the
  // next publication). MPI: this communicator. NCCL: an MPI twin of the
  // group, because a posted NCCL collective is a kernel that spins on the
  // GPU until its peers join, and anything on that GPU that must wait for
  // the whole device meanwhile (CUDA's lazy loading of a kernel used for the
  // first time, a cudaFree) waits for a peer that may be waiting for us.
  virtual Communicator& control() { return *this; }

  // Fault tolerance: interrupt() makes every member's pending and later
  // operations fail with PeerFailure (how one member tells the others that
  // the group lost someone); survivors() is collective over the living
  // members and returns their new group (the ranks renumbered). Backends
  // without fault tolerance throw.
  virtual void interrupt() = 0;
  virtual std::unique_ptr<Communicator> survivors() = 0;

  // Blocking forms with a timeout.
  void broadcast(void* data, size_t count, DataType type, int root, double timeout_s);
  void allreduce_sum(void* data, size_t count, DataType type, double timeout_s);
  void barrier(double timeout_s);
};

}  // namespace moerl::comm
