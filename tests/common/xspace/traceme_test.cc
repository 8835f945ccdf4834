#include "common/xspace/traceme.h"

#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof::traceme {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// (key, value) with the value's type made visible, for matching.
std::vector<std::string> Describe(const Annotation& annotation) {
  std::vector<std::string> out;
  for (const Stat& stat : annotation.stats) {
    std::string value;
    if (const auto* i = std::get_if<int64_t>(&stat.value)) value = "int64:" + std::to_string(*i);
    if (const auto* u = std::get_if<uint64_t>(&stat.value)) value = "uint64:" + std::to_string(*u);
    if (const auto* d = std::get_if<double>(&stat.value)) value = "double:" + std::to_string(*d);
    if (const auto* s = std::get_if<std::string_view>(&stat.value))
      value = "str:" + std::string(*s);
    out.push_back(std::string(stat.key) + "=" + value);
  }
  return out;
}

TEST(TraceMeEncodeTest, NameWithoutArgsIsUnchanged) { EXPECT_EQ(Encode("train", {}), "train"); }

TEST(TraceMeEncodeTest, ArgsLikePythonTraceWrapper) {
  // tf.profiler.experimental.Trace("train", step_num=3, _r=1)
  EXPECT_EQ(Encode("train", {{"step_num", 3}, {"_r", 1}}), "train#step_num=3,_r=1#");
}

TEST(TraceMeEncodeTest, ValueTypes) {
  EXPECT_EQ(Encode("e", {{"i", -5},
                         {"u", uint64_t{18446744073709551615u}},
                         {"d", 0.1},
                         {"s", "text"},
                         {"b", true},
                         {"f", false}}),
            "e#i=-5,u=18446744073709551615,d=0.1,s=text,b=1,f=0#");
}

TEST(TraceMeEncodeTest, DoublesRoundTripExactly) {
  const std::string encoded = Encode("e", {{"d", 1.0 / 3.0}});
  const Annotation decoded = Decode(encoded);
  ASSERT_EQ(decoded.stats.size(), 1u);
  EXPECT_EQ(std::get<double>(decoded.stats[0].value), 1.0 / 3.0);
}

TEST(TraceMeEncodeTest, HashIsReplacedInNamesKeysAndValues) {
  EXPECT_EQ(Encode("a#b", {{"k#", "v#1"}}), "a_b#k_=v_1#");
  EXPECT_EQ(Decode(Encode("a#b", {{"k#", "v#1"}})).name, "a_b");
}

TEST(TraceMeEncodeTest, SetMetadataAppendsToExistingMetadata) {
  std::string name = Encode("train", {{"step_num", 3}});
  AppendMetadata(&name, {{"in_cache", true}});
  EXPECT_EQ(name, "train#step_num=3,in_cache=1#");
}

TEST(TraceMeEncodeTest, SetMetadataOnPlainNameAddsMetadata) {
  std::string name = "train";
  AppendMetadata(&name, {{"loss", 0.5}});
  EXPECT_EQ(name, "train#loss=0.5#");
  AppendMetadata(&name, {});
  EXPECT_EQ(name, "train#loss=0.5#");
}

TEST(TraceMeDecodeTest, NameWithoutTrailingHashHasNoMetadata) {
  const Annotation a = Decode("a#b=1");
  EXPECT_EQ(a.name, "a#b=1");
  EXPECT_THAT(a.stats, IsEmpty());
}

TEST(TraceMeDecodeTest, PlainName) {
  const Annotation a = Decode("train_step");
  EXPECT_EQ(a.name, "train_step");
  EXPECT_THAT(a.stats, IsEmpty());
}

TEST(TraceMeDecodeTest, EmptyAndHashOnly) {
  EXPECT_EQ(Decode("").name, "");
  EXPECT_EQ(Decode("#").name, "");
  EXPECT_EQ(Decode("##").name, "");
  EXPECT_THAT(Decode("##").stats, IsEmpty());
}

TEST(TraceMeDecodeTest, TypedValues) {
  const Annotation a =
      Decode("op#i=-5,u=18446744073709551615,d=0.5,e=1e3,s=abc,big=-9223372036854775809,plus=+7#");
  EXPECT_EQ(a.name, "op");
  EXPECT_THAT(Describe(a), ElementsAre("i=int64:-5", "u=uint64:18446744073709551615",
                                       "d=double:0.500000", "e=double:1000.000000", "s=str:abc",
                                       "big=double:-9223372036854775808.000000", "plus=int64:7"));
}

