// The channels of expert-sharded weight sync for every pair of learner and
// actor expert-parallel sizes in {1, 2, 4}: each actor member's channels
// cover every byte of its parameters exactly once and nothing it does not
// hold; each learner member publishes each of its experts' bytes exactly
// once; both sides' offsets name the same experts.

#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "moerl/sync/expert_sync_plan.h"

using namespace moerl;

namespace {

// Two replicated parameters around two split ones, of odd sizes.
std::vector<sync::SyncedParameter> parameters() {
  return {{"embed", false, 100},
          {"layers.0.mlp.experts.gate_proj", true, 12},
          {"norm", false, 8},
          {"layers.0.mlp.experts.down_proj", true, 20}};
}

// hits[p][byte]: how many pieces of `channels` cover that byte of parameter p,
// on the actor's side (actor = true) or the learner's.
std::vector<std::vector<int>> coverage(const sync::ExpertSyncPlan& plan, const std::vector<size_t>& channels,
                                       bool actor) {
  std::vector<std::vector<int>> hits;
  for (size_t p = 0; p < plan.parameters().size(); ++p)
    hits.emplace_back(actor ? plan.actor_bytes(p) : plan.learner_bytes(p), 0);
  for (size_t c : channels)
    for (const sync::ChannelPiece& piece : plan.channels()[c].pieces) {
      const size_t offset = actor ? piece.actor_offset : piece.learner_offset;
      auto& bytes = hits[piece.parameter];
      INFO("channel " << plan.channels()[c].name << ", parameter " << piece.parameter << ": bytes " << offset << ".."
                      << offset + piece.bytes << " of " << bytes.size());
      REQUIRE(offset + piece.bytes <= bytes.size());  // only bytes this member holds
      for (size_t b = offset; b < offset + piece.bytes; ++b) ++bytes[b];
    }
  return hits;
}

}  // namespace

TEST_CASE("expert sync channels tile every actor's and every learner's weights exactly once", "[expert_sync_plan]") {
  const int learners = GENERATE(1, 2, 4);
  const int actors = GENERATE(1, 2, 4);
  const sync::ExpertSyncLayout layout{8, learners, actors};
  const sync::ExpertSyncPlan plan(layout, parameters());
  INFO(sync::describe(layout));
  // Replicated plus the overlapping pairs of two partitions of [0, E).
  CHECK(plan.channels().size() <= static_cast<size_t>(1 + learners + actors - 1));
  CHECK(plan.channels().front().name == "replicated");

  for (int a = 0; a < actors; ++a) {
    INFO("actor member " << a);
    const auto hits = coverage(plan, plan.actor_channels(a), /*actor=*/true);
    size_t total = 0;
    for (size_t p = 0; p < hits.size(); ++p)
      for (size_t b = 0; b < hits[p].size(); ++b) {
        INFO("parameter " << p << " byte " << b);
        REQUIRE(hits[p][b] == 1);
        ++total;
      }
    // What an actor holds: the replicated bytes and E/P_A experts of each split parameter.
    CHECK(total == 108 + (12 + 20) * static_cast<size_t>(8 / actors));
    CHECK(plan.actor_total_bytes() == total);
    size_t received = 0;
    for (size_t c : plan.actor_channels(a)) received += plan.channels()[c].bytes();
    CHECK(received == total);
  }

  for (int m = 0; m < learners; ++m) {
    INFO("learner member " << m);
    const auto hits = coverage(plan, plan.learner_channels(m), /*actor=*/false);
    for (size_t p = 0; p < hits.size(); ++p) {
      // Learner 0 alone publishes the replicated parameters; every member all of its experts.
      const int want = plan.parameters()[p].split || m == 0 ? 1 : 0;
      for (size_t b = 0; b < hits[p].size(); ++b) {
        INFO("parameter " << p << " byte " << b);
        REQUIRE(hits[p][b] == want);
      }
    }
  }

  // Both offsets of a piece name the channel's first expert.
  for (const sync::SyncChannel& channel : plan.channels()) {
    if (channel.experts.count == 0) continue;
    const sync::ExpertRange learner = sync::expert_range(8, channel.learner, learners);
    const sync::ExpertRange actor = sync::expert_range(8, channel.actor_member, actors);
    for (const sync::ChannelPiece& piece : channel.pieces) {
      const size_t row = plan.parameters()[piece.parameter].bytes;
      INFO(channel.name << ", parameter " << piece.parameter);
      CHECK(piece.learner_offset / row + static_cast<size_t>(learner.first) ==
            static_cast<size_t>(channel.experts.first));
      CHECK(piece.actor_offset / row + static_cast<size_t>(actor.first) == static_cast<size_t>(channel.experts.first));
      CHECK(piece.bytes == row * static_cast<size_t>(channel.experts.count));
    }
  }
}

