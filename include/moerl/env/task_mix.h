#pragma once
// Which tasks new sessions get: the families of [env] families, drawn by
// their [env.<family>] weight, with difficulty, shaping and step budget
// resolved from [env.<family>] over [env].

#include <cstdint>
#include <map>
#include <set>
#include <string>

#include "moerl/config/sections.h"
#include "moerl/env/environment.h"

namespace moerl::env {

// The task for `family` and `seed` under [env] and its [env.<family>] overrides.
TaskSpec make_task(const config::EnvSection& env, const config::EnvFamilySections& families, const std::string& family,
                   std::uint64_t seed);

// A family drawn from [env] families by weight; `draw` is any 64-bit value
// (e.g. a hash of the session number), so the mix is reproducible. Families
// in `excluded` (paused ones) are not drawn; "" when every family is excluded.
// `scales` multiplies the weights of the families it names (the curriculum's
// adaptive weights).
std::string pick_family(const config::EnvSection& env, const config::EnvFamilySections& families, std::uint64_t draw,
                        const std::set<std::string>& excluded = {}, const std::map<std::string, double>& scales = {});

}  // namespace moerl::env
