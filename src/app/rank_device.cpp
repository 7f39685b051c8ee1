#include "moerl/app/rank_device.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <cstdlib>

namespace moerl::app {
namespace {

// LibTorch's own reason why it cannot allocate on `device` ("" when it can):
// its words tell a CPU-only build ("not linked with support for cuda", or no
// CUDA backend for the operator) from a driver or visibility problem.
std::string allocation_failure(const torch::Device& device) {
  try {
    const torch::Tensor probe = torch::zeros({1}, torch::TensorOptions().device(device));
    (void)probe.sum().item<float>();
    return "";
  } catch (const c10::Error& error) {
    std::string reason = error.what_without_backtrace();
    // A CPU-only LibTorch answers with its dispatcher's list of backends; say what that means.
    for (const char* cpu_only : {"'CUDA' backend", "not compiled with CUDA", "not linked with support for cuda"})
      if (reason.find(cpu_only) != std::string::npos) return "this LibTorch is built without CUDA";
    // Else LibTorch's first sentence (a CUDA error: driver, visibility, memory).
    if (const auto end = reason.find_first_of(".\n"); end != std::string::npos) reason.resize(end);
    return reason.empty() ? "LibTorch could not allocate on it" : reason;
  } catch (const std::exception& error) {
    return error.what();
  }
}

std::string visible_devices_note() {
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  return visible == nullptr ? "CUDA_VISIBLE_DEVICES unset" : "CUDA_VISIBLE_DEVICES=\"" + std::string(visible) + "\"";
}

}  // namespace

RankDevice resolve_rank_device(const config::Config& config, const runtime::World& world) {
  RankDevice result;
  const bool wants_cuda = config.run.device == config::RunDevice::Cuda && world.role() != runtime::Role::EnvWorker;
  const int visible = wants_cuda ? static_cast<int>(torch::cuda::device_count()) : 0;
  const std::optional<runtime::DeviceChoice> choice =
      runtime::choose_device(config.run.device, world.role(), world.local_rank(), visible);
  const std::string who = "rank " + std::to_string(world.rank()) + " (" + world.role_label() + ") on host " +
                          world.hostname() + " (local rank " + std::to_string(world.local_rank()) + ")";
  std::string problem;
  if (!choice) {
    problem = who + " has no usable CUDA device: " + allocation_failure(torch::Device(torch::kCUDA, 0)) +
              " (LibTorch sees no CUDA device; " + visible_devices_note() + ")";
  } else if (choice->cuda) {
    const std::string failure =
        allocation_failure(torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(choice->index)));
    if (!failure.empty()) problem = who + " cannot use " + choice->label() + ": " + failure;
    result.device = *choice;
  }
  if (!problem.empty()) {
    result.device = runtime::DeviceChoice{};
    result.error = config
                       .issue("run.device", problem +
                                                "; set run.device = \"cpu\" (--set run.device=cpu) or run "
                                                "the learners and actors on hosts with a CUDA device")
                       .text();
  }
  return result;
}

}  // namespace moerl::app
