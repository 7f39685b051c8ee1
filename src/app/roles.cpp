#include "moerl/app/roles.h"

#include <spdlog/spdlog.h>

#include <chrono>
#include <thread>

#include "moerl/app/group_communicators.h"
#include "moerl/comm/communicator_expert_exchange.h"
#include "moerl/comm/mpi_communicator.h"
#include "moerl/core/join.h"
#include "moerl/env/env_release.h"
#include "moerl/env/env_worker.h"
#include "moerl/model/hf_policy_loader.h"
#include "moerl/learner/learner.h"
#include "moerl/learner/pretrain.h"
#include "moerl/model/param_report.h"
#include "moerl/model/precision.h"
#include "moerl/rollout/actor.h"
#include "moerl/runtime/env_join.h"
#include "moerl/runtime/fault_plan.h"
#include "moerl/runtime/metrics_report.h"
#include "moerl/sync/module_weights.h"

namespace moerl::app {
namespace {

bool nccl_wanted(const config::Config& config) { return config.run.collectives == config::RunCollectives::Auto; }

// The CUDA device index make_group_communicator takes: -1 on the CPU.
int cuda_index(const runtime::DeviceChoice& device) { return device.cuda ? device.index : -1; }

// Every rank builds the same initial policy: same seed, the same file, or
// the same Hugging Face model ([model] source = "hf:DIR"). With an expert
// group, this member's share of it (policy.h: a split policy drawn from the
// seed is the slice of the whole one).
model::Policy make_policy(const config::Config& config, const std::string& init_path,
                          const std::shared_ptr<moe::ExpertExchange>& expert_group = nullptr) {
  torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
  model::Policy policy{nullptr};
  if (hf::hf_directory(config.model.source).empty()) {
    policy = model::Policy(config.model, config.moe, expert_group);
  } else {
    policy = model::load_hf_policy(config.model, config.moe);
    // The Hugging Face loader builds the whole model; a member keeps its share.
    if (expert_group) policy = model::share_of(*policy, expert_group);
  }
  if (!init_path.empty()) learner::load_policy(policy, init_path);
  return policy;
}

// [cluster] / [rollout] expert_parallel > 1: a learner's or actor's expert
// group (whose exchanges carry the MoE layers' rows) and its replicas (the
// ranks of its role holding the same share).
struct ExpertGroups {
  std::unique_ptr<comm::Communicator> group;
  std::unique_ptr<comm::Communicator> replicas;
  std::shared_ptr<moe::ExpertExchange> exchange;
};

ExpertGroups expert_groups(const config::Config& config, const runtime::World& world,
                           const runtime::DeviceChoice& device) {
  ExpertGroups groups;
  if (world.expert_comm() == MPI_COMM_NULL) return groups;
  // NCCL where the group may use it: the layer hands the exchanges host
  // rows (moe/expert_parallel.cpp), which an NCCL communicator stages on its
  // device, as it does the members' host counts.
  groups.group = make_group_communicator(world.expert_comm(), "expert group", cuda_index(device),
                                         world.placement_host(), nccl_wanted(config));
  groups.replicas = make_group_communicator(world.expert_replica_comm(), "expert replicas", cuda_index(device),
                                            world.placement_host(), nccl_wanted(config));
  groups.exchange = std::make_shared<comm::CommunicatorExpertExchange>(*groups.group, config.cluster.message_timeout_s);
  return groups;
}

torch::Device torch_device(const runtime::DeviceChoice& choice) {
  return choice.cuda ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(choice.index))
                     : torch::Device(torch::kCPU);
}

// rollout.moe_top_k: the actors route with another k than the learner
// trains with. Said once, by learner 0, for the job.
void note_rollout_experts(const config::Config& config) {
  const std::int64_t k = config.rollout.moe_top_k;
  if (k == 0 || k == config.moe.top_k) return;
  spdlog::warn(
      "rollout.moe_top_k = {}: actors route each token to {} expert(s), the learner trains with moe.top_k = {}{}; "
      "behaviour log-probs differ from the trained routing (the learner's importance weights correct for that); "
      "no routing replay, and no router-disagreement check (learner.router_disagreement): it compares routings "
      "of the same k",
      k, k, config.moe.top_k, hf::hf_directory(config.model.source).empty() ? "" : " (config.json's)");
}

// After a role's own work, wait for learner 0's Stop so that every rank
// leaves together (a bounded wait: a lost learner 0 must not hang us).
void wait_for_stop(runtime::StopCoordinator& stop, double timeout_s, const std::string& who) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (!stop.should_stop()) {
    if (std::chrono::steady_clock::now() > deadline)
      throw runtime::TimeoutError(who + ": learner 0 did not end the job within " + std::to_string(timeout_s) + " s");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

}  // namespace

int run_role(const config::Config& config, const runtime::World& world, runtime::Mailbox& mailbox,
             runtime::StopCoordinator& stop, const runtime::DeviceChoice& device_choice, const std::string& init_path,
             const std::string& resume, runtime::HeartbeatThread* heartbeat) {
  const double final_wait_s = 20 * config.cluster.message_timeout_s;
  switch (world.role()) {
    case runtime::Role::EnvWorker: {
      env::SessionHost host(env::session_host_options(config, world.compute_threads()));
      env::EnvWorkerService service(host, mailbox);
      runtime::MetricsReporter reporter(mailbox, config.telemetry.metrics_interval_s);
      env::ReleaseOnSignal release(mailbox, stop, config.cluster.message_timeout_s);
      bool leave = false;
      service.serve([&] {
        if (service.replies_sent() > 0) reporter.send_first_news();
        reporter.maybe_send();
        if (const double slow = runtime::fault_hooks().slow_ms.load(); slow > 0)
          std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(slow));
        if (heartbeat) heartbeat->load().live_sessions = static_cast<std::int32_t>(host.live_sessions());
        leave = release.released();
        return leave || stop.should_stop();
      });
      // Said louder by a worker that joined the running job: an operator asked for it (`moerl ctl add-env`).
      spdlog::log(world.joined() ? spdlog::level::warn : spdlog::level::info, "{}{}: sent {} replies to actors",
                  world.role_label(), world.joined() ? " (joined during the run)" : "", service.replies_sent());
      if (leave) env::leave_job_released(world.role_label());
      return 0;
    }
    case runtime::Role::Actor:
    case runtime::Role::StandbyActor: {
      // A standby actor runs the actor in standby mode: it keeps its weights
      // current and takes a lost actor's place when learner 0 says one was lost.
      ExpertGroups experts = expert_groups(config, world, device_choice);
      model::Policy policy = make_policy(config, init_path, experts.exchange);
      policy->eval();
      torch::NoGradGuard no_grad;
      const torch::Device device = torch_device(device_choice);
      // [run] device and dtype: the policy is built and loaded on the host
      // (every rank alike), then moved once. An actor's takes run.dtype
      // directly (it has no master copy); a learner's stays float32 (its
      // master weights; the Learner computes on a bf16 copy when asked).
      policy->to(device, model::compute_dtype(config.run.dtype));
      std::unique_ptr<comm::Communicator> sync_comm =
          make_group_communicator(world.sync_comm(), "weight-sync group", cuda_index(device_choice),
                                  world.placement_host(), nccl_wanted(config));
      rollout::Actor actor(rollout::actor_settings(config), world, mailbox, policy, *sync_comm,
                           heartbeat ? &heartbeat->load() : nullptr, world.role() == runtime::Role::StandbyActor);
      if (experts.exchange) actor.use_expert_group(*experts.group);
      // With learner 0 (its Coordinator holds the other end): spawning env
      // workers that join the running job (`moerl ctl add-env`).
      runtime::EnvJoinService joins(mailbox, world.join_comm(), world.size());
      actor.run(stop);
      wait_for_stop(stop, final_wait_s, world.role_label());
      return 0;
    }
    case runtime::Role::Learner: {
      ExpertGroups experts = expert_groups(config, world, device_choice);
      model::Policy policy = make_policy(config, init_path, experts.exchange);
      if (world.is_coordinator()) {
        const model::ParameterReport params = model::parameter_report(*policy);
        std::printf("%s\n", params.format().c_str());
        note_rollout_experts(config);
      }
      const torch::Device device = torch_device(device_choice);
      policy->to(device);
      // Control collectives (counts, decisions) stay on MPI and host memory;
      // the gradients go over NCCL where the learners have GPUs of their own.
      comm::MpiCommunicator learner_comm(world.role_comm(), "learner group");
      std::unique_ptr<comm::Communicator> gradient_comm =
          make_group_communicator(world.role_comm(), "learner gradient group", cuda_index(device_choice),
                                  world.placement_host(), nccl_wanted(config));
      std::unique_ptr<comm::Communicator> sync_comm;
      if (world.is_coordinator())
        sync_comm = make_group_communicator(world.sync_comm(), "weight-sync group", cuda_index(device_choice),
                                            world.placement_host(), nccl_wanted(config));
      learner::Learner learner(learner::learner_settings(config), world, mailbox, policy, learner_comm, sync_comm.get(),
                               resume, world.is_coordinator() ? heartbeat : nullptr);
      if (experts.exchange) learner.use_expert_groups(*experts.group, *experts.replicas);
      learner.use_gradient_communicator(*gradient_comm);
      learner.run(stop);
      if (world.is_coordinator()) {
        stop.request_stop("training complete");
      } else {
        wait_for_stop(stop, final_wait_s, world.role_label());
      }
      if (!learner.job_failure().empty()) {
        std::fprintf(stderr, "moerl: the job stopped on rank %d (%s): %s\n", world.rank(), world.role_label().c_str(),
                     learner.job_failure().c_str());
        return learner.job_failure_status();
      }
      return 0;
    }
  }
  return 1;
}

int run_pretrain_command(const config::Config& config, const std::string& init_path) {
  torch::manual_seed(static_cast<std::uint64_t>(config.run.seed));
  model::Policy policy(config.model, config.moe);
  std::printf("%s\n", model::parameter_report(*policy).format().c_str());
  if (!init_path.empty()) {
    learner::load_policy(policy, init_path);
    std::printf("pretrain: continuing from %s\n", init_path.c_str());
  }
  const std::vector<learner::PretrainSettings> stages = learner::pretrain_stages(learner::pretrain_settings(config));
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages.size() > 1)
      std::printf("pretrain stage %zu of %zu: %s, %lld steps\n", i + 1, stages.size(),
                  join(stages[i].env.families, ", ").c_str(), static_cast<long long>(stages[i].pretrain.steps));
    const learner::PretrainReport report = learner::pretrain(stages[i], policy);
    std::printf("pretrain: %lld steps in %.0f s, loss %.3f -> %.3f, action-token accuracy %.1f%%; saved %s\n",
                static_cast<long long>(report.steps), report.wall_s, report.first_loss, report.final_loss,
                100 * report.final_accuracy, report.path.c_str());
  }
  return 0;
}

}  // namespace moerl::app
