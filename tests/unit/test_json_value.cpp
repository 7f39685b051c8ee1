// moerl's JSON API over nlohmann-json: JsonValue (reading: the external-
// environment protocol, checkpoint books, HF config.json, tokenizer.json)
// and JsonWriter (metrics lines, summaries, indexes).

#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"

using moerl::JsonError;
using moerl::JsonNumbers;
using moerl::JsonValue;
using moerl::JsonWriter;

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
  CHECK_FALSE(v.find("missing"));
  CHECK_FALSE(v.at("id").find("id"));  // not an object
  CHECK(JsonValue().is_null());
  CHECK_THROWS_WITH(v.at("missing"), "missing field 'missing'");
  CHECK_THROWS_WITH(v.at("id").as_string(), "expected a string, got a number");
  CHECK_THROWS_WITH(v.at("list").as_object(), "expected an object, got an array");
  CHECK_THROWS_WITH(JsonValue().as_bool(), "expected a boolean, got null");
  CHECK_THROWS_WITH(v.at("list").as_array()[3], "index 3 past the end of an array of 3");
}

TEST_CASE("JSON objects iterate in key order, arrays in order; a repeated key keeps its last value", "[json]") {
  const JsonValue v = JsonValue::parse(R"({"b": 2, "a": 1, "c": [10, 20, 30], "b": 3})");
  std::vector<std::string> keys;
  for (const auto& [key, value] : v.as_object()) keys.push_back(key);
  CHECK(keys == std::vector<std::string>{"a", "b", "c"});
  CHECK(v.at("b").as_number() == 3);
  std::vector<double> elements;
  for (const JsonValue& e : v.at("c").as_array()) elements.push_back(e.as_number());
  CHECK(elements == std::vector<double>{10, 20, 30});
}

TEST_CASE("JSON handles keep their document alive", "[json]") {
  JsonValue member;
  std::optional<JsonValue> found;
  {
    const JsonValue document = JsonValue::parse(R"({"a": {"b": ["x", "y"]}})");
    member = document.at("a");
    found = document.at("a").at("b").as_array()[1];
  }
  CHECK(member.at("b").as_array()[0].as_string() == "x");
  CHECK(found->as_string() == "y");
}

TEST_CASE("JSON numbers: integers exact to 2^64, beyond a double's range +-infinity", "[json]") {
  const JsonValue v = JsonValue::parse(
      R"([9007199254740993, 18446744073709551615, -9223372036854775808, 1e308, 1e999, -1e999, 1e-999, 0.1])");
  const auto a = v.as_array();
  CHECK(a[0].as_number() == 9007199254740992.0);  // the double nearest, as strtod gives
  CHECK(a[1].as_number() == 18446744073709551615.0);
  CHECK(a[2].as_number() == -9223372036854775808.0);
  CHECK(a[3].as_number() == 1e308);
  CHECK(a[4].as_number() == HUGE_VAL);
  CHECK(a[5].as_number() == -HUGE_VAL);
  CHECK(a[6].as_number() == 0.0);
  CHECK(a[7].as_number() == 0.1);
  CHECK(JsonValue::parse("{\"reward\": 1e999}").at("reward").as_number() == HUGE_VAL);
}

TEST_CASE("Python's NaN and Infinity are numbers only when asked for", "[json]") {
  const std::string text = R"({"reward": NaN, "up": Infinity, "down": [-Infinity], "text": "NaN Infinity"})";
  const JsonValue v = JsonValue::parse(text, JsonNumbers::JsonNumbersPythonNonFinite);
  CHECK(std::isnan(v.at("reward").as_number()));
  CHECK(v.at("up").as_number() == HUGE_VAL);
  CHECK(v.at("down").as_array()[0].as_number() == -HUGE_VAL);
  CHECK(v.at("text").as_string() == "NaN Infinity");
  CHECK_THROWS_WITH(JsonValue::parse(text), Catch::Contains("invalid JSON at offset 11 (line 1, column 12)"));
  // Not in place of a key, nor after a value; an error after one names the byte of the text as given.
  for (const char* bad : {"{NaN: 1}", "[1 NaN]", "NaNa", "[Inf]"}) {
    INFO(bad);
    CHECK_THROWS_AS(JsonValue::parse(bad, JsonNumbers::JsonNumbersPythonNonFinite), JsonError);
  }
  CHECK_THROWS_WITH(JsonValue::parse("[NaN, -Infinity, 1e999, oops]", JsonNumbers::JsonNumbersPythonNonFinite),
                    Catch::Contains("offset 24"));
}

