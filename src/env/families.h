#pragma once
// Factories of the built-in task families (one translation unit each); the
// registry in task_family.cpp is their only user outside the tests.

#include <memory>

#include "moerl/env/environment.h"

namespace moerl::env::detail {

inline constexpr int kArithmeticMaxDifficulty = 10;
inline constexpr int kMazeMaxDifficulty = 10;
inline constexpr int kGuessMaxDifficulty = 15;
inline constexpr int kSortMaxDifficulty = 12;
inline constexpr int kLookupMaxDifficulty = 12;

std::unique_ptr<Environment> make_arithmetic_session();
std::unique_ptr<Environment> make_maze_session();
std::unique_ptr<Environment> make_guess_session();
std::unique_ptr<Environment> make_sort_session();
std::unique_ptr<Environment> make_lookup_session();

}  // namespace moerl::env::detail
