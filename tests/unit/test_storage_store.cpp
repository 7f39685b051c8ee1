// The checkpoint store: atomic versions, crashes at every save point, sharded
// versions, tags, rollback, retention, resume fallback, export and archive.

#include <catch2/catch.hpp>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "temp_dir.h"
#include "moerl/storage/archive.h"
#include "moerl/storage/atomic_file.h"
#include "moerl/storage/checkpoint_store.h"
#include "moerl/storage/file_lock.h"

namespace fs = std::filesystem;
using namespace moerl::storage;

namespace {

using moerl_test::TempDir;

// Writes version `version` as `shards` shards: rank r holds model/w<r> = version + r.
void save(CheckpointStore& store, std::int64_t version, int shards = 1, bool complete = true) {
  for (int rank = 0; rank < shards; ++rank) {
    auto writer = store.shard_writer(version, rank, shards);
    const std::vector<float> w(16, static_cast<float>(version + rank));
    writer->add_array("model/w" + std::to_string(rank), DType::Float32, {4, 4}, w.data(), w.size() * 4);
    const std::vector<double> m(8, 0.5);
    writer->add_array("optimizer/m" + std::to_string(rank), DType::Float64, {8}, m.data(), m.size() * 8);
    writer->set_attribute(attribute_key::kLearnerStep, version * 10);
    writer->set_attribute(attribute_key::kPolicyVersion, version);
    writer->set_attribute("metric.reward_mean", 0.1 * static_cast<double>(version));
    writer->commit();
  }
  if (complete) store.complete_version(version, shards);
}

void corrupt_data(const std::string& path) {
  // The data of the small datasets sits after the superblock; flipping bytes
  // across the middle of the file reliably hits data or metadata.
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  const auto size = static_cast<std::streamoff>(fs::file_size(path));
  for (std::streamoff at = size / 3; at < size * 2 / 3; at += 7) {
    f.seekp(at);
    f.put('\x7f');
  }
}

}  // namespace

TEST_CASE("a saved version is complete, valid and latest", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  save(store, 1);
  save(store, 2);
  CHECK(store.versions() == std::vector<std::int64_t>{1, 2});
  CHECK(store.latest() == 2);
  CHECK(store.verify(2).valid);
  const auto infos = store.list();
  REQUIRE(infos.size() == 2);
  CHECK(infos[1].valid);
  CHECK(infos[1].is_latest);
  CHECK(infos[1].learner_step == 20);
  CHECK(infos[1].metrics.at("reward_mean") == Approx(0.2));
  CHECK(infos[1].bytes > 0);
  const CheckpointReader shard = store.open_shard(2, 0);
  CHECK(shard.read("model/w0").size() == 64);
  CHECK(store.resume_choice().version == 2);
  CHECK(store.resolve("latest") == 2);
  CHECK(store.resolve("v000001") == 1);
  CHECK(store.resolve("2") == 2);
  CHECK_THROWS_WITH(store.resolve("nosuchtag"), Catch::Contains("neither a version nor a tag"));
  CHECK_THROWS_WITH(CheckpointStore(dir.file("absent")).versions(), Catch::Contains("does not exist"));
}

