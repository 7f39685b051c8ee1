#pragma once
// Shared by the algo tests: small tensor constructors and an element-wise
// comparison that prints index, got and want on failure.

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace algo_test {

inline torch::Tensor f64(std::vector<double> v) {
  return torch::tensor(v, torch::TensorOptions().dtype(torch::kDouble));
}
inline torch::Tensor i64(std::vector<std::int64_t> v) {
  return torch::tensor(v, torch::TensorOptions().dtype(torch::kLong));
}

inline void require_close_values(const std::string& what, const torch::Tensor& got, const std::vector<double>& want,
                                 double tol) {
  REQUIRE(got.dim() == 1);
  REQUIRE(got.size(0) == static_cast<std::int64_t>(want.size()));
  auto g = got.detach().to(torch::kCPU, torch::kDouble).contiguous();
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double a = g.data_ptr<double>()[i];
    INFO(what << "[" << i << "]: got " << a << " want " << want[i]);
    CHECK(std::abs(a - want[i]) <= tol);
  }
}

}  // namespace algo_test
