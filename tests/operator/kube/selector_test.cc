#include "operator/kube/selector.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::kube {
namespace {

using ::testing::HasSubstr;

StringMap Labels(std::initializer_list<std::pair<const char*, const char*>> entries) {
  StringMap labels;
  for (const auto& [k, v] : entries) labels.emplace_back(k, v);
  std::sort(labels.begin(), labels.end());
  return labels;
}

TEST(LabelSelectorTest, ParsesEveryOperatorAndMatches) {
  absl::StatusOr<LabelSelector> selector = LabelSelector::Parse(
      "app = trainer, tier in (a, b), env notin (prod), gpu, !canary, "
      "zone!=us");
  ASSERT_TRUE(selector.ok()) << selector.status();
  EXPECT_EQ(selector->requirements().size(), 6u);
  EXPECT_TRUE(selector->Matches(Labels({{"app", "trainer"}, {"tier", "b"}, {"gpu", ""}})));
  EXPECT_FALSE(selector->Matches(Labels({{"app", "trainer"}, {"tier", "c"}, {"gpu", ""}})));
  EXPECT_FALSE(selector->Matches(Labels({{"app", "trainer"}, {"tier", "a"}})));  // no gpu
  EXPECT_FALSE(
      selector->Matches(Labels({{"app", "trainer"}, {"tier", "a"}, {"gpu", ""}, {"canary", "1"}})));
  EXPECT_FALSE(
      selector->Matches(Labels({{"app", "trainer"}, {"tier", "a"}, {"gpu", ""}, {"env", "prod"}})));
  EXPECT_FALSE(
      selector->Matches(Labels({{"app", "trainer"}, {"tier", "a"}, {"gpu", ""}, {"zone", "us"}})));
  EXPECT_TRUE(
      selector->Matches(Labels({{"app", "trainer"}, {"tier", "a"}, {"gpu", ""}, {"zone", "eu"}})));
}

TEST(LabelSelectorTest, ToStringRoundTrips) {
  absl::StatusOr<LabelSelector> selector =
      LabelSelector::Parse("tier in (b,a),app==x,!canary,gpu,env notin (prod)");
  ASSERT_TRUE(selector.ok());
  EXPECT_EQ(selector->ToString(), "app=x,!canary,env notin (prod),gpu,tier in (a,b)");
  absl::StatusOr<LabelSelector> again = LabelSelector::Parse(selector->ToString());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->ToString(), selector->ToString());
}

TEST(LabelSelectorTest, EmptyMatchesEverything) {
  absl::StatusOr<LabelSelector> selector = LabelSelector::Parse("  ");
  ASSERT_TRUE(selector.ok());
  EXPECT_TRUE(selector->empty());
  EXPECT_TRUE(selector->Matches({}));
}

TEST(LabelSelectorTest, MalformedSelectorsSayWhere) {
  EXPECT_THAT(LabelSelector::Parse("app=x,").status().message(), HasSubstr("expected a label key"));
  EXPECT_THAT(LabelSelector::Parse("tier in a").status().message(), HasSubstr("expected '('"));
  EXPECT_THAT(LabelSelector::Parse("tier in (a b)").status().message(),
              HasSubstr("expected ',' or ')'"));
  EXPECT_THAT(LabelSelector::Parse("app=x y").status().message(), HasSubstr("position"));
  EXPECT_THAT(LabelSelector::Parse("app=" + std::string(64, 'v')).status().message(),
              HasSubstr("longer than 63"));
}

TEST(LabelSelectorTest, FromJsonCombinesMatchLabelsAndExpressions) {
  absl::StatusOr<LabelSelector> selector = LabelSelector::FromJson(web::json::value::parse(R"({
      "matchLabels": {"app": "llama"},
      "matchExpressions": [{"key": "role", "operator": "In", "values": ["worker", "chief"]},
                           {"key": "debug", "operator": "DoesNotExist"}]})"));
  ASSERT_TRUE(selector.ok()) << selector.status();
  EXPECT_EQ(selector->ToString(), "app=llama,!debug,role in (chief,worker)");
  EXPECT_TRUE(selector->Matches(Labels({{"app", "llama"}, {"role", "chief"}})));
  EXPECT_FALSE(selector->Matches(Labels({{"app", "llama"}, {"role", "ps"}})));
  EXPECT_TRUE(LabelSelector::FromJson(web::json::value::parse("{}"))->empty());
}

TEST(LabelSelectorTest, FromJsonErrorsNameTheField) {
  EXPECT_THAT(LabelSelector::FromJson(
                  web::json::value::parse(R"({"matchExpressions":[{"key":"a","operator":"In"}]})"))
                  .status()
                  .message(),
              HasSubstr("matchExpressions[0]: operator In needs at least one value"));
  EXPECT_THAT(
      LabelSelector::FromJson(
          web::json::value::parse(R"({"matchExpressions":[{"key":"a","operator":"Near"}]})"))
          .status()
          .message(),
      HasSubstr("unknown operator \"Near\""));
  EXPECT_THAT(LabelSelector::FromJson(web::json::value::parse(R"({"matchLabels":{"a":1}})"))
                  .status()
                  .message(),
              HasSubstr("selector.matchLabels.a: not a string"));
}

}  // namespace
}  // namespace clusterprof::kube
