#pragma once
// The gauge process.resident_bytes, read from /proc/self/statm.

namespace moerl::telemetry {

// Sets process.resident_bytes to this process's resident memory now.
void record_resident_memory();

}  // namespace moerl::telemetry