TEST_CASE("a crash at each save point leaves the previous version in use", "[storage]") {
  for (FaultPoint point :
       {FaultPoint::AfterData, FaultPoint::BeforeRename, FaultPoint::BeforeIndex, FaultPoint::BeforeLatest}) {
    for (FaultAction action : {FaultAction::Throw, FaultAction::Exit}) {
      DYNAMIC_SECTION(fault_point_name(point) << (action == FaultAction::Exit ? ":exit" : ":throw")) {
        TempDir dir;
        {
          CheckpointStore store(dir.file("ckpt"));
          save(store, 1, 2);
        }
        StoreOptions options;
        options.faults = FaultInjection{point, action};
        CheckpointStore faulty(dir.file("ckpt"), options);
        if (action == FaultAction::Throw) {
          CHECK_THROWS_AS(save(faulty, 2, 2), InjectedFault);
        } else {
          const pid_t child = ::fork();
          REQUIRE(child >= 0);
          if (child == 0) {
            try {
              save(faulty, 2, 2);
            } catch (...) {
            }
            ::_exit(1);  // only reached when the fault did not fire
          }
          int status = 0;
          REQUIRE(::waitpid(child, &status, 0) == child);
          REQUIRE(WIFEXITED(status));
          CHECK(WEXITSTATUS(status) == kFaultExitStatus);
        }
        CheckpointStore store(dir.file("ckpt"));
        CHECK(store.latest() == 1);
        CHECK(store.verify(1).valid);
        CHECK(store.resume_choice().version == 1);
        // Resume says what it passed over: a newer whole or partial v2, or a
        // killed writer's temporary shard (a thrown fault cleans up after itself).
        const ResumeChoice resumed = store.resume_choice();
        if (point == FaultPoint::BeforeLatest || point == FaultPoint::BeforeIndex) {
          REQUIRE(resumed.passed_over.size() == 1);
          CHECK(resumed.passed_over[0].first == 2);
          CHECK_THAT(resumed.passed_over[0].second,
                     Catch::Contains(point == FaultPoint::BeforeLatest ? "`latest` names v000001" : "incomplete"));
        } else {
          CHECK(resumed.passed_over.empty());
        }
        const bool killed_mid_shard =
            action == FaultAction::Exit && (point == FaultPoint::AfterData || point == FaultPoint::BeforeRename);
        REQUIRE(resumed.interrupted_saves.size() == (killed_mid_shard ? 1u : 0u));
        if (killed_mid_shard) {
          CHECK_THAT(resumed.interrupted_saves[0], Catch::StartsWith(".v000002.rank0.h5.tmp."));
          CHECK_THAT(resumed.describe(), Catch::Contains("an interrupted save left"));
        }
        CHECK(resumed.noteworthy() == (killed_mid_shard || !resumed.passed_over.empty()));
        const ResumeChoice newest = store.newest_valid();
        if (point == FaultPoint::BeforeLatest) {
          // The index is the commit point: v2 is whole, only `latest` did not move yet.
          CHECK(newest.version == 2);
        } else if (point != FaultPoint::BeforeIndex) {
          // The shard never left its hidden temporary name: v2 does not exist.
          CHECK(newest.version == 1);
          CHECK(newest.skipped.empty());
          CHECK(store.versions() == std::vector<std::int64_t>{1});
        } else {
          CHECK(newest.version == 1);
          REQUIRE(newest.skipped.size() == 1);
          CHECK(newest.skipped[0].first == 2);
          CHECK_THAT(newest.skipped[0].second, Catch::Contains("incomplete"));
          CHECK_FALSE(store.verify(2).valid);
        }
        // Retention clears what the crash left, never v1.
        store.apply_retention(1);
        CHECK(store.verify(1).valid);
        for (const auto& entry : fs::directory_iterator(dir.file("ckpt"))) {
          CHECK_FALSE(is_temporary_name(entry.path().filename().string()));
        }
      }
    }
  }
}

TEST_CASE("a sharded version is incomplete without every shard", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  save(store, 1, 3);
  CHECK(store.verify(1).valid);
  CHECK(store.num_shards(1) == 3);
  CHECK(store.open_shard(1, 2).read("model/w2").size() == 64);
  CHECK_THROWS_WITH(store.open_shard(1, 3), Catch::Contains("rank 3 has none"));

  save(store, 2, 3, /*complete=*/false);
  fs::remove(store.shard_path(2, 1));
  CHECK_THROWS_WITH(store.complete_version(2, 3),
                    Catch::Contains("v000002.rank1.h5") && Catch::Contains("does not exist"));
  CHECK_FALSE(fs::exists(store.index_path(2)));
  CHECK(store.latest() == 1);
  // A shard of another version under this version's name is refused, naming what it holds.
  fs::copy_file(store.shard_path(1, 1), store.shard_path(2, 1));
  CHECK_THROWS_WITH(store.complete_version(2, 3),
                    Catch::Contains("v000002.rank1.h5") && Catch::Contains("holds version 1 rank 1 of 3"));
  CHECK_FALSE(fs::exists(store.index_path(2)));

  // A shard removed after completion makes the version invalid, naming the file.
  fs::remove(store.shard_path(1, 2));
  const VerifyResult verified = store.verify(1);
  CHECK_FALSE(verified.valid);
  CHECK_THAT(verified.problem, Catch::Contains("v000001.rank2.h5") && Catch::Contains("missing"));
}

