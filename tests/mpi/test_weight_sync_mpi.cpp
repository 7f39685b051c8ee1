// Weight publication from rank 0 to every other rank: each receiver ends with
// exactly the published bytes of each version, never a mix (snapshot and
// in-place sending); a corrupted bucket is refused naming the bucket, wherever
// it sits in the pipeline, and the next version still arrives; a layout
// mismatch is refused; collectives time out.

#include <catch2/catch.hpp>
#include <mpi.h>

#include <cstring>
#include <random>

#include "moerl/comm/mpi_communicator.h"
#include "moerl/sync/weight_sync.h"

using namespace moerl;

namespace {

// Three "parameters" of odd sizes whose bytes are a function of the version.
struct FakeParams {
  std::vector<float> a = std::vector<float>(1000), b = std::vector<float>(77777), c = std::vector<float>(3);
  std::vector<sync::WeightView> views() {
    return {{"a", a.data(), a.size() * 4}, {"b", b.data(), b.size() * 4}, {"c", c.data(), c.size() * 4}};
  }
  void fill(std::int64_t version) {
    std::mt19937 rng(static_cast<unsigned>(version));
    for (auto* v : {&a, &b, &c})
      for (float& x : *v) x = static_cast<float>(rng()) / 1e9f;
  }
  bool equals(const FakeParams& o) const { return a == o.a && b == o.b && c == o.c; }
  std::vector<std::uint8_t> flat() const {
    std::vector<std::uint8_t> bytes;
    for (const auto* v : {&a, &b, &c}) {
      const auto* p = reinterpret_cast<const std::uint8_t*>(v->data());
      bytes.insert(bytes.end(), p, p + v->size() * 4);
    }
    return bytes;
  }
};

std::vector<std::uint8_t> version_bytes(std::int64_t version) {
  FakeParams p;
  p.fill(version);
  return p.flat();
}

// A receiver's flat weights as a plain byte vector, to compare with version_bytes.
std::vector<std::uint8_t> bytes_of(const sync::FlatWeights& weights) {
  return std::vector<std::uint8_t>(weights->begin(), weights->end());
}

// A group whose control messages travel apart from its bulk collectives, as
// NCCL's do (Communicator::control), counting the bulk requests still
// unfinished: on a GPU each of them would be a kernel spinning on the device.
class SplitChannels : public comm::Communicator {
 public:
  explicit SplitChannels(MPI_Comm members) : bulk_(members, "bulk channel"), control_(members, "control channel") {}

  int rank() const override { return bulk_.rank(); }
  int size() const override { return bulk_.size(); }
  std::string backend() const override { return "split"; }
  const std::string& name() const override { return bulk_.name(); }
  int world_rank_of(int member) const override { return bulk_.world_rank_of(member); }
  std::unique_ptr<comm::CommRequest> broadcast_async(void* data, size_t count, comm::DataType type, int root) override {
    return counted(bulk_.broadcast_async(data, count, type, root));
  }
  std::unique_ptr<comm::CommRequest> allreduce_sum_async(void* data, size_t count, comm::DataType type) override {
    return counted(bulk_.allreduce_sum_async(data, count, type));
  }
  std::unique_ptr<comm::CommRequest> alltoallv_async(const void* send, const std::vector<size_t>& send_counts,
                                                     const std::vector<size_t>& send_displs, void* receive,
                                                     const std::vector<size_t>& receive_counts,
                                                     const std::vector<size_t>& receive_displs,
                                                     comm::DataType type) override {
    return counted(
        bulk_.alltoallv_async(send, send_counts, send_displs, receive, receive_counts, receive_displs, type));
  }
  std::unique_ptr<comm::CommRequest> barrier_async() override { return counted(bulk_.barrier_async()); }
  void interrupt() override { bulk_.interrupt(); }
  std::unique_ptr<comm::Communicator> survivors() override { return bulk_.survivors(); }
  comm::Communicator& control() override { return control_; }

  // Bulk collectives posted and not yet found complete.
  int bulk_in_flight() const { return *in_flight_; }

 private:
  class Counted : public comm::CommRequest {
   public:
    Counted(std::unique_ptr<comm::CommRequest> inner, std::shared_ptr<int> in_flight)
        : inner_(std::move(inner)), in_flight_(std::move(in_flight)) {
      ++*in_flight_;
    }
    ~Counted() override {
      if (!done_) --*in_flight_;
    }
    bool test() override {
      if (!done_ && inner_->test()) {
        done_ = true;
        --*in_flight_;
      }
      return done_;
    }
    std::string describe() const override { return inner_->describe(); }

