#pragma once
// Making text valid UTF-8: the external-environment protocol and the JSON
// files moerl writes are UTF-8, while model actions (byte-level tokens) and
// environment observations may hold any bytes.

#include <cstddef>
#include <string>

namespace moerl {

struct Utf8Repair {
  std::string text;              // valid UTF-8
  std::size_t replacements = 0;  // ill-formed sequences replaced by U+FFFD
};

// Every ill-formed sequence becomes U+FFFD (ICU's substitution, the
// "maximal subpart" practice of the Unicode standard); valid text is unchanged.
Utf8Repair repair_utf8(const std::string& bytes);

}  // namespace moerl