TEST(TraceMeDecodeTest, OnlyFirstTwoPartsCount) {
  const Annotation a = Decode("a#x=1#y=2#");
  EXPECT_EQ(a.name, "a");
  EXPECT_THAT(Describe(a), ElementsAre("x=int64:1"));
}

TEST(TraceMeDecodeTest, CommasInsideQuotesAndBracketsDoNotSplit) {
  const Annotation a = Decode("op#shape=[1,2],d={a:1,b:[2,3]},t=(3,4),s=\"x,y\",q='p,q',last=1#");
  EXPECT_THAT(Describe(a), ElementsAre("shape=str:[1,2]", "d=str:{a:1,b:[2,3]}", "t=str:(3,4)",
                                       "s=str:\"x,y\"", "q=str:'p,q'", "last=int64:1"));
}

TEST(TraceMeDecodeTest, BracketsInsideQuotesAndQuotesInsideBrackets) {
  // A '[' inside quotes still opens (as upstream: the stack does not special-case quotes), and a
  // quote of the other kind nests.
  const Annotation a = Decode("op#a=\"it's,x\",b=1#");
  EXPECT_THAT(Describe(a), ElementsAre("a=str:\"it's,x\",b=1"));
}

TEST(TraceMeDecodeTest, UnbalancedOpenBracketSwallowsTheRest) {
  const Annotation a = Decode("op#a=[1,b=2#");
  EXPECT_THAT(Describe(a), ElementsAre("a=str:[1,b=2"));
}

TEST(TraceMeDecodeTest, StrayClosingBracketIsIgnored) {
  const Annotation a = Decode("op#a=1],b=2#");
  EXPECT_THAT(Describe(a), ElementsAre("a=str:1]", "b=int64:2"));
}

TEST(TraceMeDecodeTest, SplitsOnFirstEquals) {
  EXPECT_THAT(Describe(Decode("op#expr=a=b#")), ElementsAre("expr=str:a=b"));
}

TEST(TraceMeDecodeTest, TrimsWhitespace) {
  const Annotation a = Decode("  name  # k = v , n= 3 #");
  EXPECT_EQ(a.name, "name");
  EXPECT_THAT(Describe(a), ElementsAre("k=str:v", "n=int64:3"));
}

TEST(TraceMeDecodeTest, DropsEmptyKeysValuesAndShortPieces) {
  const Annotation a = Decode("n#=1,k=,=,x=2,,a,novalue,y= #");
  EXPECT_THAT(Describe(a), ElementsAre("x=int64:2"));
}

TEST(TraceMeDecodeTest, SetMetadataTrailingHashBecomesComma) {
  // What Python's set_metadata produces after Trace(name, step_num=1).
  const Annotation a = Decode("train#step_num=1,in_cache=1#");
  EXPECT_THAT(Describe(a), ElementsAre("step_num=int64:1", "in_cache=int64:1"));
}

TEST(TraceMeDecodeTest, StepMarker) {
  const std::string encoded = Encode("train", {{"step_num", 1200}, {"_r", 1}});
  const Annotation a = Decode(encoded);
  EXPECT_EQ(a.name, "train");
  EXPECT_THAT(Describe(a), ElementsAre("step_num=int64:1200", "_r=int64:1"));
}

TEST(TraceMeParseValueTest, Order) {
  EXPECT_TRUE(std::holds_alternative<int64_t>(ParseValue("9223372036854775807")));
  EXPECT_TRUE(std::holds_alternative<uint64_t>(ParseValue("9223372036854775808")));
  EXPECT_TRUE(std::holds_alternative<double>(ParseValue("18446744073709551616")));
  EXPECT_TRUE(std::holds_alternative<double>(ParseValue("inf")));
  EXPECT_TRUE(std::holds_alternative<std::string_view>(ParseValue("12abc")));
  EXPECT_TRUE(std::holds_alternative<std::string_view>(ParseValue("True")));
}

}  // namespace
}  // namespace clusterprof::traceme