TEST_CASE("corrupt versions are skipped by resume and refused by rollback", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  save(store, 1);
  save(store, 2);
  save(store, 3);
  corrupt_data(store.shard_path(3, 0));
  fs::resize_file(store.shard_path(2, 0), fs::file_size(store.shard_path(2, 0)) - 100);

  const ResumeChoice choice = store.resume_choice();
  CHECK(choice.version == 1);
  REQUIRE(choice.skipped.size() == 2);
  CHECK(choice.skipped[0].first == 3);
  CHECK(choice.skipped[1].first == 2);
  CHECK_THAT(choice.skipped[1].second, Catch::Contains("truncated"));
  CHECK_THAT(choice.describe(), Catch::Contains("skipped v000003") && Catch::Contains("using v000001"));

  CHECK_THROWS_WITH(store.rollback_to("2"), Catch::Contains("refusing to roll back to v000002"));
  CHECK(store.latest() == 3);
  const RollbackResult back = store.rollback_previous();
  CHECK(back.from == 3);
  CHECK(back.to == 1);
  CHECK(back.skipped.size() == 1);
  CHECK(store.latest() == 1);
  CHECK_THROWS_WITH(store.rollback_previous(), Catch::Contains("no valid version older than v000001"));
  CHECK_THROWS_WITH(store.tag(3, "best"), Catch::Contains("refusing to tag v000003"));
}

TEST_CASE("a corrupt `latest` pointer: listed versions, resume falls back, rollback repairs", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  save(store, 1);
  save(store, 2);
  std::ofstream(store.latest_path(), std::ios::trunc) << "garbage\n";

  const LatestPointer pointer = store.latest_pointer();
  CHECK_FALSE(pointer.version.has_value());
  CHECK(pointer.problem == "latest pointer '" + store.latest_path() + "' is corrupt: 'garbage'");
  CHECK_THROWS_WITH(store.latest(), Catch::Contains("is corrupt: 'garbage'"));
  const auto infos = store.list();  // threw before: nothing could be listed
  REQUIRE(infos.size() == 2);
  CHECK(infos[0].valid);
  CHECK(infos[1].valid);
  CHECK_FALSE(infos[0].is_latest);
  CHECK_FALSE(infos[1].is_latest);
  CHECK(store.resume_choice().version == 2);

  const RollbackResult repaired = store.rollback_to("1");
  CHECK_FALSE(repaired.from.has_value());
  CHECK(repaired.to == 1);
  CHECK(store.latest() == 1);
  CHECK(store.latest_pointer().problem.empty());
  CHECK(store.list()[0].is_latest);

  // A long binary pointer is shown shortened, not poured into the message.
  std::ofstream(store.latest_path(), std::ios::trunc) << std::string(500, '\x01');
  CHECK(store.latest_pointer().problem.size() < 200);
  std::ofstream(store.latest_path(), std::ios::trunc) << "v" << std::string(30, '9') << "\n";
  CHECK_THAT(store.latest_pointer().problem, Catch::Contains("is corrupt"));
}

TEST_CASE("tags name versions, rollback follows them, retention keeps them", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  for (int v = 1; v <= 6; ++v) save(store, v);
  store.tag(2, "good");
  store.tag(3, "release-1.0");
  CHECK(store.tags() == std::map<std::string, std::int64_t>{{"good", 2}, {"release-1.0", 3}});
  CHECK_THROWS_WITH(store.tag(4, "12"), Catch::Contains("invalid tag name"));
  CHECK_THROWS_WITH(store.tag(4, "latest"), Catch::Contains("invalid tag name"));
  store.tag(4, "good");  // moves
  CHECK(store.tags().at("good") == 4);
  store.tag(2, "good");
  CHECK(store.list()[1].tags == std::vector<std::string>{"good"});

  const RollbackResult back = store.rollback_to("good");
  CHECK(back.from == 6);
  CHECK(back.to == 2);
  CHECK(store.latest() == 2);
  CHECK(store.resume_choice().version == 2);  // a rolled-back latest wins over newer versions

  const RetentionResult kept = store.apply_retention(2);
  CHECK(kept.deleted == std::vector<std::int64_t>{1, 4});
  CHECK(store.versions() == std::vector<std::int64_t>{2, 3, 5, 6});
  store.untag("release-1.0");
  store.rollback_to("6");
  CHECK(store.apply_retention(1).deleted == std::vector<std::int64_t>{3, 5});
  CHECK(store.versions() == std::vector<std::int64_t>{2, 6});
  CHECK_THROWS_AS(store.untag("release-1.0"), CheckpointError);
}

