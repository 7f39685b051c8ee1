#pragma once
// Learner 0's /metrics endpoint: an HTTP server on a thread of its own that
// answers every GET /metrics with the page `render` returns at that moment
// (prometheus_text.h). It runs on Debian's cpp-httplib; only this header's
// implementation sees that library.
//
// One worker thread serves the requests (a scrape every few seconds needs no
// more), with 5 s read and write deadlines, so that a client that stops
// reading cannot hold the server.

#include <functional>
#include <memory>
#include <string>
#include <thread>

namespace moerl::telemetry {

class MetricsServer {
 public:
  // Listens on bind_address:port (port 0 picks a free one). Throws
  // moerl::Error naming the address when it cannot listen.
  MetricsServer(const std::string& bind_address, int port, std::function<std::string()> render);
  ~MetricsServer();  // stops serving and joins its thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const { return port_; }
  std::string url() const;  // "http://127.0.0.1:9464/metrics"

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  std::string bind_address_;
  int port_ = 0;
  std::thread thread_;
};

}  // namespace moerl::telemetry
