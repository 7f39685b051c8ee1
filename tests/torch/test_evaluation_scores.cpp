// Held-out success intervals against published reference values: Wilson
// score intervals (Newcombe 1998, Stat. Med. 17:857, example 81/263 ->
// 0.2553-0.3662; 0/10 and 10/10 -> 0-0.2775 and 0.7225-1) and the hybrid
// score interval for a difference (same paper, method 10: 56/70 - 48/80 ->
// 0.0524-0.3339); summary.json's per-family fields.

#include <catch2/catch.hpp>

#include "family_score_fixture.h"
#include "moerl/core/json_value.h"
#include "moerl/core/json_writer.h"
#include "moerl/learner/evaluation_scores.h"

using namespace moerl;
using namespace moerl::learner;
using moerl::learner::testing::score;

TEST_CASE("Wilson intervals match the published values", "[evaluation]") {
  const Interval mid = wilson_interval(81, 263);
  CHECK(mid.low == Approx(0.2553).margin(5e-5));
  CHECK(mid.high == Approx(0.3662).margin(5e-5));
  const Interval none = wilson_interval(0, 10);
  CHECK(none.low == 0.0);
  CHECK(none.high == Approx(0.2775).margin(5e-5));
  const Interval all = wilson_interval(10, 10);
  CHECK(all.low == Approx(0.7225).margin(5e-5));
  CHECK(all.high == Approx(1.0));
  const Interval empty = wilson_interval(0, 0);
  CHECK(empty.low == 0.0);
  CHECK(empty.high == 1.0);
}

TEST_CASE("gain intervals match Newcombe's method 10", "[evaluation]") {
  const Gain gain = success_gain(score(48, 80), score(56, 70));
  CHECK(gain.value == Approx(0.2));
  CHECK(gain.interval.low == Approx(0.0524).margin(5e-5));
  CHECK(gain.interval.high == Approx(0.3339).margin(5e-5));
  // The same rates with four times the episodes: a narrower interval around the same gain.
  const Gain more = success_gain(score(192, 320), score(224, 280));
  CHECK(more.value == Approx(0.2));
  CHECK(more.interval.low > gain.interval.low);
  CHECK(more.interval.high < gain.interval.high);
  // No change: an interval around 0 on both sides.
  const Gain none = success_gain(score(20, 64), score(20, 64));
  CHECK(none.value == 0.0);
  CHECK(none.interval.low < 0.0);
  CHECK(none.interval.high > 0.0);
}

TEST_CASE("scores and gains round-trip through summary.json's form", "[evaluation]") {
  ScoreTable before{{"sort", score(48, 80)}}, after{{"sort", score(56, 70)}, {"maze", score(1, 2)}};
  JsonWriter json;
  json.begin_object().key("before");
  write_scores(json, before);
  json.key("gain");
  write_gains(json, before, after);
  json.end_object();
  const JsonValue parsed = JsonValue::parse(json.str());
  const JsonValue& sort = parsed.at("before").at("sort");
  CHECK(sort.at("success").as_number() == Approx(0.6));
  CHECK(sort.at("ci_low").as_number() == Approx(wilson_interval(48, 80).low));
  CHECK(sort.at("ci_high").as_number() == Approx(wilson_interval(48, 80).high));
  CHECK(sort.at("episodes").as_number() == 80);
  CHECK(parsed.at("gain").at("sort").at("ci_low").as_number() == Approx(0.0524).margin(5e-5));
  CHECK_FALSE(parsed.at("gain").find("maze"));  // no "before" for it
  const ScoreTable back = read_scores(parsed.at("before"));
  CHECK(back.at("sort").successes == 48);
  CHECK(back.at("sort").episodes == 80);
}