TEST_CASE("expert sync channels pair the overlapping expert ranges", "[expert_sync_plan]") {
  const sync::ExpertSyncPlan two_to_four({8, 2, 4}, parameters());
  std::vector<std::string> names;
  for (const auto& channel : two_to_four.channels()) names.push_back(channel.name);
  CHECK(names == std::vector<std::string>{"replicated", "experts 0..1: learner 0 -> actor member 0",
                                          "experts 2..3: learner 0 -> actor member 1",
                                          "experts 4..5: learner 1 -> actor member 2",
                                          "experts 6..7: learner 1 -> actor member 3"});
  CHECK(two_to_four.learner_channels(1) == std::vector<size_t>{3, 4});
  CHECK(two_to_four.actor_channels(2) == std::vector<size_t>{0, 3});

  const sync::ExpertSyncPlan four_to_one({8, 4, 1}, parameters());
  CHECK(four_to_one.actor_channels(0) == std::vector<size_t>{0, 1, 2, 3, 4});
  CHECK(four_to_one.channels()[2].name == "experts 2..3: learner 1 -> actor member 0");
  CHECK(four_to_one.channels()[2].pieces[0].actor_offset == 2 * 12);
  CHECK(four_to_one.channels()[2].pieces[0].learner_offset == 0);

  // Non-nested ranges (E = 12 over 4 and 3 members): a learner's experts reach two actor members.
  const sync::ExpertSyncPlan uneven({12, 4, 3}, parameters());
  names.clear();
  for (const auto& channel : uneven.channels()) names.push_back(channel.name);
  CHECK(names == std::vector<std::string>{
                     "replicated", "experts 0..2: learner 0 -> actor member 0",
                     "experts 3..3: learner 1 -> actor member 0", "experts 4..5: learner 1 -> actor member 1",
                     "experts 6..7: learner 2 -> actor member 1", "experts 8..8: learner 2 -> actor member 2",
                     "experts 9..11: learner 3 -> actor member 2"});
}

TEST_CASE("expert sync plans without split or without replicated parameters", "[expert_sync_plan]") {
  const sync::ExpertSyncPlan dense({8, 2, 2}, {{"embed", false, 100}, {"norm", false, 8}});
  REQUIRE(dense.channels().size() == 1);
  CHECK(dense.actor_channels(1) == std::vector<size_t>{0});
  CHECK(dense.learner_channels(1).empty());

  const sync::ExpertSyncPlan experts_only({4, 2, 1}, {{"w", true, 16}});
  REQUIRE(experts_only.channels().size() == 2);
  CHECK(experts_only.channels()[0].name == "experts 0..1: learner 0 -> actor member 0");
  CHECK(experts_only.actor_total_bytes() == 64);
}

TEST_CASE("the model fingerprint is the whole model's, whatever the split", "[expert_sync_plan]") {
  const auto fingerprint = [](sync::ExpertSyncLayout layout, std::vector<sync::SyncedParameter> p) {
    return sync::ExpertSyncPlan(layout, std::move(p)).model_fingerprint();
  };
  const std::uint64_t base = fingerprint({8, 1, 1}, parameters());
  CHECK(fingerprint({8, 2, 4}, parameters()) == base);
  CHECK(fingerprint({8, 4, 2}, parameters()) == base);
  auto renamed = parameters();
  renamed[1].name = "layers.1.mlp.experts.gate_proj";
  CHECK(fingerprint({8, 1, 1}, renamed) != base);
  auto resized = parameters();
  resized[3].bytes = 24;
  CHECK(fingerprint({8, 1, 1}, resized) != base);
  auto unsplit = parameters();
  unsplit[1].split = false;
  CHECK(fingerprint({8, 1, 1}, unsplit) != base);
  CHECK(fingerprint({16, 1, 1}, parameters()) != base);
}

TEST_CASE("an expert-parallel size that does not divide the experts is refused naming the layout",
          "[expert_sync_plan]") {
  CHECK_THROWS_WITH(sync::ExpertSyncPlan({8, 3, 2}, parameters()), Catch::Contains("E = 8, P_L = 3, P_A = 2"));
  CHECK_THROWS_WITH(sync::ExpertSyncPlan({8, 2, 0}, parameters()), Catch::Contains("P_A = 0"));
}
