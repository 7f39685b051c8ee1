// Env workers under mpirun (rank 0 plays the actor, ranks 1..N-1 are env
// workers): many concurrent sessions complete despite injected hangs and
// crashes; a permanently failing step is recorded and the run goes on; an
// external process that dies mid-episode is restarted; a session snapshotted
// on one worker continues on another.

#include <catch2/catch.hpp>
#include <mpi.h>

#include <unistd.h>

#include <filesystem>

#include "moerl/env/env_worker.h"
#include "moerl/env/task_family.h"

using namespace moerl::env;
using moerl::runtime::Mailbox;

namespace {

struct Cluster {
  MPI_Comm comm = MPI_COMM_NULL;
  std::unique_ptr<Mailbox> mailbox;
  int rank = 0, size = 0;
  explicit Cluster() {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    mailbox = std::make_unique<Mailbox>(comm, 30.0);
    rank = mailbox->rank();
    size = mailbox->size();
  }
  ~Cluster() {
    mailbox.reset();
    MPI_Barrier(comm);
    MPI_Comm_free(&comm);
  }
  std::vector<int> workers() const {
    std::vector<int> w;
    for (int r = 1; r < size; ++r) w.push_back(r);
    return w;
  }
};

// Workers serve until rank 0 sends Stop; rank 0 runs `drive`.
template <typename Drive>
void run_cluster(Cluster& cluster, const SessionHostOptions& options, Drive drive) {
  if (cluster.rank == 0) {
    drive(*cluster.mailbox);
    for (int w : cluster.workers()) cluster.mailbox->send(w, moerl::runtime::Stop{"test done", {}});
  } else {
    SessionHost host(options);
    EnvWorkerService service(host, *cluster.mailbox);
    service.serve([&] { return cluster.mailbox->try_receive<moerl::runtime::Stop>(0).has_value(); });
  }
}

SessionHostOptions worker_options() {
  SessionHostOptions options;
  options.threads = 2;
  options.env.timeout_s = 0.5;
  options.env.max_retries = 3;
  options.env.retry_backoff_s = 0.01;
  options.archive_dir = (std::filesystem::temp_directory_path() / "moerl-mpi-archive").string();
  options.external.command = std::string("python3 ") + MOERL_SOURCE_DIR + "/examples/external_env/reach_env.py";
  return options;
}

}  // namespace

TEST_CASE("many concurrent sessions complete despite injected hangs and crashes", "[envworker]") {
  Cluster cluster;
  SessionHostOptions options = worker_options();
  options.faults.env_crash_rate = 0.05;
  options.faults.env_hang_rate = 0.03;
  options.faults.env_hang_s = 1.5;
  options.faults.env_fault_attempts = 1;
  options.faults.env_fault_seed = 5;
  run_cluster(cluster, options, [&](Mailbox& mailbox) {
    EnvClient client(mailbox, cluster.workers());
    std::map<std::uint64_t, std::unique_ptr<Environment>> mirrors;  // the expert's view of each session
    std::vector<std::string> families;
    for (const TaskFamily& f : builtin_families()) families.push_back(f.name);
    const int sessions = 60;
    for (std::uint64_t s = 0; s < sessions; ++s) {
      TaskSpec task;
      task.family = families[s % families.size()];
      task.seed = 100 + s;
      task.difficulty = 2;
      mirrors[s] = make_builtin_environment(task.family);
      mirrors[s]->open(task);
      client.open(s, task);
    }
    int completed = 0, succeeded = 0, retried_steps = 0;
    while (completed < sessions) {
      const EnvReply reply = client.wait(30.0);
      REQUIRE(reply.ok);
      if (reply.kind == RequestKind::Close) {
        ++completed;
        continue;
      }
      if (reply.attempts > 1) ++retried_steps;
      Environment& mirror = *mirrors[reply.session];
      if (reply.kind == RequestKind::Step) {
        CHECK(reply.turn == mirror.turns_taken());
        CHECK(reply.done == mirror.done());
      }
      if (reply.done) {
        succeeded += reply.success;
        client.close(reply.session);
        continue;
      }
      const std::string action = mirror.expert_action(0.0, reply.session * 31 + reply.turn);
      mirror.step(action);
      client.step(reply.session, action);
    }
    CHECK(completed == sessions);
    CHECK(succeeded == sessions);  // the faults cost retries, never an episode
    CHECK(retried_steps > 0);
  });
}

