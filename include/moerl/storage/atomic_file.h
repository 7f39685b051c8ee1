#pragma once
// Durable, atomic file updates for the checkpoint store: write a temporary
// file next to the target, fsync it, rename it over the target, fsync the
// directory. A reader (or a crash) sees the old content or the new, never a mix.

#include <string>

namespace moerl::storage {

// "DIR/.NAME.tmp.PID.N": hidden, unique per process and call, in the target's directory
// (rename is atomic only within one file system).
std::string temporary_path_for(const std::string& final_path);
// True for names made by temporary_path_for (leftovers of a crash).
bool is_temporary_name(const std::string& file_name);

void fsync_file(const std::string& path);
void fsync_directory(const std::string& directory);
// rename(2) + fsync of the directory holding `to`.
void rename_durably(const std::string& from, const std::string& to);
// Temporary file + fsync + rename + directory fsync.
void write_file_atomically(const std::string& path, const std::string& content);
// The whole file; throws moerl::Error naming the path when it cannot be read.
std::string read_whole_file(const std::string& path);

}  // namespace moerl::storage
