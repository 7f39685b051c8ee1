// Role assignment and role communicators on a real 4-rank world
// (1 learner, 2 actors, 1 env worker): every rank checks what it ends with.

#include <catch2/catch.hpp>
#include <mpi.h>

#include <algorithm>
#include <vector>

#include "moerl/config/config.h"
#include "moerl/runtime/world.h"
#include "moerl/setup/config_loading.h"

using namespace moerl::runtime;

TEST_CASE("each rank gets its role and the right communicators", "[world]") {
  const auto config =
      moerl::setup::load_config_text("[cluster]\nlearners = 1\nactors = 2\nenv_workers = 1\n", "world.toml");
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  REQUIRE(size == 4);
  World world(config, MPI_COMM_WORLD);
  const Role expected[] = {Role::Learner, Role::Actor, Role::Actor, Role::EnvWorker};
  CHECK(world.role() == expected[world.rank()]);
  CHECK(world.is_coordinator() == (world.rank() == 0));

  int role_size = 0, role_rank = -1;
  MPI_Comm_size(world.role_comm(), &role_size);
  MPI_Comm_rank(world.role_comm(), &role_rank);
  CHECK(role_size == (world.role() == Role::Actor ? 2 : 1));
  CHECK(role_rank == world.role_index());

  // The sync group is learner 0 plus the actors; the env worker is outside it.
  if (world.role() == Role::EnvWorker) {
    CHECK(world.sync_comm() == MPI_COMM_NULL);
  } else {
    REQUIRE(world.sync_comm() != MPI_COMM_NULL);
    int sync_size = 0;
    MPI_Comm_size(world.sync_comm(), &sync_size);
    CHECK(sync_size == 3);
    // A broadcast from learner 0 over the sync group reaches exactly the actors.
    int value = world.rank() == 0 ? 1234 : 0;
    MPI_Bcast(&value, 1, MPI_INT, 0, world.sync_comm());
    CHECK(value == 1234);
  }
  CHECK(world.ranks_on_host() == 4);
  CHECK(world.compute_threads() >= 1);
  // One host: the local ranks (mpiexec's OMPI_COMM_WORLD_LOCAL_RANK, else the
  // place among the host's ranks) are 0..3, one each, so [run] device = "cuda"
  // spreads the 4 ranks over the host's devices. (Open MPI 5 need not number
  // them in rank order.)
  int local[4] = {-1, -1, -1, -1};
  const int mine = world.local_rank();
  MPI_Allgather(&mine, 1, MPI_INT, local, 1, MPI_INT, MPI_COMM_WORLD);
  std::sort(local, local + 4);
  CHECK(std::vector<int>(local, local + 4) == std::vector<int>{0, 1, 2, 3});
}
