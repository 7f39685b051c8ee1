// The JSON parser used by the external-environment protocol.

#include <catch2/catch.hpp>

#include "moerl/core/json_value.h"

using moerl::JsonError;
using moerl::JsonValue;

TEST_CASE("JSON values parse with their types", "[json]") {
  const JsonValue v = JsonValue::parse(R"( {"id": 7, "ok": true, "obs": "a\"b\u00e9\ud83d\ude00", "x": -1.5e2,
                                           "list": [1, null, {"k": false}], "empty": {}} )");
  CHECK(v.at("id").as_number() == 7);
  CHECK(v.at("ok").as_bool());
  CHECK(v.at("obs").as_string() == "a\"b\xC3\xA9\xF0\x9F\x98\x80");
  CHECK(v.at("x").as_number() == -150.0);
  CHECK(v.at("list").as_array().size() == 3);
  CHECK(v.at("list").as_array()[1].is_null());
  CHECK_FALSE(v.at("list").as_array()[2].at("k").as_bool());
  CHECK(v.at("empty").as_object().empty());
  CHECK(v.find("missing") == nullptr);
  CHECK_THROWS_WITH(v.at("missing"), "missing field 'missing'");
  CHECK_THROWS_WITH(v.at("id").as_string(), "expected a string, got a number");
}

TEST_CASE("invalid JSON is refused with the offset", "[json]") {
  for (const char* bad : {"", "{", "{\"a\" 1}", "[1,]", "\"unterminated", "{\"a\":1} trailing", "nul",
                          "\"\\x\"", "\"\\ud800\"", "01x", "-", "1.", "\"tab\there\""}) {
    INFO(bad);
    CHECK_THROWS_AS(JsonValue::parse(bad), JsonError);
  }
  CHECK_THROWS_WITH(JsonValue::parse("[1, 2, oops]"), Catch::Contains("offset 7"));
  std::string deep(100, '[');
  CHECK_THROWS_WITH(JsonValue::parse(deep), Catch::Contains("deeper than 64"));
}