TEST_CASE("a permanently failing step is recorded and other sessions go on", "[envworker]") {
  Cluster cluster;
  SessionHostOptions options = worker_options();
  options.env.max_retries = 1;
  options.faults.env_crash_rate = 1.0;
  options.faults.env_fault_attempts = 1000;
  run_cluster(cluster, options, [&](Mailbox& mailbox) {
    EnvClient client(mailbox, cluster.workers());
    TaskSpec task;
    task.family = "guess";
    task.seed = 1;
    client.open(1, task);
    REQUIRE(client.wait(30.0).ok);
    client.step(1, "guess 5");
    const EnvReply failed = client.wait(30.0);
    CHECK_FALSE(failed.ok);
    CHECK(failed.done);
    CHECK(failed.attempts == 2);
    CHECK_THAT(failed.error, Catch::Contains("step failed after 2 attempts"));
    // The worker still serves: a new session opens fine.
    client.open(2, task);
    CHECK(client.wait(30.0).ok);
    // Elastic capacity: learner 0 shrinks the workers to 1 live session each
    // (session 2 is live on the worker that would take the third).
    for (int w : cluster.workers()) mailbox.send(w, EnvCapacityMessage{1});
    TaskSpec other = task;
    const std::uint64_t third = 2 + cluster.workers().size();  // same worker as session 2
    bool refused = false;
    for (int tries = 0; tries < 50 && !refused; ++tries) {  // the capacity message may land after the open
      client.open(third, other);
      const EnvReply reply = client.wait(30.0);
      refused = !reply.ok && reply.error.find("at capacity (1 sessions") != std::string::npos;
      if (reply.ok) {
        client.close(third);
        client.wait(30.0);
        usleep(20000);
      }
    }
    CHECK(refused);
  });
}

TEST_CASE("an external process that dies mid-episode is restarted and the episode finishes", "[envworker]") {
  Cluster cluster;
  SessionHostOptions options = worker_options();
  const auto marker = std::filesystem::temp_directory_path() / ("moerl-mpi-marker-" + std::to_string(getpid()));
  std::filesystem::remove(marker);
  options.external.command += " --crash-at-turn 2 --marker " + marker.string();
  std::string marker_path = marker.string();
  run_cluster(cluster, options, [&](Mailbox& mailbox) {
    EnvClient client(mailbox, {cluster.workers().front()});
    TaskSpec task;
    task.family = "external";
    task.seed = 9;
    task.difficulty = 1;
    client.open(1, task);
    REQUIRE(client.wait(30.0).ok);
    int restarts = 0;
    EnvReply reply;
    for (int turn = 0; turn < 20; ++turn) {
      client.step(1, "add 1");
      reply = client.wait(30.0);
      REQUIRE(reply.ok);
      restarts += reply.attempts > 1;
      if (reply.done) break;
    }
    CHECK(reply.done);
    CHECK(restarts == 1);
  });
  if (cluster.rank == 1) CHECK(std::filesystem::exists(marker_path));
}

TEST_CASE("a session snapshotted on one worker continues on another", "[envworker]") {
  Cluster cluster;
  REQUIRE(cluster.size >= 3);
  run_cluster(cluster, worker_options(), [&](Mailbox& mailbox) {
    EnvClient client(mailbox, cluster.workers());
    TaskSpec task;
    task.family = "arithmetic";
    task.seed = 12;
    task.difficulty = 3;
    auto mirror = make_builtin_environment("arithmetic");
    mirror->open(task);
    const std::uint64_t session = 2;  // lives on worker index session % 2 = 0 (rank 1)
    REQUIRE(client.worker_of(session) == 1);
    client.open(session, task);
    REQUIRE(client.wait(30.0).ok);
    for (int k = 0; k < 2 && !mirror->done(); ++k) {
      const std::string action = mirror->expert_action(0.0, 77 + k);
      mirror->step(action);
      client.step(session, action);
      REQUIRE(client.wait(30.0).ok);
    }
    client.snapshot(session, true);
    const EnvReply snapped = client.wait(30.0);
    REQUIRE(snapped.ok);
    client.close(session);
    REQUIRE(client.wait(30.0).kind == RequestKind::Close);
    client.restore_from_archive(session, snapped.archive_path, 1);  // rank 2
    REQUIRE(client.worker_of(session) == 2);
    REQUIRE(client.wait(30.0).ok);
    for (int k = 0; !mirror->done() && k < 100; ++k) {
      const std::string action = mirror->expert_action(0.0, 500 + k);
      const StepResult expected = mirror->step(action);
      client.step(session, action);
      const EnvReply reply = client.wait(30.0);
      REQUIRE(reply.ok);
      CHECK(reply.observation == expected.observation);
      CHECK(reply.reward == expected.reward);
    }
    CHECK(mirror->succeeded());
  });
}
