#pragma once
// This rank's compute device for `moerl train`: [run] device through the rule
// of runtime/compute_device.h, checked against what LibTorch can use. Kept
// free of LibTorch headers, like roles.h: the app's start-up code includes it.

#include <string>

#include "moerl/config/config.h"
#include "moerl/runtime/compute_device.h"
#include "moerl/runtime/world.h"

namespace moerl::app {

struct RankDevice {
  runtime::DeviceChoice device;  // the CPU when error is set
  // Empty when the device is usable; else why not, naming run.device (with
  // its file and line), the rank, its role and its host.
  std::string error;
};

// Asks LibTorch how many CUDA devices this process sees and, for a CUDA
// choice, allocates on the device once: a LibTorch built without CUDA, no
// visible device or a device that cannot allocate is an error here, before
// the rank does any work (run_roles stops the job with status 2, like a
// configuration error).
RankDevice resolve_rank_device(const config::Config& config, const runtime::World& world);

}  // namespace moerl::app
