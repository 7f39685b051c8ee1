// The typed message layer between real MPI ranks: delivery by type, the
// validation of malformed frames from a peer, timeouts that name the peer, and
// when a rank's metrics reporter sends.

#include <catch2/catch.hpp>
#include <mpi.h>

#include "moerl/runtime/mailbox.h"
#include "moerl/runtime/metrics_report.h"

using namespace moerl::runtime;

namespace {

struct DupComm {
  MPI_Comm comm = MPI_COMM_NULL;
  DupComm() { MPI_Comm_dup(MPI_COMM_WORLD, &comm); }
  ~DupComm() { MPI_Comm_free(&comm); }
};

}  // namespace

TEST_CASE("typed messages reach the right rank by type", "[mailbox]") {
  DupComm dup;
  Mailbox mailbox(dup.comm, 20.0);
  const int rank = mailbox.rank(), size = mailbox.size();
  REQUIRE(size >= 3);
  // Everyone sends rank 0 a Pong first and a Ping second; rank 0 receives the
  // Pings first: selection is by type, not by arrival order.
  if (rank != 0) {
    mailbox.send(0, Pong{static_cast<std::uint64_t>(rank), 0.5});
    mailbox.send(0, Ping{static_cast<std::uint64_t>(rank * 10), 1.5});
  } else {
    std::vector<int> ping_from, pong_from;
    for (int i = 1; i < size; ++i) {
      auto [source, ping] = mailbox.receive<Ping>(MPI_ANY_SOURCE);
      CHECK(ping.sequence == static_cast<std::uint64_t>(source * 10));
      ping_from.push_back(source);
    }
    for (int i = 1; i < size; ++i) {
      auto [source, pong] = mailbox.receive<Pong>(MPI_ANY_SOURCE);
      CHECK(pong.sequence == static_cast<std::uint64_t>(source));
      CHECK(pong.ping_sent_at_s == 0.5);
      pong_from.push_back(source);
    }
    std::sort(ping_from.begin(), ping_from.end());
    std::sort(pong_from.begin(), pong_from.end());
    CHECK(ping_from.size() == static_cast<size_t>(size - 1));
    CHECK(ping_from == pong_from);
  }
  MPI_Barrier(dup.comm);
}

TEST_CASE("a malformed frame from a peer is refused naming that peer", "[mailbox]") {
  DupComm dup;
  Mailbox mailbox(dup.comm, 20.0);
  const int rank = mailbox.rank();
  if (rank == 1) {
    ByteWriter w;
    Ping{1, 2.0}.encode(w);
    auto corrupted = frame_message(MessageType::Ping, 1, w.bytes());
    corrupted.back() ^= 0xFF;  // payload byte: checksum no longer matches
    mailbox.send_frame(0, MessageType::Ping, corrupted);
    auto short_payload = frame_message(MessageType::Stop, 1, {1, 2, 3});  // Stop needs a string
    mailbox.send_frame(0, MessageType::Stop, short_payload);
    auto lying = frame_message(MessageType::Ping, 2, w.bytes());  // claims to be rank 2
    mailbox.send_frame(0, MessageType::Ping, lying);
  }
  if (rank == 0) {
    CHECK_THROWS_WITH(mailbox.receive<Ping>(1),
                      Catch::Contains("malformed Ping message from rank 1") && Catch::Contains("checksum"));
    CHECK_THROWS_WITH(mailbox.receive<Stop>(1),
                      Catch::Contains("malformed Stop message from rank 1") && Catch::Contains("truncated"));
    CHECK_THROWS_WITH(mailbox.receive<Ping>(1), Catch::Contains("names sender rank 2"));
  }
  MPI_Barrier(dup.comm);
}

TEST_CASE("waiting for a message that never comes times out naming the peer", "[mailbox]") {
  DupComm dup;
  Mailbox mailbox(dup.comm, 20.0);
  if (mailbox.rank() == 0) {
    const double start = monotonic_seconds();
    CHECK_THROWS_WITH(mailbox.receive<Hello>(2, 0.3), Catch::Contains("no Hello message from rank 2 within 0.3 s"));
    const double waited = monotonic_seconds() - start;
    CHECK(waited >= 0.3);
    CHECK(waited < 5.0);
  }
  MPI_Barrier(dup.comm);
}

TEST_CASE("a rank's first news is reported at once, and only once before the interval", "[mailbox]") {
  DupComm dup;
  Mailbox mailbox(dup.comm, 20.0);
  if (mailbox.rank() == 1) {
    MetricsReporter reporter(mailbox, 3600.0);
    reporter.maybe_send();       // the interval has not passed: nothing
    reporter.send_first_news();  // the first report: sent
    reporter.send_first_news();  // already reported: nothing
    reporter.send_now();         // explicit: sent
  }
  MPI_Barrier(dup.comm);
  if (mailbox.rank() == 0) {
    CHECK(mailbox.receive<MetricsReport>(1, 5.0).first == 1);
    CHECK(mailbox.receive<MetricsReport>(1, 5.0).first == 1);
    CHECK_FALSE(mailbox.try_receive<MetricsReport>(1).has_value());
  }
  MPI_Barrier(dup.comm);
}
