// An actor group with split experts against one actor holding them all, at
// the GenerationEngine level: every rank of the expert group (MPI_COMM_WORLD)
// drives its own sessions (a different number per rank, joining at
// different steps, some ranks idle for a while) through an engine whose
// policy splits the experts, in lockstep (GenerationEngine::set_expert_lockstep:
// the members agree each step's forwards and join the ones they have no rows
// for idle). The same sessions on an engine over the whole policy, alone,
// must produce the same greedy tokens, turn by turn.

#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <memory>
#include <vector>

#include "moerl/comm/communicator_expert_exchange.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/model/policy.h"
#include "moerl/rollout/generation_engine.h"

// Last: LibTorch's headers bring glog's CHECK, which must not replace Catch's.
#undef CHECK
#include <catch2/catch.hpp>

using namespace moerl;

namespace {

config::ModelSection engine_model() {
  config::ModelSection model;
  model.vocab_size = 264;  // the byte tokenizer's, which the default episode format uses
  model.d_model = 32;
  model.num_layers = 2;
  model.d_ff = 48;
  model.max_seq_len = 128;
  model.init_std = 0.3;
  return model;
}

config::MoeSection engine_moe() {
  config::MoeSection moe;
  moe.enabled = true;
  moe.num_experts = 8;
  moe.top_k = 2;
  moe.d_expert = 24;
  moe.block_size = 4;
  return moe;
}

// This rank's script: session s joins at step 3*s (rank 1's first session
// only at step 5: it is idle until then) with a prompt of its own, and plays
// two turns, the second after a short observation.
struct SessionScript {
  std::uint64_t id;
  int join_step;
  std::vector<std::int64_t> prompt;
};

std::vector<SessionScript> script_of(int rank) {
  torch::manual_seed(300 + rank);
  std::vector<SessionScript> sessions;
  for (int s = 0; s < 1 + rank % 3; ++s) {
    const std::int64_t length = torch::randint(4, 12, {1}).item<std::int64_t>();
    const torch::Tensor prompt = torch::randint(0, 256, {length}, torch::kInt64);
    sessions.push_back(
        {static_cast<std::uint64_t>(s), 3 * s + (rank == 1 ? 5 : 0),
         std::vector<std::int64_t>(prompt.data_ptr<std::int64_t>(), prompt.data_ptr<std::int64_t>() + length)});
  }
  return sessions;
}

using Turns = std::map<std::uint64_t, std::vector<std::vector<std::int64_t>>>;  // session -> its turns' tokens

// Plays the script on `engine`; with a group, every member steps while any
// has work (one all-reduce a round decides), as the actor's loop does.
Turns play(rollout::GenerationEngine& engine, const std::vector<SessionScript>& script, comm::Communicator* group) {
  rollout::SamplingParams greedy;
  greedy.greedy = true;
  rollout::StopParams stop;
  stop.stop_on_eot = false;
  stop.max_turn_tokens = 6;
  Turns turns;
  for (int round = 0; round < 400; ++round) {
    for (const SessionScript& s : script)
      if (s.join_step == round) {
        engine.add_session(s.id, 7 + s.id);
        engine.append_prompt(s.id, s.prompt);
        engine.start_turn(s.id, greedy, stop);
      }
    double busy = engine.has_work() || round < 12 ? 1 : 0;  // every session has joined by round 12
    if (group) group->allreduce_sum(&busy, 1, comm::DataType::Float64, 30);
    if (busy == 0) break;
    for (std::uint64_t id : engine.step()) {
      turns[id].push_back(engine.take_turn(id).tokens);
      if (turns[id].size() < 2) {
        engine.append_prompt(id, {10, 65, 66, 10});
        engine.start_turn(id, greedy, stop);
      }
    }
  }
  return turns;
}

}  // namespace

TEST_CASE("an actor group with split experts generates the tokens of one actor", "[expert_parallel_engine]") {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  comm::MpiCommunicator group(MPI_COMM_WORLD, "expert group");
  auto exchange = std::make_shared<comm::CommunicatorExpertExchange>(group, 30);
  torch::manual_seed(5);
  model::Policy whole(engine_model(), engine_moe());
  torch::manual_seed(5);
  model::Policy split(engine_model(), engine_moe(), exchange);
  whole->to(torch::kDouble);
  split->to(torch::kDouble);

  rollout::EngineOptions options;
  options.block_size = 8;
  rollout::GenerationEngine alone(whole, options);
  rollout::GenerationEngine member(split, options);
  member.set_expert_lockstep(&group, 30);

  const std::vector<SessionScript> script = script_of(rank);
  const Turns want = play(alone, script, nullptr);
  const Turns got = play(member, script, &group);
  REQUIRE(want.size() == script.size());
  for (const auto& [id, turns] : want) {
    INFO("rank " << rank << ", session " << id);
    REQUIRE(got.count(id) == 1);
    REQUIRE(turns.size() == 2);
    CHECK(got.at(id) == turns);
  }
  // Greedy decoding that repeats one token would hardly test the routing.
  std::vector<std::int64_t> all;
  for (const auto& [id, turns] : want)
    for (const auto& t : turns) all.insert(all.end(), t.begin(), t.end());
  std::sort(all.begin(), all.end());
  CHECK(std::unique(all.begin(), all.end()) - all.begin() > 3);
}
