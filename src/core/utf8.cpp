#include "moerl/core/utf8.h"

#include <unicode/ustring.h>

#include <vector>

#include "moerl/core/check.h"

namespace moerl {

Utf8Repair repair_utf8(const std::string& bytes) {
  Utf8Repair out;
  if (bytes.empty()) return out;
  // UTF-8 -> UTF-16 with substitution (ICU counts the substitutions), then back.
  std::vector<UChar> utf16(bytes.size() + 1);
  int32_t length = 0;
  int32_t substitutions = 0;
  UErrorCode status = U_ZERO_ERROR;
  u_strFromUTF8WithSub(utf16.data(), static_cast<int32_t>(utf16.size()), &length, bytes.data(),
                       static_cast<int32_t>(bytes.size()), 0xFFFD, &substitutions, &status);
  MOERL_CHECK(U_SUCCESS(status), std::string("UTF-8 repair failed: ") + u_errorName(status));
  out.replacements = static_cast<std::size_t>(substitutions);
  if (substitutions == 0) {
    out.text = bytes;
    return out;
  }
  out.text.resize(static_cast<size_t>(length) * 3 + 1);
  int32_t written = 0;
  status = U_ZERO_ERROR;
  u_strToUTF8(out.text.data(), static_cast<int32_t>(out.text.size()), &written, utf16.data(), length, &status);
  MOERL_CHECK(U_SUCCESS(status), std::string("UTF-8 repair failed: ") + u_errorName(status));
  out.text.resize(static_cast<size_t>(written));
  return out;
}

}  // namespace moerl
