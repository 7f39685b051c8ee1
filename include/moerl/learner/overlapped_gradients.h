#pragma once
// Gradient averaging that overlaps the backward pass: the parameters are cut
// into buckets of about bucket_bytes, in reverse order (the backward reaches
// the last layers first), and each bucket's all-reduce starts as soon as the
// backward has produced all of its gradients, while the earlier layers'
// backward still runs. The result is that of average_gradients over the
// same parameters (gradient_averaging.h): sums over the group, divided by
// the number of learners.
//
// Collectives must start in the same order on every learner, but which
// gradients a backward produces differs between learners (an expert that no
// token of this learner reached gets none). So buckets start strictly in
// bucket order: a ready bucket waits for the ones before it, and finish()
// starts every bucket not yet started (its missing gradients taken as they
// stand: the earlier micro-batches' sum, or zeros). Every learner starts the
// same buckets in the same order, whatever its data.
//
// The group must carry no other collective between arm() and finish(): one
// learner may start a bucket during its backward while another, without
// data, reaches some other collective first. Give it a communicator of its
// own (a dup of the learners').
//
// Hooks read a parameter's gradient before autograd adds it to .grad, so the
// value put in a bucket is .grad (earlier micro-batches) plus this backward's
// part. Arm only before the last backward of a step. MPI progresses a
// non-blocking collective only inside MPI calls: each hook tests the buckets
// in flight, which is what moves them along during the backward.
// Include after the LibTorch precompiled header.

#include <cstddef>
#include <memory>
#include <vector>

#include "moerl/comm/communicator.h"

namespace moerl::learner {

struct OverlapStats {
  int buckets = 0;
  int started_in_backward = 0;  // buckets whose all-reduce began before finish()
  double finish_wait_s = 0;     // time finish() waited for all-reduces
};

class OverlappedGradients {
 public:
  // parameters: float32 (or float64) leaves, the same list on every learner;
  // group: the learners to sum over; learners: the divisor.
  OverlappedGradients(std::vector<torch::Tensor> parameters, comm::Communicator& group, double learners,
                      double timeout_s, std::size_t bucket_bytes);
  ~OverlappedGradients();
  OverlappedGradients(const OverlappedGradients&) = delete;
  OverlappedGradients& operator=(const OverlappedGradients&) = delete;

  // Before the step's last backward: its gradients go into buckets as they come.
  void arm();
  // After that backward (or instead of it, for a learner without data):
  // starts what is left, waits for every bucket, and writes the averages into
  // the parameters' .grad. Disarms.
  OverlapStats finish();

  int bucket_count() const { return static_cast<int>(buckets_.size()); }
  bool armed() const { return armed_; }

 private:
  struct Bucket;
  struct Slot {
    size_t bucket = 0;
    std::int64_t offset = 0;  // in elements, within the bucket
    bool filled = false;
  };

  void on_gradient(size_t parameter, const torch::Tensor& grad);
  void start_ready_buckets();
  void start(Bucket& bucket);
  void test_in_flight();

  std::vector<torch::Tensor> parameters_;
  std::vector<Slot> slots_;  // one per parameter
  std::vector<std::unique_ptr<Bucket>> buckets_;
  std::vector<unsigned> hook_handles_;
  comm::Communicator& group_;
  double learners_;
  double timeout_s_;
  bool armed_ = false;
  size_t next_to_start_ = 0;
  int started_in_backward_ = 0;
};

}  // namespace moerl::learner
