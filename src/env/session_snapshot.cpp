#include "moerl/env/session_snapshot.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "moerl/env/env_messages.h"
#include "moerl/runtime/wire.h"

namespace moerl::env {
namespace {

constexpr const char* kMagic = "moerl-session";
constexpr std::uint32_t kVersion = 1;

}  // namespace

std::vector<std::uint8_t> SessionSnapshot::encode() const {
  runtime::ByteWriter w;
  w.put_string(kMagic);
  w.put(kVersion);
  w.put(session);
  write_task(w, task);
  w.put<std::uint64_t>(actions.size());
  for (const std::string& a : actions) w.put_string(a);
  w.put_vector(native);
  w.put(runtime::crc32(w.bytes().data(), w.bytes().size()));
  return w.take();
}

SessionSnapshot SessionSnapshot::decode(const std::vector<std::uint8_t>& bytes) {
  try {
    if (bytes.size() < 4) throw Error("too short");
    std::uint32_t stored = 0;
    std::memcpy(&stored, bytes.data() + bytes.size() - 4, 4);
    if (runtime::crc32(bytes.data(), bytes.size() - 4) != stored) throw Error("checksum mismatch");
    runtime::ByteReader r(bytes.data(), bytes.size() - 4);
    if (r.get_string() != kMagic) throw Error("not a session snapshot");
    if (const auto version = r.get<std::uint32_t>(); version != kVersion)
      throw Error("snapshot format version " + std::to_string(version) + ", expected " + std::to_string(kVersion));
    SessionSnapshot s;
    s.session = r.get<std::uint64_t>();
    s.task = read_task(r);
    const auto count = r.get<std::uint64_t>();
    if (count > r.remaining()) throw Error("action count exceeds the snapshot size");
    for (std::uint64_t i = 0; i < count; ++i) s.actions.push_back(r.get_string());
    s.native = r.get_vector<std::uint8_t>();
    r.expect_end();
    return s;
  } catch (const Error& error) {
    throw Error(std::string("invalid session snapshot: ") + error.what());
  }
}

void SessionSnapshot::write_file(const std::string& path) const {
  const std::filesystem::path target(path);
  if (target.has_parent_path()) std::filesystem::create_directories(target.parent_path());
  const std::string temporary = path + ".tmp";
  {
    std::ofstream file(temporary, std::ios::binary | std::ios::trunc);
    const auto bytes = encode();
    file.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    file.flush();
    if (!file) throw Error("cannot write session snapshot '" + temporary + "'");
  }
  std::filesystem::rename(temporary, target);
}

SessionSnapshot SessionSnapshot::read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw Error("cannot read session snapshot '" + path + "'");
  const std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  try {
    return decode(bytes);
  } catch (const Error& error) {
    throw Error(path + ": " + error.what());
  }
}

}  // namespace moerl::env