   private:
    std::unique_ptr<comm::CommRequest> inner_;
    std::shared_ptr<int> in_flight_;
    bool done_ = false;
  };
  std::unique_ptr<comm::CommRequest> counted(std::unique_ptr<comm::CommRequest> inner) {
    return std::make_unique<Counted>(std::move(inner), in_flight_);
  }

  comm::MpiCommunicator bulk_;
  comm::MpiCommunicator control_;
  std::shared_ptr<int> in_flight_ = std::make_shared<int>(0);
};

}  // namespace

TEST_CASE("every receiver gets every published version, whole and verified", "[sync]") {
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "test sync group");
  sync::SyncOptions options;
  options.bucket_bytes = 40000;  // ~9 buckets
  options.timeout_s = 30;
  FakeParams params;
  const std::int64_t versions = 5;
  if (comm.rank() == 0) {
    sync::WeightPublisher publisher(comm, params.views(), options);
    for (std::int64_t v = 1; v <= versions; ++v) {
      params.fill(v);
      publisher.publish(v);
      params.fill(1000 + v);  // training moves on at once: the staging copy protects the receivers
      publisher.finish();
      CHECK(publisher.last().bytes == (1000 + 77777 + 3) * 4);
      CHECK(publisher.last().buckets == 8);
    }
    publisher.close();
  } else {
    sync::WeightReceiver receiver(comm, params.views(), options);
    std::int64_t applied = 0;
    int decode_steps = 0;
    while (!receiver.closed() || receiver.ready_version() > receiver.current_version()) {
      // "Generate" between polls; the version only changes at apply().
      const std::int64_t before = receiver.current_version();
      ++decode_steps;
      if (receiver.poll()) {
        const std::int64_t v = receiver.apply();
        CHECK(v > before);
        FakeParams expected;
        expected.fill(v);
        CHECK(params.equals(expected));
        ++applied;
      }
      REQUIRE(decode_steps < 10000000);
    }
    // Receivers may skip none here: the publisher waits for every receiver before the next version.
    CHECK(applied == versions);
    CHECK(receiver.current_version() == versions);
  }
}

TEST_CASE("buckets sent in place from the parameters arrive whole", "[sync]") {
  // snapshot = false: buckets inside one parameter leave from its memory,
  // buckets across parameters from staging; the receivers see the same bytes.
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "test sync group");
  sync::SyncOptions options;
  options.bucket_bytes = 40000;
  options.timeout_s = 30;
  options.snapshot = false;
  FakeParams params;
  if (comm.rank() == 0) {
    sync::WeightPublisher publisher(comm, params.views(), options);
    for (std::int64_t v = 1; v <= 2; ++v) {
      params.fill(v);
      publisher.publish(v);
      publisher.finish();
      // Buckets 1..6 lie inside parameter b; 0 and 7 straddle parameters.
      CHECK(publisher.last().copied_bytes == 40000 + (1000 + 77777 + 3) * 4 - 7 * 40000);
    }
    publisher.close();
  } else {
    sync::WeightReceiver receiver(comm, params.views(), options);
    for (std::int64_t v = 1; v <= 2; ++v) {
      REQUIRE(receiver.wait_ready(30));
      CHECK(receiver.apply() == v);
      FakeParams expected;
      expected.fill(v);
      CHECK(params.equals(expected));
    }
    while (!receiver.closed()) receiver.poll();
  }
}

TEST_CASE("a corrupted bucket is refused and the version never applied", "[sync]") {
  // The first, a middle and the last bucket: each is checksummed as it lands
  // and compared once the publisher's checksums (sent last) are in; the
  // refusal comes once the version's collectives are done, and the next
  // version is received and applied as usual.
  const int corrupted = GENERATE(0, 3, 7);
  const bool snapshot = GENERATE(true, false);
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "test sync group");
  sync::SyncOptions options;
  options.bucket_bytes = 40000;
  options.timeout_s = 30;
  options.snapshot = snapshot;
  FakeParams params;
  if (comm.rank() == 0) {
    options.corrupt_bucket_for_test = corrupted;  // in the next publication only
    sync::WeightPublisher publisher(comm, params.views(), options);
    params.fill(7);
    publisher.publish(7);
    publisher.finish();
    FakeParams published;
    published.fill(7);
    CHECK(params.equals(published));  // the corruption is on the wire only, never in the parameters
    params.fill(8);
    publisher.publish(8);
    publisher.finish();
    publisher.close();
  } else {
    sync::WeightReceiver receiver(comm, params.views(), options);
    params.fill(0);
    FakeParams untouched = params;
    std::string error;
    try {
      receiver.wait_ready(30);
    } catch (const sync::CorruptVersionError& e) {  // transient: the next version comes as usual
      error = e.what();
    }
    CHECK_THAT(error,
               Catch::Contains("weights version 7: bucket " + std::to_string(corrupted) + " of 8 failed its checksum"));
    CHECK(receiver.current_version() == -1);
    CHECK(params.equals(untouched));
    REQUIRE(receiver.wait_ready(30));
    CHECK(receiver.apply() == 8);
    FakeParams expected;
    expected.fill(8);
    CHECK(params.equals(expected));
    while (!receiver.closed()) receiver.poll();
  }
}

