// [run] device: which device each rank computes on, from its role, its local
// rank and the devices LibTorch sees (runtime/compute_device.h).

#include <catch2/catch.hpp>

#include "moerl/runtime/compute_device.h"

using moerl::config::RunDevice;
using moerl::runtime::choose_device;
using moerl::runtime::DeviceChoice;
using moerl::runtime::launcher_local_rank;
using moerl::runtime::Role;

TEST_CASE("device = cpu puts every role on the CPU, whatever the devices", "[device]") {
  for (Role role : {Role::Learner, Role::Actor, Role::EnvWorker, Role::StandbyActor})
    for (int devices : {0, 1, 8}) {
      const auto choice = choose_device(RunDevice::Cpu, role, 3, devices);
      REQUIRE(choice.has_value());
      CHECK(choice->label() == "cpu");
    }
}

TEST_CASE("device = cuda: learners and actors take cuda:(local rank % devices), env workers the CPU", "[device]") {
  CHECK(choose_device(RunDevice::Cuda, Role::Learner, 0, 1)->label() == "cuda:0");
  CHECK(choose_device(RunDevice::Cuda, Role::Actor, 1, 1)->label() == "cuda:0");  // ranks share the one device
  CHECK(choose_device(RunDevice::Cuda, Role::Actor, 5, 4)->label() == "cuda:1");
  CHECK(choose_device(RunDevice::Cuda, Role::StandbyActor, 7, 8)->label() == "cuda:7");
  CHECK(choose_device(RunDevice::Cuda, Role::Learner, 8, 8)->label() == "cuda:0");
  // A negative local rank (none known) counts as 0.
  CHECK(choose_device(RunDevice::Cuda, Role::Learner, -1, 2)->label() == "cuda:0");
  const auto env = choose_device(RunDevice::Cuda, Role::EnvWorker, 2, 4);
  REQUIRE(env.has_value());
  CHECK(*env == DeviceChoice{});
  // The same rule on every host: 2 hosts x 4 ranks, 4 devices each.
  for (int local = 0; local < 4; ++local) CHECK(choose_device(RunDevice::Cuda, Role::Actor, local, 4)->index == local);
}

TEST_CASE("device = cuda without a visible device: no choice for learners and actors, env workers unaffected",
          "[device]") {
  CHECK_FALSE(choose_device(RunDevice::Cuda, Role::Learner, 0, 0).has_value());
  CHECK_FALSE(choose_device(RunDevice::Cuda, Role::Actor, 2, 0).has_value());
  CHECK_FALSE(choose_device(RunDevice::Cuda, Role::StandbyActor, 0, -1).has_value());
  CHECK(choose_device(RunDevice::Cuda, Role::EnvWorker, 0, 0).has_value());
}

TEST_CASE("the local rank comes from Open MPI, then Slurm; garbage counts as unset", "[device]") {
  CHECK(launcher_local_rank("3", "1") == 3);
  CHECK(launcher_local_rank(nullptr, "1") == 1);
  CHECK(launcher_local_rank("", "2") == 2);
  CHECK(launcher_local_rank("x", "2") == 2);
  CHECK(launcher_local_rank("-1", nullptr) == std::nullopt);
  CHECK(launcher_local_rank("4x", nullptr) == std::nullopt);
  CHECK(launcher_local_rank(nullptr, nullptr) == std::nullopt);
  CHECK(launcher_local_rank("99999999999", nullptr) == std::nullopt);
}
