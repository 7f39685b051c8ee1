// The message layer's framing: round trips, and every way a frame can be
// malformed is refused with a message naming the sender and the problem.

#include <catch2/catch.hpp>

#include "moerl/runtime/message.h"
#include "moerl/runtime/metrics_report.h"

using namespace moerl::runtime;

TEST_CASE("crc32 matches the standard check value", "[wire]") {
  const char* text = "123456789";
  CHECK(crc32(text, 9) == 0xCBF43926u);
  CHECK(crc32(nullptr, 0) == 0u);
}

TEST_CASE("ByteWriter and ByteReader round-trip and refuse truncation", "[wire]") {
  ByteWriter w;
  w.put<std::int32_t>(-7);
  w.put<double>(2.5);
  w.put_string("héllo\0x");
  w.put_vector(std::vector<float>{1.f, 2.f, 3.f});
  const auto bytes = w.take();
  ByteReader r(bytes);
  CHECK(r.get<std::int32_t>() == -7);
  CHECK(r.get<double>() == 2.5);
  CHECK(r.get_string() == "héllo");
  CHECK(r.get_vector<float>() == std::vector<float>{1.f, 2.f, 3.f});
  CHECK_NOTHROW(r.expect_end());

  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    ByteReader partial(bytes.data(), cut);
    INFO("cut at " << cut);
    CHECK_THROWS_AS(([&] {
                      partial.get<std::int32_t>();
                      partial.get<double>();
                      partial.get_string();
                      partial.get_vector<float>();
                    }()),
                    WireError);
  }
}

TEST_CASE("a hostile length cannot allocate beyond the payload", "[wire]") {
  ByteWriter w;
  w.put<std::uint64_t>(std::uint64_t{1} << 60);  // claims 2^60 elements
  const auto bytes = w.take();
  ByteReader r(bytes);
  CHECK_THROWS_WITH(r.get_vector<double>(), Catch::Contains("truncated"));
}

TEST_CASE("typed messages round-trip through frames", "[wire]") {
  ByteWriter w;
  HelloReply{3, "actor", 1, "node7", 4242, 2, 99}.encode(w);
  const auto frame = frame_message(MessageType::HelloReply, 3, w.bytes());
  CHECK(frame.size() == kHeaderBytes + w.bytes().size());
  const Envelope e = unframe_message(frame, MessageType::HelloReply, 3);
  ByteReader r(e.payload);
  const HelloReply back = HelloReply::decode(r);
  r.expect_end();
  CHECK(back.rank == 3);
  CHECK(back.role == "actor");
  CHECK(back.hostname == "node7");
  CHECK(back.pid == 4242);
  CHECK(back.config_hash == 99);
}

TEST_CASE("malformed frames are refused with the reason", "[wire]") {
  ByteWriter w;
  Ping{5, 1.0}.encode(w);
  const auto good = frame_message(MessageType::Ping, 2, w.bytes());
  REQUIRE_NOTHROW(unframe_message(good, MessageType::Ping, 2));

  auto corrupt = [&](size_t offset, std::uint8_t value) {
    auto frame = good;
    frame[offset] = value;
    return frame;
  };
  auto refusal = [](const std::vector<std::uint8_t>& frame, MessageType type, int source) {
    try {
      unframe_message(frame, type, source);
    } catch (const MessageError& error) {
      return std::string(error.what());
    }
    return std::string("accepted");
  };
  CHECK_THAT(refusal(corrupt(0, 0), MessageType::Ping, 2),
             Catch::Contains("bad magic") && Catch::Contains("from rank 2"));
  CHECK_THAT(refusal(corrupt(4, 9), MessageType::Ping, 2), Catch::Contains("wire version 9"));
  CHECK_THAT(refusal(corrupt(6, 200), MessageType::Ping, 2), Catch::Contains("unknown message type 200"));
  CHECK_THAT(refusal(good, MessageType::Pong, 2), Catch::Contains("header says Ping"));
  CHECK_THAT(refusal(corrupt(8, 99), MessageType::Ping, 2), Catch::Contains("announces 99 payload bytes"));
  CHECK_THAT(refusal(good, MessageType::Ping, 1), Catch::Contains("names sender rank 2"));
  CHECK_THAT(refusal(corrupt(kHeaderBytes + 1, 0xEE), MessageType::Ping, 2), Catch::Contains("checksum mismatch"));
  CHECK_THAT(refusal(std::vector<std::uint8_t>(good.begin(), good.begin() + 10), MessageType::Ping, 2),
             Catch::Contains("shorter than the header"));
}

TEST_CASE("metrics reports round-trip and refuse inconsistent histograms", "[wire][metrics]") {
  moerl::telemetry::MetricsRegistry registry(4, "env_worker");
  registry.add("env.steps", 10);
  registry.set("env.sessions", 3);
  for (int i = 1; i <= 100; ++i) registry.record("env.step_latency_s", i * 1e-3);
  ByteWriter w;
  moerl::runtime::MetricsReport{registry.snapshot()}.encode(w);
  ByteReader r(w.bytes());
  const auto back = moerl::runtime::MetricsReport::decode(r);
  r.expect_end();
  CHECK(back.snapshot.rank == 4);
  CHECK(back.snapshot.role == "env_worker");
  CHECK(back.snapshot.counters.at("env.steps") == 10);
  CHECK(back.snapshot.gauges.at("env.sessions") == 3);
  const auto& h = back.snapshot.histograms.at("env.step_latency_s");
  CHECK(h.count() == 100);
  CHECK(h.quantile(0.99) == Approx(0.099).epsilon(0.05));

  // Flip one bucket count: the decoder notices that buckets and count disagree.
  auto bytes = w.take();
  bytes[bytes.size() - 1] ^= 0x01;
  ByteReader tampered(bytes);
  CHECK_THROWS_AS(moerl::runtime::MetricsReport::decode(tampered), WireError);
}
