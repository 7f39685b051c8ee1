#include "moerl/learner/pretrain.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include "moerl/config/config.h"
#include "moerl/core/check.h"
#include "moerl/core/hash.h"
#include "moerl/env/task_family.h"
#include "moerl/env/task_mix.h"
#include "moerl/learner/lr_schedule.h"
#include "moerl/learner/sharded_weights.h"
#include "moerl/text/tokenizer.h"

namespace moerl::learner {
namespace {

// Demonstration seeds: a range that neither RL training nor evaluation uses.
constexpr std::uint64_t kDemoSeedBase = 1ull << 41;

}  // namespace

int demonstration_difficulty(int difficulty, std::int64_t easier_levels, std::uint64_t index) {
  const std::int64_t lowest = std::max<std::int64_t>(1, difficulty - easier_levels);
  const std::uint64_t levels = static_cast<std::uint64_t>(difficulty - lowest + 1);
  return static_cast<int>(lowest + static_cast<std::int64_t>(mix64(index + 29) % levels));
}

namespace {

text::RenderedChat demonstration(const PretrainSettings& settings, std::uint64_t index) {
  const std::string family = env::pick_family(settings.env, settings.env_families, mix64(index + 17));
  MOERL_CHECK(family != "external", "pretraining needs built-in families (the external family has no local expert)");
  env::TaskSpec task = env::make_task(settings.env, settings.env_families, family, kDemoSeedBase + index);
  task.difficulty = demonstration_difficulty(task.difficulty, settings.pretrain.easier_levels, index);
  auto session = env::make_builtin_environment(family);
  std::vector<text::ChatMessage> messages;
  messages.push_back({text::Role::RoleUser, session->open(task)});
  for (std::uint64_t turn = 0; !session->done(); ++turn) {
    const std::string action = session->expert_action(settings.pretrain.expert_error_rate, mix64(index * 1000 + turn));
    messages.push_back({text::Role::RoleAssistant, action});
    const env::StepResult result = session->step(action);
    if (!result.done) messages.push_back({text::Role::RoleUser, result.observation});
  }
  return text::render_chat(messages);
}

}  // namespace

PretrainSettings pretrain_settings(const config::Config& config) {
  PretrainSettings settings;
  settings.pretrain = config.pretrain;
  settings.env = config.env;
  settings.env_families = config.env_families;
  settings.max_tokens_per_episode = config.rollout.max_tokens_per_episode;
  settings.output = config.pretrain.output.empty() ? config.run_directory() + "/base.pt" : config.pretrain.output;
  return settings;
}

std::vector<PretrainSettings> pretrain_stages(const PretrainSettings& settings) {
  const config::PretrainSection& p = settings.pretrain;
  if (p.first_stage_families.empty() || p.first_stage_steps <= 0) return {settings};
  PretrainSettings first = settings;
  first.env.families = p.first_stage_families;
  first.pretrain.steps = p.first_stage_steps;
  const std::filesystem::path output(settings.output);
  first.output = (output.parent_path() / (output.stem().string() + ".stage1" + output.extension().string())).string();
  return {first, settings};
}

PretrainReport pretrain(const PretrainSettings& settings, model::Policy policy, int log_every) {
  const auto started = std::chrono::steady_clock::now();
  PretrainReport report;
  std::vector<text::RenderedChat> demos;
  const std::int64_t budget = settings.max_tokens_per_episode;
  for (std::int64_t i = 0; i < settings.pretrain.episodes; ++i) {
    text::RenderedChat chat = demonstration(settings, static_cast<std::uint64_t>(i));
    if (static_cast<std::int64_t>(chat.tokens.size()) > budget) continue;  // the actors could not hold it either
    report.tokens += static_cast<std::int64_t>(chat.tokens.size());
    demos.push_back(std::move(chat));
  }
  MOERL_CHECK(!demos.empty(), "no demonstration fits [rollout] max_tokens_per_episode = " + std::to_string(budget));
  report.episodes = static_cast<int>(demos.size());
  std::printf("pretrain: %d expert demonstrations (%lld tokens, error rate %.2f); lr %g%s, %lld warm-up steps\n",
              report.episodes, static_cast<long long>(report.tokens), settings.pretrain.expert_error_rate,
              settings.pretrain.lr, settings.pretrain.cosine ? " with cosine decay" : "",
              static_cast<long long>(settings.pretrain.warmup_steps));

  const LrSchedule schedule{settings.pretrain.lr, settings.pretrain.warmup_steps, settings.pretrain.steps,
                            settings.pretrain.cosine};
  torch::optim::AdamW optimizer(policy->parameters(),
                                torch::optim::AdamWOptions(settings.pretrain.lr).betas({0.9, 0.95}));
  policy->train();
  const auto batch = static_cast<size_t>(settings.pretrain.batch_episodes);
  size_t cursor = 0;
  double recent_loss = 0, recent_accuracy = 0;
  int recent = 0;
  for (std::int64_t step = 0; step < settings.pretrain.steps; ++step) {
    std::vector<const text::RenderedChat*> chosen;
    for (size_t i = 0; i < batch; ++i) chosen.push_back(&demos[(cursor + i) % demos.size()]);
    cursor = (cursor + batch) % demos.size();
    std::int64_t longest = 0;
    for (const auto* c : chosen)
      longest = std::max<std::int64_t>(longest, static_cast<std::int64_t>(c->tokens.size()) - 1);
    const auto b = static_cast<std::int64_t>(chosen.size());
    torch::Tensor inputs = torch::full({b, longest}, text::SpecialTokens::kPad, torch::kInt64);
    torch::Tensor lengths = torch::empty({b}, torch::kInt64);
    std::vector<std::int64_t> targets;
    std::vector<float> mask;
    for (std::int64_t e = 0; e < b; ++e) {
      const auto& c = *chosen[static_cast<size_t>(e)];
      const auto fed = static_cast<std::int64_t>(c.tokens.size()) - 1;
      lengths[e] = fed;
      inputs[e].narrow(0, 0, fed).copy_(torch::tensor(std::vector<std::int64_t>(c.tokens.begin(), c.tokens.end() - 1)));
      for (std::int64_t i = 1; i <= fed; ++i) {
        targets.push_back(c.tokens[static_cast<size_t>(i)]);
        mask.push_back(c.assistant_mask[static_cast<size_t>(i)] ? 1.f : 0.f);
      }
    }
    // The loss reads the assistant's positions only: the head runs there.
    const torch::Tensor rows = torch::tensor(mask).nonzero().squeeze(1);
    const torch::Tensor target = torch::tensor(targets).index_select(0, rows);
    const torch::Tensor weight = torch::ones({rows.size(0)});
    model::PolicyOutput out = policy->forward(inputs, lengths, torch::Tensor(), rows);
    const torch::Tensor logp = torch::log_softmax(out.logits, -1);
    const torch::Tensor token_loss = -logp.gather(1, target.unsqueeze(1)).squeeze(1);
    const torch::Tensor loss = (token_loss * weight).sum() / weight.sum().clamp_min(1) +
                               (out.aux_loss.defined() ? out.aux_loss : torch::zeros({}));
    optimizer.zero_grad();
    loss.backward();
    torch::nn::utils::clip_grad_norm_(policy->parameters(), 1.0);
    for (auto& group : optimizer.param_groups())
      static_cast<torch::optim::AdamWOptions&>(group.options()).lr(scheduled_lr(schedule, step));
    optimizer.step();

    const double loss_value = loss.item<double>();
    const double accuracy = ((logp.argmax(1) == target).to(torch::kFloat32) * weight).sum().item<double>() /
                            std::max(1.0, weight.sum().item<double>());
    if (step == 0) report.first_loss = loss_value;
    recent_loss += loss_value;
    recent_accuracy += accuracy;
    ++recent;
    if ((step + 1) % log_every == 0 || step + 1 == settings.pretrain.steps) {
      report.final_loss = recent_loss / recent;
      report.final_accuracy = recent_accuracy / recent;
      std::printf("pretrain step %lld/%lld: loss %.3f, action-token accuracy %.1f%%\n",
                  static_cast<long long>(step + 1), static_cast<long long>(settings.pretrain.steps), report.final_loss,
                  100 * report.final_accuracy);
      std::fflush(stdout);
      recent_loss = recent_accuracy = 0;
      recent = 0;
    }
  }
  report.steps = settings.pretrain.steps;
  report.path = settings.output;
  const auto parent = std::filesystem::path(report.path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent);
  torch::save(policy, report.path);
  report.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return report;
}

namespace {

using TensorMap = std::map<std::string, torch::Tensor>;
using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Every tensor of a torch::save archive by its dotted name, read without
// touching the policy. (torch::load copies tensors by name without comparing
// shapes, so the weights of another model shape used to load silently and
// fail later inside a forward pass.)
void read_saved_tensors(torch::serialize::InputArchive& archive, const std::string& prefix, TensorMap& out) {
  for (const std::string& key : archive.keys()) {
    c10::IValue value;
    if (!archive.try_read(key, value)) continue;
    if (value.isTensor()) {
      out[prefix + key] = value.toTensor();
    } else if (value.isModule()) {
      torch::serialize::InputArchive child;
      if (archive.try_read(key, child)) read_saved_tensors(child, prefix + key + ".", out);
    }  // other attributes (the module's `training` flag) carry no weights
  }
}

// The policy's parameters and buffers, in model order, by the names
// Module::save writes them under.
NamedTensors policy_tensors(const model::Policy& policy) {
  NamedTensors out;
  for (const auto& item : policy->named_parameters(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  for (const auto& item : policy->named_buffers(/*recurse=*/true)) out.emplace_back(item.key(), item.value());
  return out;
}

std::string shape_text(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// "a, b, c and 4 more": a list short enough for one error line.
std::string some_names(const std::vector<std::string>& names) {
  constexpr std::size_t kShown = 4;
  std::string text;
  for (std::size_t i = 0; i < names.size() && i < kShown; ++i) text += (i == 0 ? "" : ", ") + names[i];
  if (names.size() > kShown) text += " and " + std::to_string(names.size() - kShown) + " more";
  return text;
}

// Every difference between the file and the policy, or "" when they fit:
// the first mismatched shape in model order (both shapes), then missing and
// unexpected names.
std::string compare_tensors(const TensorMap& saved, const NamedTensors& wanted) {
  std::vector<std::string> mismatched, missing, unexpected;
  std::set<std::string> wanted_names;
  std::string first;
  for (const auto& [name, tensor] : wanted) {
    wanted_names.insert(name);
    const auto it = saved.find(name);
    if (it == saved.end()) {
      missing.push_back(name);
    } else if (it->second.sizes() != tensor.sizes()) {
      if (mismatched.empty())
        first = "tensor '" + name + "' is " + shape_text(it->second) + " in the file but " + shape_text(tensor) +
                " in the configured model";
      mismatched.push_back(name);
    }
  }
  for (const auto& [name, tensor] : saved)
    if (!wanted_names.count(name)) unexpected.push_back(name);
  std::string text = first;
  const auto add = [&text](const std::string& part) { text += (text.empty() ? "" : "; ") + part; };
  if (mismatched.size() > 1) add(std::to_string(mismatched.size() - 1) + " more tensor(s) differ in shape");
  if (!missing.empty()) add("missing from the file: " + some_names(missing));
  if (!unexpected.empty()) add("not in the configured model: " + some_names(unexpected));
  return text;
}

}  // namespace

void load_policy(model::Policy policy, const std::string& path) {
  if (!std::filesystem::exists(path))
    throw Error("base policy '" + path + "' does not exist (run `moerl pretrain` first, or drop --init)");
  TensorMap saved;
  try {
    torch::serialize::InputArchive archive;
    archive.load_from(path);
    read_saved_tensors(archive, "", saved);
  } catch (const c10::Error& error) {
    throw Error("cannot load policy weights from '" + path + "': " + error.what_without_backtrace());
  }
  // A policy with split experts takes its rows of the file's whole expert tensors.
  const ExpertLayout layout = expert_layout(*policy);
  if (layout.members > 1)
    for (const TrainedArray& array : trained_arrays(*policy, nullptr)) {
      const auto it = saved.find(array.name.substr(std::string("model/").size()));
      if (array.expert_rows && it != saved.end() && it->second.dim() > 0 && it->second.size(0) == layout.experts)
        it->second = it->second.narrow(0, layout.rows.first, layout.rows.count);
    }
  // Check everything before copying anything, so a misfit leaves the policy as it was.
  const NamedTensors wanted = policy_tensors(policy);
  if (const std::string problems = compare_tensors(saved, wanted); !problems.empty())
    throw Error("cannot load policy weights from '" + path + "': they do not fit the configured [model]/[moe]" +
                (layout.members > 1 ? " (this learner is " + layout.text() + ")" : std::string()) + ": " + problems);
  torch::NoGradGuard no_grad;
  for (const auto& [name, tensor] : wanted) tensor.copy_(saved.at(name));
}

}  // namespace moerl::learner