TEST_CASE("invalid JSON is refused with the offset, line and column", "[json]") {
  for (const char* bad : {"", "{", "{\"a\" 1}", "[1,]", "\"unterminated", "{\"a\":1} trailing", "nul", "\"\\x\"",
                          "\"\\ud800\"", "01x", "-", "1.", "\"tab\there\"", "\"\xff\"", "[1] [2]"}) {
    INFO(bad);
    CHECK_THROWS_AS(JsonValue::parse(bad), JsonError);
  }
  CHECK_THROWS_WITH(JsonValue::parse("[1, 2, oops]"),
                    Catch::StartsWith("invalid JSON at offset 7 (line 1, column 8): "));
  CHECK_THROWS_WITH(JsonValue::parse("{\n  \"a\": 1,\n  \"b\": ?\n}"),
                    Catch::StartsWith("invalid JSON at offset 19 (line 3, column 8): "));
  CHECK_THROWS_WITH(JsonValue::parse("{\"a\": "), Catch::Contains("offset 6") && Catch::Contains("end of input"));
  std::string deep(100, '[');
  CHECK_THROWS_WITH(JsonValue::parse(deep), Catch::Contains("nesting deeper than 64 levels"));
  const std::string ok64 = std::string(64, '[') + std::string(64, ']');
  CHECK_NOTHROW(JsonValue::parse(ok64));
  CHECK_THROWS_WITH(JsonValue::parse("[" + ok64 + "]"), Catch::Contains("deeper than 64"));
}

TEST_CASE("JsonWriter writes doubles with 9 significant digits, integral ones without a fraction", "[json]") {
  JsonWriter json;
  json.begin_array()
      .value(0.1f)
      .value(7.0)
      .value(2.5)
      .value(1.0 / 3.0)
      .value(1e-7)
      .value(-0.000123)
      .value(123456789.0)
      .value(1733140000.123)
      .value(HUGE_VAL)
      .value(std::int64_t{1} << 62)
      .end_array();
  CHECK(json.str() == "[0.100000001,7,2.5,0.333333333,1e-07,-0.000123,123456789,1.73314e+09,null,4611686018427387904]");
}

TEST_CASE("JsonWriter keeps key order, escapes strings and makes ill-formed UTF-8 valid", "[json]") {
  JsonWriter json;
  json.begin_object()
      .key("z")
      .value("tab\tquote\"back\\slash\x01\x7f")
      .key("a")
      .value("\xC3\xA9\xF0\x9F\x98\x80")
      .key("bad")
      .value("x\xFFy\xC3")
      .key("key \"quoted\"")
      .null()
      .key("nested")
      .begin_object()
      .key("list")
      .begin_array()
      .end_array()
      .key("t")
      .value(true)
      .end_object()
      .end_object();
  CHECK(json.str() ==
        "{\"z\":\"tab\\tquote\\\"back\\\\slash\\u0001\x7f\",\"a\":\"\xC3\xA9\xF0\x9F\x98\x80\","
        "\"bad\":\"x\xEF\xBF\xBDy\xEF\xBF\xBD\",\"key \\\"quoted\\\"\":null,"
        "\"nested\":{\"list\":[],\"t\":true}}");
  const JsonValue back = JsonValue::parse(json.str());
  CHECK(back.at("z").as_string() == "tab\tquote\"back\\slash\x01\x7f");
  CHECK(back.at("bad").as_string() == "x\xEF\xBF\xBDy\xEF\xBF\xBD");
  CHECK(back.at("nested").at("t").as_bool());
  CHECK_THROWS_AS(JsonWriter().begin_object().end_array(), moerl::Error);
  CHECK_THROWS_AS(JsonWriter().begin_array().key("k"), moerl::Error);
  CHECK_THROWS_AS(JsonWriter().begin_object().value(1), moerl::Error);
}
