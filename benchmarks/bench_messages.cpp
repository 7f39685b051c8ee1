// `moerl bench messages`: the cost of the typed message layer on one rank:
// framing (header + CRC-32) and validation (header checks + CRC-32 + copy)
// of a payload, in GB/s of payload, against a plain memcpy of the same bytes
// measured in the same run (the ceiling any framing could reach).

#include <chrono>
#include <cstring>
#include <vector>

#include "moerl/bench/registry.h"
#include "moerl/bench/timing.h"
#include "moerl/runtime/message.h"

namespace {

using moerl::bench::best_seconds;

moerl::bench::BenchReport run(const moerl::bench::BenchOptions& options) {
  moerl::bench::BenchReport report;
  const std::vector<std::int64_t> sizes =
      options.quick ? std::vector<std::int64_t>{4096} : std::vector<std::int64_t>{256, 65536, 4 << 20};
  const int repetitions = options.quick ? 2 : 7;
  for (const std::int64_t size : sizes) {
    // Enough messages per timing that small sizes are not all clock noise.
    const std::int64_t count = std::max<std::int64_t>(1, (options.quick ? 1 << 20 : 64 << 20) / size);
    std::vector<std::uint8_t> payload(static_cast<size_t>(size));
    for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::uint8_t>(i * 131 + 7);
    std::vector<std::uint8_t> copy(payload.size());
    std::uint64_t sink = 0;

    const double framed = best_seconds(repetitions, [&] {
      for (std::int64_t i = 0; i < count; ++i) {
        const auto frame = moerl::runtime::frame_message(moerl::runtime::MessageType::Ping, 0, payload);
        const auto envelope = moerl::runtime::unframe_message(frame, moerl::runtime::MessageType::Ping, 0);
        sink += envelope.payload[static_cast<size_t>(i) % envelope.payload.size()];
      }
    });
    const double copied = best_seconds(repetitions, [&] {
      for (std::int64_t i = 0; i < count; ++i) {
        // Two copies: framing copies the payload in, validation copies it out.
        std::memcpy(copy.data(), payload.data(), payload.size());
        std::memcpy(payload.data(), copy.data(), copy.size());
        sink += copy[static_cast<size_t>(i) % copy.size()];
      }
    });
    const double gigabytes = static_cast<double>(size * count) / 1e9;
    moerl::bench::BenchCase c;
    c.name = "frame+validate";
    c.params = {{"payload_bytes", size}, {"messages", count}};
    c.metrics = {{"payload_GB_per_s", gigabytes / framed}};
    c.baseline = {{"payload_GB_per_s", gigabytes / copied}};
    c.ratio_metric = "payload_GB_per_s";
    if (sink == 42) c.params["unlikely"] = true;  // keeps the loops from being optimised away
    report.cases.push_back(c);
  }
  return report;
}

}  // namespace

MOERL_BENCHMARK("messages", "typed message framing + validation GB/s vs memcpy of the same bytes", run);