TEST_CASE("a save that races with a rollback leaves `latest` where the rollback put it", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  save(store, 1);
  save(store, 2);
  save(store, 3, 1, /*complete=*/false);  // the learner is writing v3, expecting `latest` at v2
  store.rollback_to("1");                 // meanwhile, from another process
  CHECK_FALSE(store.complete_version(3, 1, true, /*only_if_latest_is=*/2));
  CHECK(store.latest() == 1);
  CHECK(store.verify(3).valid);  // complete, only not named by `latest`
  save(store, 4, 1, false);
  CHECK(store.complete_version(4, 1, true, /*only_if_latest_is=*/1));
  CHECK(store.latest() == 4);
}

TEST_CASE("a rollback waits for the lock a save holds; a lock held too long is named", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  save(store, 1);
  save(store, 2);
  std::promise<void> locked;
  std::thread saver([&] {
    const FileLock lock(store.lock_path(), 1.0);
    locked.set_value();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  });
  locked.get_future().wait();
  const auto started = std::chrono::steady_clock::now();
  store.rollback_to("1");
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  saver.join();
  CHECK(waited > 0.2);
  CHECK(store.latest() == 1);

  const FileLock held(store.lock_path(), 1.0);
  CHECK_THROWS_WITH(FileLock(store.lock_path(), 0.05),
                    Catch::Contains(".latest.lock") && Catch::Contains("still held by another process"));
}

TEST_CASE("export writes the model arrays of every shard only", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  save(store, 4, 2);
  const std::string out = dir.file("weights.h5");
  CHECK(store.export_weights(4, out) > 0);
  const CheckpointReader weights(out);
  REQUIRE(weights.arrays().size() == 2);
  CHECK(weights.find("model/w0") != nullptr);
  CHECK(weights.find("model/w1") != nullptr);
  CHECK(weights.find("optimizer/m0") == nullptr);
  CHECK(weights.int_attribute(attribute_key::kPolicyVersion) == 4);
  CHECK(weights.int_attribute("weights_only") == 1);
  weights.verify_all();
  CHECK_THROWS_WITH(store.export_weights(4, dir.file("x.h5"), "nothing/"), Catch::Contains("no arrays under"));
}

TEST_CASE("archive copies run in the background and keep the archive's retention", "[storage]") {
  TempDir dir;
  CheckpointStore store(dir.file("ckpt"));
  for (int v = 1; v <= 4; ++v) save(store, v, 2);
  store.tag(1, "first");
  std::vector<std::future<ArchiveResult>> copies;
  Archiver archiver(dir.file("ckpt"), dir.file("archive"), /*keep_last=*/2);
  const auto start = std::chrono::steady_clock::now();
  for (int v = 1; v <= 4; ++v) copies.push_back(archiver.archive_copy(v));
  const auto queued = std::chrono::steady_clock::now() - start;
  CHECK(queued < std::chrono::milliseconds(50));  // queuing never waits for a copy
  for (auto& copy : copies) {
    const ArchiveResult result = copy.get();
    CHECK(result.bytes > 0);
  }
  CHECK(archiver.wait_idle_for(60));
  CHECK(archiver.pending() == 0);
  const CheckpointStore archive(archiver.checkpoint_archive_dir());
  CHECK(archive.versions() == std::vector<std::int64_t>{1, 3, 4});  // keep 2 + the tagged one
  CHECK(archive.verify(4).valid);

  // A corrupt version is not archived; the error comes back through the future.
  corrupt_data(store.shard_path(4, 1));
  CHECK_THROWS_WITH(archiver.archive_copy(4).get(), Catch::Contains("not archiving v000004"));

  std::ofstream(dir.file("metrics.jsonl")) << "{\"step\": 1}\n";
  const ArchiveResult file = archiver.archive_file(dir.file("metrics.jsonl"), "logs/metrics.jsonl").get();
  CHECK(file.bytes == 12);
  CHECK(fs::exists(dir.file("archive/logs/metrics.jsonl")));
}
