#pragma once
// Each rank's exit status, written where scripts/launch.sh can read it.
//
// Open MPI 5.0.11's mpirun can stay up after every rank has ended (seen under
// load, most often when all ranks end at once with the same status). The
// launcher then ends mpirun itself and has no exit status from it. The
// statuses the ranks wrote here give it the job's real one: a configuration
// error stays status 2 (no restart) instead of becoming a lost rank.
//
// scripts/launch.sh sets MOERL_EXIT_STATUS_DIR to a fresh directory for each
// attempt; without it nothing is written. A rank killed by a signal writes
// nothing, which the launcher reads as a lost rank.

namespace moerl::runtime {

// Reads MOERL_EXIT_STATUS_DIR once, before any thread starts (main()).
void prepare_exit_record();

// Writes this process's status to DIR/<pid>.status. Async-signal-safe (only
// open/write/close on a path formatted in advance): called right before
// std::_Exit and MPI_Abort, and from a signal handler. Later calls overwrite
// earlier ones, so the last status a rank recorded is the one that counts.
void record_exit_status(int status) noexcept;

// record_exit_status(status), then std::_Exit(status).
[[noreturn]] void exit_with_record(int status) noexcept;

}  // namespace moerl::runtime