TEST_CASE("swap mode: versions land beside the live weights and apply() swaps them", "[sync]") {
  // As the actors receive (module_rebind): the parameters live in one of the
  // receiver's two buffers. A corrupted version never becomes live; a buffer
  // that someone still holds after a swap is never landed in again.
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "test sync group");
  sync::SyncOptions options;
  options.bucket_bytes = 40000;
  options.timeout_s = 30;
  FakeParams params;
  if (comm.rank() == 0) {
    sync::WeightPublisher publisher(comm, params.views(), options);
    for (std::int64_t v = 1; v <= 4; ++v) {
      if (v == 2) publisher.corrupt_next_publication(5);
      params.fill(v);
      publisher.publish(v);
      publisher.finish();
    }
    publisher.close();
  } else {
    params.fill(0);
    sync::FlatWeights live;
    int rebinds = 0;
    sync::WeightReceiver receiver(comm, params.views(), options, [&](const sync::FlatWeights& w) {
      live = w;
      ++rebinds;
    });
    REQUIRE(rebinds == 1);  // the parameters moved into the receiver at once, bytes and all
    CHECK(bytes_of(live) == version_bytes(0));
    const std::uint8_t* initial = live->data();
    CHECK(reinterpret_cast<std::uintptr_t>(initial) % 4096 == 0);  // page-aligned, like the publisher's staging

    REQUIRE(receiver.wait_ready(30));
    CHECK(receiver.apply() == 1);
    CHECK(rebinds == 2);
    CHECK(live->data() != initial);
    CHECK(bytes_of(live) == version_bytes(1));
    const sync::FlatWeights held = live;  // a tensor made from version 1 that outlives the next swaps

    CHECK_THROWS_AS(receiver.wait_ready(30), sync::CorruptVersionError);
    CHECK(receiver.current_version() == 1);
    CHECK(bytes_of(live) == version_bytes(1));  // the damaged version 2 landed in the other buffer only

    REQUIRE(receiver.wait_ready(30));
    CHECK(receiver.apply() == 3);
    CHECK(live->data() == initial);  // swapped back into the first buffer
    CHECK(bytes_of(live) == version_bytes(3));
    REQUIRE(receiver.wait_ready(30));
    CHECK(receiver.apply() == 4);
    CHECK(bytes_of(live) == version_bytes(4));
    CHECK(live->data() != held->data());        // version 4 went to a fresh buffer ...
    CHECK(bytes_of(held) == version_bytes(1));  // ... and the held one kept its bytes
    CHECK(params.flat() == version_bytes(0));   // the original memory is no longer written
    while (!receiver.closed()) receiver.poll();
  }
}

TEST_CASE("an actor with another model layout refuses the weights", "[sync]") {
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "test sync group");
  sync::SyncOptions options;
  options.timeout_s = 30;
  FakeParams params;
  if (comm.rank() == 0) {
    sync::WeightPublisher publisher(comm, params.views(), options);
    publisher.publish(1);
    publisher.finish();
    publisher.close();
  } else {
    std::vector<float> other(500);
    sync::WeightReceiver receiver(comm, {{"a", other.data(), other.size() * 4}}, options);
    CHECK_THROWS_WITH(receiver.wait_ready(30), Catch::Contains("another layout") && Catch::Contains("2000 bytes"));
    CHECK(receiver.current_version() == -1);
    while (!receiver.closed()) receiver.poll();  // the closing header
  }
}

