#include "moerl/telemetry/resident_memory.h"

#include <unistd.h>

#include <fstream>

#include "moerl/telemetry/metrics.h"

namespace moerl::telemetry {

void record_resident_memory() {
  // /proc/self/statm: total and resident size, in pages.
  std::ifstream statm("/proc/self/statm");
  double total_pages = 0, resident_pages = 0;
  if (statm >> total_pages >> resident_pages)
    metrics().set("process.resident_bytes", resident_pages * static_cast<double>(sysconf(_SC_PAGESIZE)));
}

}  // namespace moerl::telemetry
