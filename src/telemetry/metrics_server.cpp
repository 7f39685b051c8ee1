#include "moerl/telemetry/metrics_server.h"

#include <httplib.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <sys/socket.h>

#include "moerl/core/error.h"

namespace moerl::telemetry {

struct MetricsServer::Impl {
  httplib::Server server;
};

MetricsServer::MetricsServer(const std::string& bind_address, int port, std::function<std::string()> render)
    : impl_(std::make_unique<Impl>()), bind_address_(bind_address) {
  httplib::Server& server = impl_->server;
  server.new_task_queue = [] { return new httplib::ThreadPool(1); };
  // cpp-httplib's default also sets SO_REUSEPORT, which lets a second job
  // bind the same port and answer every other scrape: SO_REUSEADDR only.
  server.set_socket_options([](int socket) {
    int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  server.Get("/metrics", [render](const httplib::Request&, httplib::Response& response) {
    // The exposition format's content type, version 0.0.4.
    response.set_content(render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  server.Get("/", [](const httplib::Request&, httplib::Response& response) {
    response.set_content("moerl: metrics at /metrics\n", "text/plain");
  });
  errno = 0;
  if (port == 0) {
    port_ = server.bind_to_any_port(bind_address);
  } else if (server.bind_to_port(bind_address, port)) {
    port_ = port;
  }
  if (port_ <= 0) {
    const int error = errno;
    throw Error("cannot serve metrics on " + bind_address + ":" + std::to_string(port) +
                " ([telemetry] prometheus_port, prometheus_bind)" +
                (error ? std::string(": ") + std::strerror(error) : std::string()));
  }
  thread_ = std::thread([this] { impl_->server.listen_after_bind(); });
  // stop() does nothing to a server that is not running yet, and the
  // destructor's join would then wait for ever: start serving first.
  for (int waited_ms = 0; !server.is_running() && waited_ms < 5000; ++waited_ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

MetricsServer::~MetricsServer() {
  impl_->server.stop();
  if (thread_.joinable()) thread_.join();
}

std::string MetricsServer::url() const { return "http://" + bind_address_ + ":" + std::to_string(port_) + "/metrics"; }

}  // namespace moerl::telemetry