TEST_CASE("a collective that a rank never joins times out naming the group", "[sync]") {
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "test group");
  if (comm.rank() != comm.size() - 1) {
    int value = 1;
    CHECK_THROWS_WITH(comm.allreduce_sum(&value, 1, comm::DataType::Byte, 0.3),
                      Catch::Contains("MPI all-reduce of 1 byte in test group did not complete within"));
  }
  // The last rank joins late so that the abandoned collective can complete
  // before the communicator is freed.
  MPI_Barrier(MPI_COMM_WORLD);
  if (comm.rank() == comm.size() - 1) {
    int value = 1;
    comm.allreduce_sum(&value, 1, comm::DataType::Byte, 5);
  }
  MPI_Barrier(MPI_COMM_WORLD);
}

TEST_CASE("all-reduce and all-to-all-v deliver what each rank expects", "[sync]") {
  comm::MpiCommunicator comm(MPI_COMM_WORLD, "test group");
  const int n = comm.size(), r = comm.rank();
  std::vector<double> values = {1.0 * r, 2.0};
  comm.allreduce_sum(values.data(), 2, comm::DataType::Float64, 10);
  CHECK(values[0] == n * (n - 1) / 2.0);
  CHECK(values[1] == 2.0 * n);
  // Rank r sends (r + 1) copies of (100 r + d) to each rank d.
  std::vector<std::int64_t> send;
  std::vector<size_t> send_counts, send_displs, receive_counts, receive_displs;
  for (int d = 0; d < n; ++d) {
    send_displs.push_back(send.size());
    for (int k = 0; k <= r; ++k) send.push_back(100 * r + d);
    send_counts.push_back(static_cast<size_t>(r + 1));
  }
  size_t total = 0;
  for (int s = 0; s < n; ++s) {
    receive_displs.push_back(total);
    receive_counts.push_back(static_cast<size_t>(s + 1));
    total += static_cast<size_t>(s + 1);
  }
  std::vector<std::int64_t> receive(total, -1);
  comm.alltoallv_async(send.data(), send_counts, send_displs, receive.data(), receive_counts, receive_displs,
                       comm::DataType::Int64)
      ->wait(10);
  for (int s = 0; s < n; ++s)
    for (size_t k = 0; k < receive_counts[s]; ++k) CHECK(receive[receive_displs[s] + k] == 100 * s + r);
}

TEST_CASE("a group names each member's world rank", "[sync]") {
  // How an actor tells, after a shrink, whether the publisher is still in the
  // group: a group without world rank 0 must not report it at member 0.
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  MPI_Comm without_first = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, world_rank == 0 ? MPI_UNDEFINED : 1, world_rank, &without_first);
  if (world_rank == 0) {
    CHECK(without_first == MPI_COMM_NULL);
    return;
  }
  comm::MpiCommunicator group(without_first, "group without rank 0");
  MPI_Comm_free(&without_first);
  REQUIRE(group.size() == world_size - 1);
  for (int member = 0; member < group.size(); ++member) CHECK(group.world_rank_of(member) == member + 1);
  CHECK(group.world_rank_of(group.rank()) == world_rank);
  CHECK_THROWS(group.world_rank_of(group.size()));
}

TEST_CASE("between publications nothing stays posted on the bulk channel", "[sync]") {
  // Over NCCL a collective left posted is a kernel spinning on the GPU, and
  // an actor whose next decode kernel must first be loaded waits for it, so
  // for the next publication, which waits for the actor's episodes: the
  // header that waits for the next publication goes over control().
  SplitChannels group(MPI_COMM_WORLD);
  sync::SyncOptions options;
  options.bucket_bytes = 40000;
  options.timeout_s = 30;
  FakeParams params;
  const std::int64_t versions = 3;
  if (group.rank() == 0) {
    sync::WeightPublisher publisher(group, params.views(), options);
    for (std::int64_t v = 1; v <= versions; ++v) {
      params.fill(v);
      publisher.publish(v);
      CHECK(group.bulk_in_flight() > 0);  // the buckets do travel on the bulk channel
      publisher.finish();
      CHECK(group.bulk_in_flight() == 0);
      MPI_Barrier(MPI_COMM_WORLD);  // every receiver has applied v and looked at its channel
    }
    publisher.close();
  } else {
    sync::WeightReceiver receiver(group, params.views(), options);
    for (std::int64_t v = 1; v <= versions; ++v) {
      CHECK(group.bulk_in_flight() == 0);  // waiting for the header: nothing on the bulk channel
      REQUIRE(receiver.wait_ready(30));
      CHECK(receiver.apply() == v);
      FakeParams expected;
      expected.fill(v);
      CHECK(params.equals(expected));
      CHECK(group.bulk_in_flight() == 0);  // the next header is posted, on the control channel
      MPI_Barrier(MPI_COMM_WORLD);
    }
    while (!receiver.closed()) receiver.poll();
  }
}
