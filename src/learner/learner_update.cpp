// Learner::update and what it needs: the step's loss over micro-batches,
// advantages and dynamic sampling, the gradient all-reduce and the check that
// data-parallel learners hold the same weights. (learner.cpp: the run loop.)

#include <algorithm>
#include <cmath>
#include <limits>

#include "moerl/algo/advantages.h"
#include "moerl/algo/policy_loss.h"
#include "moerl/algo/token_batch.h"
#include "moerl/core/check.h"
#include "moerl/learner/episode_batch.h"
#include "moerl/learner/learner.h"
#include "moerl/learner/gradient_averaging.h"
#include "moerl/learner/overlapped_gradients.h"
#include "moerl/learner/ppo_targets.h"
#include "moerl/learner/turn_credit.h"
#include "moerl/storage/checksum.h"
#include "moerl/sync/module_weights.h"
#include "moerl/telemetry/metrics.h"

namespace moerl::learner {
namespace {

double now_s() { return runtime::monotonic_seconds(); }

algo::PolicyLossOptions loss_options(const config::AlgoSection& a, std::int64_t max_tokens) {
  algo::PolicyLossOptions o;
  o.ratio_level = a.gspo ? algo::RatioLevel::RatioSequence : algo::RatioLevel::RatioToken;
  o.clip_low = a.clip_low;
  o.clip_high = a.clip_high;
  switch (a.normalization) {
    case config::LossNormalization::Token: o.aggregation = algo::LossAggregation::TokenMean; break;
    case config::LossNormalization::Sequence: o.aggregation = algo::LossAggregation::SequenceMean; break;
    case config::LossNormalization::Constant:
      o.aggregation = algo::LossAggregation::ConstantNormalizer;
      o.constant_normalizer = static_cast<double>(max_tokens);
      break;
  }
  o.importance_cap = a.importance_cap;
  o.kl_estimator = a.kl == config::KlMode::K1   ? algo::KlEstimator::KlK1
                   : a.kl == config::KlMode::K3 ? algo::KlEstimator::KlK3
                                                : algo::KlEstimator::KlNone;
  o.kl_coef = a.kl_coef;
  o.entropy_coef = a.entropy_coef;
  return o;
}

// CRC-32C of parameters' float32 host bytes, one by one: the parameters'
// own bytes on the CPU (no copy), one host copy at a time of a device's (a
// device pointer must never reach the host checksum).
std::uint32_t weights_crc(const std::vector<torch::Tensor>& parameters, std::uint32_t crc) {
  for (const torch::Tensor& p : parameters) {
    const torch::Tensor host = p.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    crc = storage::crc32c(host.data_ptr(), static_cast<size_t>(host.numel()) * sizeof(float), crc);
  }
  return crc;
}

PpoOptions ppo_options(const config::AlgoSection& a) {
  PpoOptions o;
  o.gamma = a.gae_gamma;
  o.lambda = a.gae_lambda;
  o.value_clip = a.value_clip;
  o.whiten_advantages = a.whiten_advantages;
  return o;
}

}  // namespace

std::vector<torch::Tensor> Learner::trainable_parameters() const {
  std::vector<torch::Tensor> parameters = policy_->parameters();
  if (value_head_)
    for (const auto& p : value_head_->parameters()) parameters.push_back(p);
  return parameters;
}

void Learner::use_gradient_communicator(comm::Communicator& comm) {
  gradient_comm_ = &comm;
  overlapped_.reset();
  // A bfloat16 run computes its gradients on the compute copy and adds them
  // to the master weights after the backward: nothing to overlap there.
  // Split experts average over other groups than the rest: the flat path does that.
  if (learners_ > 1 && !mixed_ && !policy_->expert_group() && settings_.optim.gradient_bucket_mb > 0) {
    const auto bucket_bytes = static_cast<std::size_t>(settings_.optim.gradient_bucket_mb * 1024 * 1024);
    overlapped_ = std::make_unique<OverlappedGradients>(
        trainable_parameters(), comm, learners_, settings_.message_timeout_s, std::max<std::size_t>(bucket_bytes, 1));
  }
}

void Learner::allreduce_gradients() {
  if (overlapped_) {
    // Armed before the last backward; a learner without data arms here.
    if (!overlapped_->armed()) overlapped_->arm();
    const OverlapStats stats = overlapped_->finish();
    telemetry::metrics().record("learner.gradient_wait_s", stats.finish_wait_s);
    telemetry::metrics().set("learner.gradient_buckets_in_backward", stats.started_in_backward);
    return;
  }
  GradientGroups groups;
  groups.learners = gradient_comm_ ? gradient_comm_ : &learner_comm_;
  groups.expert_replicas = expert_replicas_;
  groups.timeout_s = settings_.message_timeout_s;
  if (!expert_replicas_) {
    average_gradients(trainable_parameters(), {}, groups);
    return;
  }
  // Split experts average over the learners holding the same share.
  std::vector<torch::Tensor> replicated = policy_->replicated_parameters();
  if (value_head_)
    for (const auto& p : value_head_->parameters()) replicated.push_back(p);
  average_gradients(replicated, policy_->split_expert_parameters(), groups);
}

// Episode-level inputs of the loss: rewards (with the overlong penalty),
// group-relative advantages and which episodes dynamic sampling keeps.
struct Learner::EpisodeTargets {
  torch::Tensor advantages;                    // [N]; undefined for PPO and for credit per turn
  std::vector<torch::Tensor> turn_advantages;  // [N] of [turns]: [algo] credit = "turn"
  std::vector<float> final_bonus;              // [N] overlong penalty (PPO adds it to the last turn)
  torch::Tensor kept;                          // [N] float 0/1
  double kept_sequences = 0;
};

Learner::EpisodeTargets Learner::episode_targets(const std::vector<const rollout::Trajectory*>& episodes,
                                                 StepStats& st) {
  const auto n = static_cast<std::int64_t>(episodes.size());
  std::vector<float> reward_values, generated_lengths;
  std::vector<std::int64_t> group_values;
  for (const auto* e : episodes) {
    reward_values.push_back(static_cast<float>(e->reward));
    group_values.push_back(static_cast<std::int64_t>(e->group_id));
    float generated = 0;
    for (std::uint8_t g : e->generated) generated += g;
    generated_lengths.push_back(generated);
    FamilyScore& family = st.by_family[e->task.family];
    ++family.episodes;
    family.successes += e->success;
    family.reward += e->reward;
    st.outcomes.push_back({e->task.family, e->task.difficulty, e->success != 0, e->group_id});
    st.reward_mean += e->reward / static_cast<double>(n);
  }
  torch::Tensor rewards = torch::tensor(reward_values);
  EpisodeTargets targets;
  targets.final_bonus.assign(static_cast<size_t>(n), 0.f);
  if (settings_.algo.overlong_cache_tokens > 0) {
    algo::OverlongOptions overlong;
    overlong.max_length = settings_.rollout.max_tokens_per_episode;
    overlong.cache_length = std::min(settings_.algo.overlong_cache_tokens, settings_.rollout.max_tokens_per_episode);
    overlong.factor = settings_.algo.overlong_factor;
    const torch::Tensor penalty =
        algo::overlong_penalty(torch::tensor(generated_lengths), overlong).to(torch::kFloat32);
    rewards = rewards + penalty;
    targets.final_bonus.assign(penalty.data_ptr<float>(), penalty.data_ptr<float>() + n);
  }
  const torch::Tensor groups = torch::tensor(group_values);
  {
    // Dr.GRPO's advantages are the rewards minus their group's mean.
    const double total = (rewards - rewards.mean()).pow(2).sum().item<double>();
    const double within = algo::dr_grpo_advantages(rewards, groups).pow(2).sum().item<double>();
    st.group_explained_variance = total > 0 ? 1.0 - within / total : 0.0;
  }
  targets.kept = torch::ones({n}, torch::kFloat32);
  const bool ppo = settings_.algo.advantage == config::AdvantageEstimator::Ppo;
  // PPO's baseline is the value head, not the group: equal rewards still teach the critic.
  if (settings_.algo.drop_zero_variance_groups && !ppo) {
    const algo::GroupFilter filter = algo::filter_zero_variance_groups(rewards, groups);
    targets.kept = filter.kept.to(torch::kFloat32);
    st.zero_variance_groups = filter.dropped_groups;
  }
  if (settings_.algo.credit == config::CreditAssignment::Turn) {
    const bool by_std = settings_.algo.advantage == config::AdvantageEstimator::Grpo;
    targets.turn_advantages = turn_credit_advantages(episodes, targets.final_bonus, groups, by_std);
  } else {
    switch (settings_.algo.advantage) {
      case config::AdvantageEstimator::Grpo: targets.advantages = algo::grpo_advantages(rewards, groups); break;
      case config::AdvantageEstimator::DrGrpo: targets.advantages = algo::dr_grpo_advantages(rewards, groups); break;
      case config::AdvantageEstimator::Rloo: targets.advantages = algo::rloo_advantages(rewards, groups); break;
      case config::AdvantageEstimator::Ppo: break;  // per turn, in ppo_targets()
    }
  }
  targets.kept_sequences = targets.kept.sum().item<double>();
  return targets;
}

Learner::EpisodeTargets Learner::kept_targets(const std::vector<const rollout::Trajectory*>& episodes,
                                              const EpisodeTargets& all, std::vector<const rollout::Trajectory*>& kept,
                                              std::vector<const rollout::Trajectory*>& dropped) {
  const torch::Tensor flags = all.kept.contiguous();
  const float* keep = flags.data_ptr<float>();
  std::vector<std::int64_t> index;
  for (size_t i = 0; i < episodes.size(); ++i)
    if (keep[i] > 0) {
      kept.push_back(episodes[i]);
      index.push_back(static_cast<std::int64_t>(i));
    } else {
      dropped.push_back(episodes[i]);
    }
  if (kept.size() == episodes.size()) return all;
  const torch::Tensor rows = torch::tensor(index, torch::kInt64);
  EpisodeTargets out;
  if (all.advantages.defined()) out.advantages = all.advantages.index_select(0, rows);
  if (!all.turn_advantages.empty())
    for (std::int64_t i : index) out.turn_advantages.push_back(all.turn_advantages[static_cast<size_t>(i)]);
  out.kept = torch::ones({static_cast<std::int64_t>(index.size())}, torch::kFloat32);
  for (std::int64_t i : index) out.final_bonus.push_back(all.final_bonus[static_cast<size_t>(i)]);
  out.kept_sequences = all.kept_sequences;
  return out;
}

// How often the learner's own router would have picked other experts than the
// replayed ones (fraction of token-layer pairs whose top-k sets differ).
std::pair<double, double> Learner::router_disagreement(const EpisodeBatch& batch) {
  torch::NoGradGuard no_grad;
  // The routing the learner trains with: the compute copy's, on the device.
  const model::PolicyOutput own = compute_->forward(batch.inputs.to(device_), batch.lengths);
  const torch::Tensor mine = std::get<0>(own.expert_indices.to(torch::kCPU).sort(-1));
  const torch::Tensor replayed = std::get<0>(batch.forced_experts.sort(-1));
  const torch::Tensor differs = (mine != replayed).any(-1);
  return {differs.sum().item<double>(), static_cast<double>(differs.numel())};
}

bool Learner::router_check_due(const std::vector<const EpisodeBatch*>& batches, bool replay) const {
  if (!replay || settings_.algo.routing_check_interval <= 0 || step_ % settings_.algo.routing_check_interval != 0)
    return false;
  return std::all_of(batches.begin(), batches.end(), [](const EpisodeBatch* b) { return b->forced_experts.defined(); });
}

void Learner::record_episode_statistics(const std::vector<const EpisodeBatch*>& batches, bool check_router,
                                        StepStats& st) {
  for (const EpisodeBatch* b : batches) {
    st.generated_tokens += b->generated_tokens;
    st.tokens += b->targets.size(0);
    record_staleness(*b, st);
  }
  if (!check_router) return;
  double differing = 0, pairs = 0;
  for (const EpisodeBatch* b : batches) {
    const auto [d, n] = router_disagreement(*b);
    differing += d;
    pairs += n;
  }
  st.router_disagreement = pairs > 0 ? differing / pairs : 0.0;
  telemetry::metrics().set("learner.router_disagreement", st.router_disagreement);
}

void Learner::use_expert_groups(comm::Communicator& group, comm::Communicator& replicas) {
  MOERL_CHECK(policy_->expert_group() != nullptr, "learner: expert groups given for a policy that holds every expert");
  expert_comm_ = &group;
  expert_replicas_ = &replicas;
}

Learner::ExpertPasses Learner::agree_expert_passes(ExpertPasses mine) {
  if (!expert_comm_) return mine;
  // Each member's counts in its own slots; one sum gathers them all.
  const auto members = static_cast<size_t>(expert_comm_->size());
  std::vector<double> slots(2 * members, 0.0);
  const auto me = static_cast<size_t>(expert_comm_->rank());
  slots[2 * me] = static_cast<double>(mine.router_checks);
  slots[2 * me + 1] = static_cast<double>(mine.backward);
  expert_comm_->allreduce_sum(slots.data(), slots.size(), comm::DataType::Float64, settings_.message_timeout_s);
  ExpertPasses most;
  for (size_t m = 0; m < members; ++m) {
    most.router_checks = std::max(most.router_checks, static_cast<std::int64_t>(slots[2 * m]));
    most.backward = std::max(most.backward, static_cast<std::int64_t>(slots[2 * m + 1]));
  }
  return most;
}

void Learner::idle_router_checks(std::int64_t count) {
  torch::NoGradGuard no_grad;
  for (std::int64_t i = 0; i < count; ++i) compute_->idle_expert_pass();
}

void Learner::idle_backward_passes(std::int64_t count) {
  // In the order of a real micro-batch: forward, the reference's forward, backward.
  for (std::int64_t i = 0; i < count; ++i) {
    const torch::Tensor out = compute_->idle_expert_pass();
    if (reference_) {
      torch::NoGradGuard no_grad;
      reference_->idle_expert_pass();
    }
    out.sum().backward();
    if (mixed_) mixed_->accumulate_gradients();
  }
}

StepStats Learner::update(const std::vector<const rollout::Trajectory*>& episodes) {
  const double started = now_s();
  StepStats st;
  st.step = step_;
  st.version = version_;
  st.episodes = static_cast<int>(episodes.size());
  optimizer_->zero_grad();
  if (mixed_) compute_->zero_grad();
  double local_tokens = 0;
  // Passes through the MoE layers every member of an expert group joins
  // (the exchanges are collectives): agreed once, before the first.
  ExpertPasses expert_passes;
  std::int64_t backward_passes = 0;
  if (!episodes.empty()) {
    const EpisodeTargets all_targets = episode_targets(episodes, st);
    const bool replay = settings_.algo.routing_replay && settings_.moe.enabled;
    // Groups that dynamic sampling dropped carry no loss: they stay out of
    // the forward and backward passes (the loss normalises over kept tokens
    // and sequences only, so its value is the same).
    std::vector<const rollout::Trajectory*> trained, dropped;
    const EpisodeTargets targets = kept_targets(episodes, all_targets, trained, dropped);
    // Micro-batches ([optim] grad_accumulation) split the episodes; each
    // chunk's loss is weighted by its share of the batch so the summed
    // gradient equals that of one full-batch loss.
    const auto n = static_cast<std::int64_t>(trained.size());
    const std::int64_t chunks = std::min<std::int64_t>(settings_.optim.grad_accumulation, n);
    const algo::PolicyLossOptions options = loss_options(settings_.algo, settings_.rollout.max_tokens_per_episode);
    double total_counted = 0;
    std::vector<double> chunk_counted;  // tokens each micro-batch's loss counts
    std::vector<EpisodeBatch> batches;
    std::vector<std::pair<std::int64_t, std::int64_t>> ranges;
    for (std::int64_t c = 0; c < chunks; ++c) {
      const std::int64_t begin = n * c / chunks, end = n * (c + 1) / chunks;
      std::vector<const rollout::Trajectory*> part(trained.begin() + begin, trained.begin() + end);
      batches.push_back(make_episode_batch(part, replay));
      ranges.emplace_back(begin, end);
      const EpisodeBatch& b = batches.back();
      chunk_counted.push_back(
          (b.loss_mask * algo::broadcast_to_tokens(targets.kept.narrow(0, begin, end - begin), b.sequence_index))
              .sum()
              .item<double>());
      total_counted += chunk_counted.back();
    }
    // The last micro-batch with a backward: its gradients are the step's
    // last, and the overlapped all-reduce listens to that backward alone.
    std::int64_t last_backward = -1;
    for (std::int64_t c = 0; c < chunks; ++c)
      if (chunk_counted[static_cast<size_t>(c)] > 0) last_backward = c;
    local_tokens = total_counted;
    {
      // The step's token counts, staleness and router check cover every
      // episode taken: the micro-batches, and the dropped groups apart.
      std::vector<const EpisodeBatch*> all_batches;
      for (const EpisodeBatch& b : batches) all_batches.push_back(&b);
      const EpisodeBatch dropped_batch = dropped.empty() ? EpisodeBatch() : make_episode_batch(dropped, replay);
      if (!dropped.empty()) all_batches.push_back(&dropped_batch);
      const bool check_router = router_check_due(all_batches, replay);
      ExpertPasses mine;
      mine.router_checks = check_router ? static_cast<std::int64_t>(all_batches.size()) : 0;
      mine.backward = std::count_if(chunk_counted.begin(), chunk_counted.end(), [](double c) { return c > 0; });
      expert_passes = agree_expert_passes(mine);
      record_episode_statistics(all_batches, check_router, st);
      idle_router_checks(expert_passes.router_checks - mine.router_checks);
    }
    // The chunk's share: of the counted tokens (token mean) or of the kept sequences.
    auto chunk_share = [&](double counted, const torch::Tensor& kept) {
      return options.aggregation == algo::LossAggregation::TokenMean
                 ? counted / total_counted
                 : kept.sum().item<double>() / std::max(1.0, targets.kept_sequences);
    };
    compute_->train();
    for (std::int64_t c = 0; c < chunks; ++c) {
      const double counted = chunk_counted[static_cast<size_t>(c)];  // counted on the host above
      if (counted == 0) continue;
      // Trajectories arrive on the host; each micro-batch moves to the device
      // once, here, and leaves it when the next one comes.
      const EpisodeBatch batch = batch_on_device(batches[static_cast<size_t>(c)], device_);
      const auto [begin, end] = ranges[static_cast<size_t>(c)];
      const torch::Tensor kept = targets.kept.narrow(0, begin, end - begin).to(device_);
      const torch::Tensor token_mask = batch.loss_mask * algo::broadcast_to_tokens(kept, batch.sequence_index);
      // The loss reads generated positions only (every other one is masked):
      // the head runs there alone, and every per-token input is cut to them.
      const torch::Tensor rows = batch.loss_mask.nonzero().squeeze(1);
      const auto at_rows = [&](const torch::Tensor& per_token) { return per_token.index_select(0, rows); };
      model::PolicyOutput out = compute_->forward(batch.inputs, batch.lengths, batch.forced_experts, rows);
      for (std::size_t layer = 0; layer < out.router_stats.size(); ++layer)
        st.expert_load.add(layer, out.router_stats[layer].tokens_per_expert, out.router_stats[layer].dropped_tokens);
      algo::PolicyLossInputs inputs;
      const torch::Tensor row_targets = at_rows(batch.targets);
      inputs.logp_new = target_logprobs(out.logits, row_targets);
      inputs.logp_behaviour = at_rows(batch.behaviour_logprobs);
      const double share = chunk_share(counted, kept);
      torch::Tensor value_loss;
      if (value_head_) {
        std::vector<const rollout::Trajectory*> part(trained.begin() + begin, trained.begin() + end);
        std::vector<float> bonus(targets.final_bonus.begin() + begin, targets.final_bonus.begin() + end);
        const PpoTargets ppo = ppo_targets(batch, out.hidden, *value_head_, part, bonus, ppo_options(settings_.algo));
        inputs.advantages = at_rows(ppo.token_advantages);
        value_loss = ppo.value_loss;
        st.value_loss += ppo.value_loss.item<double>() * share;
        st.value_mean += ppo.value_mean * share;
        st.explained_variance += ppo.explained_variance * share;
      } else if (!targets.turn_advantages.empty()) {
        const std::vector<const rollout::Trajectory*> part(trained.begin() + begin, trained.begin() + end);
        const std::vector<torch::Tensor> advantages(targets.turn_advantages.begin() + begin,
                                                    targets.turn_advantages.begin() + end);
        inputs.advantages = at_rows(turn_credit_token_advantages(batch, part, advantages));
      } else {
        inputs.advantages = at_rows(algo::broadcast_to_tokens(
            targets.advantages.narrow(0, begin, end - begin).to(device_), batch.sequence_index));
      }
      inputs.loss_mask = at_rows(token_mask);
      inputs.sequence_index = at_rows(batch.sequence_index);
      inputs.num_sequences = end - begin;
      if (settings_.algo.entropy_coef > 0) inputs.entropy = algo::token_entropy_from_logits(out.logits);
      if (reference_) {
        torch::NoGradGuard no_grad;
        inputs.logp_reference = target_logprobs(
            reference_->forward(batch.inputs, batch.lengths, batch.forced_experts, rows).logits, row_targets);
      }
      const algo::LossResult result = algo::policy_loss(inputs, options);
      torch::Tensor loss = result.loss * share;
      if (value_loss.defined()) loss = loss + settings_.algo.value_coef * share * value_loss;
      if (out.aux_loss.defined()) loss = loss + out.aux_loss / static_cast<double>(chunks);
      if (overlapped_ && c == last_backward) overlapped_->arm();
      loss.backward();
      ++backward_passes;
      if (mixed_) mixed_->accumulate_gradients();  // into the float32 master gradients
      st.loss += result.policy_loss * share;
      st.importance_weight_mean += (result.importance_weight_mean - 1.0) * share;
      st.behaviour_gap += result.behaviour_proximal_gap * share;
      st.clip_fraction += (result.clip_fraction_low + result.clip_fraction_high) * share;
      st.kl += result.kl * share;
      st.entropy += result.entropy * share;
    }
  }
  if (episodes.empty()) {
    expert_passes = agree_expert_passes({});
    idle_router_checks(expert_passes.router_checks);
  }
  idle_backward_passes(expert_passes.backward - backward_passes);
  // Every learner joins the all-reduce, with or without data.
  double all_tokens = local_tokens;
  if (learners_ > 1) learner_comm_.allreduce_sum(&all_tokens, 1, comm::DataType::Float64, settings_.message_timeout_s);
  allreduce_gradients();
  if (all_tokens > 0) {
    // The norm before clipping is a metric either way (a late collapse shows
    // in it first); with no clip the call only measures.
    const double clip =
        settings_.optim.grad_clip > 0 ? settings_.optim.grad_clip : std::numeric_limits<double>::infinity();
    st.grad_norm = torch::nn::utils::clip_grad_norm_(policy_->parameters(), clip);
    if (value_head_ && settings_.optim.grad_clip > 0)
      torch::nn::utils::clip_grad_norm_(value_head_->parameters(), settings_.optim.grad_clip);
    auto& groups = optimizer_->param_groups();
    for (size_t g = 0; g < groups.size(); ++g)  // group 1, when present, is the value head
      static_cast<torch::optim::AdamWOptions&>(groups[g].options())
          .lr(learning_rate(step_) * (g == 0 ? 1.0 : settings_.algo.value_lr_scale));
    optimizer_->step();
    if (mixed_) mixed_->refresh();  // the next forward computes on the new weights
    st.updated = true;
  }
  st.update_s = now_s() - started;
  return st;
}

void Learner::record_staleness(const EpisodeBatch& batch, StepStats& st) const {
  const torch::Tensor generated = batch.loss_mask > 0;
  if (!generated.any().item<bool>()) return;
  const torch::Tensor lag = (version_ - batch.versions.masked_select(generated)).to(torch::kFloat64);
  // A running mean over the micro-batches' generated tokens.
  const auto count = static_cast<double>(lag.numel());
  st.staleness_mean = (st.staleness_mean * static_cast<double>(st.staleness_tokens) + lag.sum().item<double>()) /
                      (static_cast<double>(st.staleness_tokens) + count);
  st.staleness_tokens += lag.numel();
  st.staleness_max = std::max(st.staleness_max, lag.max().item<std::int64_t>());
  const torch::Tensor versions_behind = lag.to(torch::kInt64).contiguous();
  const std::int64_t* behind = versions_behind.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < versions_behind.numel(); ++i)
    telemetry::metrics().record("learner.staleness_versions", static_cast<double>(behind[i]));
}

void Learner::check_learners_agree() {
  // Data parallelism is only correct while every learner holds the same
  // weights; every learner puts the CRC of its parameter bytes in its own
  // slots, one all-reduce gathers them, and a divergence is caught the step
  // it happens. With split experts the replicated parameters must agree
  // everywhere, and each share of experts among the learners holding it.
  if (learners_ == 1) return;
  std::vector<torch::Tensor> replicated = policy_->replicated_parameters();
  if (value_head_)
    for (const auto& p : value_head_->parameters()) replicated.push_back(p);
  const auto me = static_cast<size_t>(learner_comm_.rank());
  std::vector<double> slots(2 * static_cast<size_t>(learners_), 0.0);
  slots[2 * me] = static_cast<double>(weights_crc(replicated, 0));
  slots[2 * me + 1] = static_cast<double>(weights_crc(policy_->split_expert_parameters(), 0));
  learner_comm_.allreduce_sum(slots.data(), slots.size(), comm::DataType::Float64, settings_.message_timeout_s);
  const int members = expert_comm_ ? expert_comm_->size() : 1;
  const auto crc_text = [&](size_t slot) { return std::to_string(static_cast<std::uint32_t>(slots[slot])); };
  for (int r = 1; r < learners_; ++r) {
    const auto mine = static_cast<size_t>(r), same_share = static_cast<size_t>(r % members);
    if (slots[2 * mine] != slots[0])
      throw Error("learners diverged after step " + std::to_string(step_) + ": learner " + std::to_string(r) +
                  " holds other weights than learner 0 (weights CRC " + crc_text(2 * mine) + " vs " + crc_text(0) +
                  ")");
    if (slots[2 * mine + 1] != slots[2 * same_share + 1])
      throw Error("learners diverged after step " + std::to_string(step_) + ": learner " + std::to_string(r) +
                  " holds other experts than learner " + std::to_string(same_share) + ", which holds the same share" +
                  " (experts CRC " + crc_text(2 * mine + 1) + " vs " + crc_text(2 * same_share + 1) + ")");
  }
  telemetry::metrics().set("learner.weights_crc", slots[0]);
}

}  // namespace moerl::learner
