// The CustomResourceDefinitions in crds/ and the manifests in examples/, read as YAML: names,
// the status subresource, printer columns, structural schemas with a description on every
// field, the defaults and bounds the operator relies on, the CEL rules, ProfileSchedule's job
// template against ProfileJob's spec, and the examples against the schemas. What only a real
// API server can say (defaulting, validation errors) is in crd_apply_integration_test.cc.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "yaml-cpp/yaml.h"

namespace clusterprof::crds {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

// Loads a file of the source tree; a null node (and a test failure) when it does not parse.
YAML::Node LoadSourceFile(const std::string& relative) {
  const std::string path = std::string(CLUSTERPROF_SOURCE_DIR) + "/" + relative;
  try {
    return YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    ADD_FAILURE() << path << ": " << e.what();
    return YAML::Node();
  }
}

// yaml-cpp's operator[] on a non-const node inserts missing keys, and assigning to a YAML::Node
// that refers to a document node overwrites that node: lookups go through this const view, and
// handles are rebound with reset().
YAML::Node Get(const YAML::Node& node, const std::string& key) {
  const YAML::Node& view = node;
  if (!view.IsDefined() || !view.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  // A missing key gives an invalid node, which throws on use: an undefined one instead.
  YAML::Node value = view[key];
  return value.IsDefined() ? value : YAML::Node(YAML::NodeType::Undefined);
}

std::string Scalar(const YAML::Node& node) { return node.IsScalar() ? node.Scalar() : ""; }

bool EndsWith(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<std::string> Strings(const YAML::Node& node) {
  std::vector<std::string> out;
  if (!node.IsSequence()) return out;
  for (const YAML::Node& item : node) out.push_back(Scalar(item));
  return out;
}

std::optional<int64_t> Integer(const YAML::Node& node) {
  if (!node.IsScalar()) return std::nullopt;
  try {
    return node.as<int64_t>();
  } catch (const YAML::Exception&) {
    return std::nullopt;
  }
}

// The schema of the CRD's only version.
YAML::Node Version(const YAML::Node& crd) {
  const YAML::Node versions = Get(Get(crd, "spec"), "versions");
  if (!versions.IsSequence() || versions.size() == 0) return YAML::Node();
  return versions[0];
}
YAML::Node RootSchema(const YAML::Node& crd) {
  return Get(Get(Version(crd), "schema"), "openAPIV3Schema");
}

// The schema at a dotted path of property names under `schema` ("spec.targets.minReady");
// "[]" steps into a list's items ("status.targets[].phase"). Undefined when there is none.
YAML::Node SchemaAt(const YAML::Node& schema, const std::string& path) {
  YAML::Node node = schema;
  size_t begin = 0;
  while (begin <= path.size() && node.IsDefined()) {
    size_t end = path.find('.', begin);
    if (end == std::string::npos) end = path.size();
    std::string step = path.substr(begin, end - begin);
    const bool items = step.size() > 2 && EndsWith(step, "[]");
    if (items) step.resize(step.size() - 2);
    node.reset(Get(Get(node, "properties"), step));
    if (items) node.reset(Get(node, "items"));
    begin = end + 1;
  }
  return node.IsDefined() ? node : YAML::Node(YAML::NodeType::Undefined);
}

// A deep copy without the `description` at the top and without the CEL rules that compare with
// oldSelf (transition rules).
YAML::Node WithoutDescriptionAndTransitionRules(const YAML::Node& schema) {
  YAML::Node copy = YAML::Clone(schema);
  copy.remove("description");
  const YAML::Node rules = Get(copy, "x-kubernetes-validations");
  if (rules.IsSequence()) {
    YAML::Node kept(YAML::NodeType::Sequence);
    for (const YAML::Node& rule : rules) {
      if (Scalar(Get(rule, "rule")).find("oldSelf") == std::string::npos) kept.push_back(rule);
    }
    if (kept.size() == 0) {
      copy.remove("x-kubernetes-validations");
    } else {
      copy["x-kubernetes-validations"] = kept;
    }
  }
  return copy;
}

// Where `a` and `b` first differ ("" when they are equal), key order aside.
std::string FirstDifference(const YAML::Node& a, const YAML::Node& b, const std::string& path) {
  if (a.Type() != b.Type()) return path + ": different node types";
  if (a.IsScalar()) {
    return a.Scalar() == b.Scalar() ? "" : path + ": '" + a.Scalar() + "' vs '" + b.Scalar() + "'";
  }
  if (a.IsSequence()) {
    if (a.size() != b.size()) return path + ": lists of different lengths";
    for (size_t i = 0; i < a.size(); ++i) {
      std::string diff = FirstDifference(a[i], b[i], path + "[" + std::to_string(i) + "]");
      if (!diff.empty()) return diff;
    }
    return "";
  }
  if (a.IsMap()) {
    if (a.size() != b.size()) return path + ": maps of different sizes";
    for (const auto& entry : a) {
      const std::string key = entry.first.Scalar();
      const YAML::Node other = Get(b, key);
      if (!other.IsDefined()) return path + "." + key + ": missing on one side";
      std::string diff = FirstDifference(entry.second, other, path + "." + key);
      if (!diff.empty()) return diff;
    }
  }
  return "";
}

// Calls `visit(path, schema)` for `schema` and every schema below it: properties, items and
// additionalProperties.
void WalkSchemas(const YAML::Node& schema, const std::string& path,
                 const std::function<void(const std::string&, const YAML::Node&)>& visit) {
  visit(path, schema);
  const YAML::Node properties = Get(schema, "properties");
  if (properties.IsMap()) {
    for (const auto& entry : properties) {
      WalkSchemas(entry.second, path + "." + entry.first.Scalar(), visit);
    }
  }
  const YAML::Node items = Get(schema, "items");
  if (items.IsMap()) WalkSchemas(items, path + "[]", visit);
  const YAML::Node additional = Get(schema, "additionalProperties");
  if (additional.IsMap()) WalkSchemas(additional, path + "{}", visit);
}

// A pattern as the API server applies it. The patterns here use only syntax on which Go's RE2
// and ECMAScript agree (classes, groups, counted repetition, anchors).
bool MatchesPattern(const std::string& pattern, const std::string& value) {
  return std::regex_search(value, std::regex(pattern, std::regex::ECMAScript));
}

// Checks `value` (a manifest's YAML) against `schema` as the API server would before CEL rules:
// known fields, types, required fields, enums, bounds, lengths and patterns. One message per
// problem, naming the path.
void ValidateValue(const YAML::Node& value, const YAML::Node& schema, const std::string& path,
                   std::vector<std::string>* errors) {
  const std::string type = Scalar(Get(schema, "type"));
  const bool plain = value.IsScalar() && value.Tag() == "?";
  if (type == "object") {
    if (!value.IsMap()) {
      errors->push_back(path + ": not an object");
      return;
    }
    for (const std::string& required : Strings(Get(schema, "required"))) {
      if (!Get(value, required).IsDefined()) errors->push_back(path + "." + required + ": missing");
    }
    if (Get(schema, "x-kubernetes-preserve-unknown-fields").as<bool>(false)) return;
    const YAML::Node properties = Get(schema, "properties");
    const YAML::Node additional = Get(schema, "additionalProperties");
    for (const auto& entry : value) {
      const std::string key = entry.first.Scalar();
      const YAML::Node property = Get(properties, key);
      if (property.IsDefined()) {
        ValidateValue(entry.second, property, path + "." + key, errors);
      } else if (additional.IsMap()) {
        ValidateValue(entry.second, additional, path + "." + key, errors);
      } else {
        errors->push_back(path + "." + key + ": unknown field");
      }
    }
    return;
  }
  if (type == "array") {
    if (!value.IsSequence()) {
      errors->push_back(path + ": not a list");
      return;
    }
    const std::optional<int64_t> max_items = Integer(Get(schema, "maxItems"));
    if (max_items && static_cast<int64_t>(value.size()) > *max_items) {
      errors->push_back(path + ": more than " + std::to_string(*max_items) + " items");
    }
    for (size_t i = 0; i < value.size(); ++i) {
      ValidateValue(value[i], Get(schema, "items"), path + "[" + std::to_string(i) + "]", errors);
    }
    return;
  }
  if (!value.IsScalar()) {
    errors->push_back(path + ": not a " + type);
    return;
  }
  const std::string text = value.Scalar();
  if (type == "integer") {
    const std::optional<int64_t> number = plain ? Integer(value) : std::nullopt;
    if (!number) {
      errors->push_back(path + ": '" + text + "' is not an integer");
      return;
    }
    const std::optional<int64_t> minimum = Integer(Get(schema, "minimum"));
    const std::optional<int64_t> maximum = Integer(Get(schema, "maximum"));
    if (minimum && *number < *minimum) errors->push_back(path + ": below the minimum");
    if (maximum && *number > *maximum) errors->push_back(path + ": above the maximum");
  } else if (type == "boolean") {
    if (!plain || (text != "true" && text != "false")) {
      errors->push_back(path + ": '" + text + "' is not a boolean");
    }
  } else if (type == "string") {
    // A plain scalar that YAML reads as a number, a boolean or null is not a string.
    static const std::regex kNotString("^(-?[0-9]+(\\.[0-9]*)?|true|false|True|False|null|~)$");
    if (plain && std::regex_match(text, kNotString)) {
      errors->push_back(path + ": '" + text + "' is not a string (quote it)");
      return;
    }
    const std::optional<int64_t> min_length = Integer(Get(schema, "minLength"));
    const std::optional<int64_t> max_length = Integer(Get(schema, "maxLength"));
    if (min_length && static_cast<int64_t>(text.size()) < *min_length) {
      errors->push_back(path + ": shorter than minLength");
    }
    if (max_length && static_cast<int64_t>(text.size()) > *max_length) {
      errors->push_back(path + ": longer than maxLength");
    }
    const std::string pattern = Scalar(Get(schema, "pattern"));
    if (!pattern.empty() && !MatchesPattern(pattern, text)) {
      errors->push_back(path + ": '" + text + "' does not match " + pattern);
    }
  } else {
    errors->push_back(path + ": the schema has no type");
  }
  const std::vector<std::string> allowed = Strings(Get(schema, "enum"));
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
    errors->push_back(path + ": '" + text + "' is not one of the enum");
  }
}

// The errors of a whole manifest against a CRD's schema (metadata is the API server's).
std::vector<std::string> ValidateManifest(const YAML::Node& manifest, const YAML::Node& crd) {
  std::vector<std::string> errors;
  YAML::Node copy = YAML::Clone(manifest);
  copy.remove("metadata");
  ValidateValue(copy, RootSchema(crd), "", &errors);
  return errors;
}

// ----------------------------------------------------------------------------------------------
// What every CRD shares, once per CRD.

struct CrdCase {
  std::string file;
  std::string kind;
  std::string plural;
  std::string singular;
  std::string short_name;
  // Printer columns, in order: name, JSONPath, type, priority.
  struct Column {
    std::string name;
    std::string json_path;
    std::string type;
    int priority;
  };
  std::vector<Column> columns;
};

std::string CaseName(const ::testing::TestParamInfo<CrdCase>& info) { return info.param.kind; }
void PrintTo(const CrdCase& c, std::ostream* os) { *os << c.file; }

const CrdCase kProfileJob = {"crds/profilejob.yaml",
                             "ProfileJob",
                             "profilejobs",
                             "profilejob",
                             "pj",
                             {{"Phase", ".status.phase", "string", 0},
                              {"Succeeded", ".status.targetsSucceeded", "string", 0},
                              {"Skew", ".status.summary.maxStartSkew", "string", 0},
                              {"Stragglers", ".status.analysis.stragglers", "string", 0},
                              {"Run", ".status.runName", "string", 0},
                              {"Logdir", ".spec.logdir", "string", 1},
                              {"Age", ".metadata.creationTimestamp", "date", 0}}};

const CrdCase kProfileSchedule = {"crds/profileschedule.yaml",
                                  "ProfileSchedule",
                                  "profileschedules",
                                  "profileschedule",
                                  "psched",
                                  {{"Schedule", ".spec.schedule", "string", 0},
                                   {"TimeZone", ".spec.timeZone", "string", 0},
                                   {"Suspend", ".spec.suspend", "boolean", 0},
                                   {"Active", ".status.activeCount", "integer", 0},
                                   {"Last Schedule", ".status.lastScheduleTime", "date", 0},
                                   {"Age", ".metadata.creationTimestamp", "date", 0}}};

class CrdTest : public ::testing::TestWithParam<CrdCase> {
 protected:
  void SetUp() override {
    crd_.reset(LoadSourceFile(GetParam().file));
    ASSERT_TRUE(crd_.IsMap()) << GetParam().file << " is not a YAML mapping";
    root_.reset(RootSchema(crd_));
    ASSERT_TRUE(root_.IsMap()) << GetParam().file << " has no openAPIV3Schema";
  }

  YAML::Node crd_;
  YAML::Node root_;
};

TEST_P(CrdTest, GroupNamesAndScope) {
  const CrdCase& c = GetParam();
  EXPECT_EQ(Scalar(Get(crd_, "apiVersion")), "apiextensions.k8s.io/v1");
  EXPECT_EQ(Scalar(Get(crd_, "kind")), "CustomResourceDefinition");
  EXPECT_EQ(Scalar(Get(Get(crd_, "metadata"), "name")), c.plural + ".clusterprof.io");
  const YAML::Node spec = Get(crd_, "spec");
  EXPECT_EQ(Scalar(Get(spec, "group")), "clusterprof.io");
  EXPECT_EQ(Scalar(Get(spec, "scope")), "Namespaced");
  const YAML::Node names = Get(spec, "names");
  EXPECT_EQ(Scalar(Get(names, "kind")), c.kind);
  EXPECT_EQ(Scalar(Get(names, "listKind")), c.kind + "List");
  EXPECT_EQ(Scalar(Get(names, "plural")), c.plural);
  EXPECT_EQ(Scalar(Get(names, "singular")), c.singular);
  EXPECT_THAT(Strings(Get(names, "shortNames")), ElementsAre(c.short_name));
  EXPECT_THAT(Strings(Get(names, "categories")), ElementsAre("clusterprof"));
}

TEST_P(CrdTest, OneServedStoredVersionWithAStatusSubresource) {
  ASSERT_EQ(Get(Get(crd_, "spec"), "versions").size(), 1u);
  const YAML::Node version = Version(crd_);
  EXPECT_EQ(Scalar(Get(version, "name")), "v1alpha1");
  EXPECT_TRUE(Get(version, "served").as<bool>(false));
  EXPECT_TRUE(Get(version, "storage").as<bool>(false));
  const YAML::Node subresources = Get(version, "subresources");
  ASSERT_TRUE(subresources.IsMap());
  EXPECT_EQ(subresources.size(), 1u) << "only the status subresource";
  const YAML::Node status = Get(subresources, "status");
  ASSERT_TRUE(status.IsMap());
  EXPECT_EQ(status.size(), 0u);
  EXPECT_THAT(Strings(Get(root_, "required")), ElementsAre("spec"));
  EXPECT_TRUE(SchemaAt(root_, "status").IsMap());
}

TEST_P(CrdTest, PrinterColumnsResolveToSchemaFieldsOfTheirType) {
  const YAML::Node columns = Get(Version(crd_), "additionalPrinterColumns");
  ASSERT_TRUE(columns.IsSequence());
  std::vector<std::string> names;
  for (const YAML::Node& column : columns) names.push_back(Scalar(Get(column, "name")));
  std::vector<std::string> expected_names;
  for (const CrdCase::Column& column : GetParam().columns) expected_names.push_back(column.name);
  ASSERT_EQ(names, expected_names);

  for (size_t i = 0; i < columns.size(); ++i) {
    const CrdCase::Column& expected = GetParam().columns[i];
    const YAML::Node column = columns[i];
    SCOPED_TRACE(expected.name);
    EXPECT_EQ(Scalar(Get(column, "jsonPath")), expected.json_path);
    EXPECT_EQ(Scalar(Get(column, "type")), expected.type);
    EXPECT_EQ(Integer(Get(column, "priority")).value_or(0), expected.priority);
    if (expected.json_path == ".metadata.creationTimestamp") continue;
    ASSERT_EQ(expected.json_path[0], '.');
    const YAML::Node field = SchemaAt(root_, expected.json_path.substr(1));
    ASSERT_TRUE(field.IsMap()) << expected.json_path << " is not a field of the schema";
    if (expected.type == "date") {
      EXPECT_EQ(Scalar(Get(field, "type")), "string");
      EXPECT_EQ(Scalar(Get(field, "format")), "date-time");
    } else {
      EXPECT_EQ(Scalar(Get(field, "type")), expected.type);
    }
  }
}

TEST_P(CrdTest, EveryFieldHasADescription) {
  std::vector<std::string> missing;
  WalkSchemas(root_, "", [&](const std::string& path, const YAML::Node& schema) {
    // The root's metadata is ObjectMeta: the API server describes it. List items and map values
    // are described by their list or map.
    if (path == ".metadata" || EndsWith(path, "[]") || EndsWith(path, "{}")) return;
    const std::string description = Scalar(Get(schema, "description"));
    if (description.size() < 10) missing.push_back(path.empty() ? "(root)" : path);
  });
  EXPECT_THAT(missing, IsEmpty());
}

TEST_P(CrdTest, SchemaIsStructural) {
  // The keywords a v1 CRD schema may use here (anyOf, oneOf, allOf, not, $ref, uniqueItems and
  // the like are not allowed, or not structural); anything else is most likely a typo that the
  // API server would reject or, for x-kubernetes-* extensions, silently ignore.
  static const std::set<std::string> kKeywords = {
      "type",
      "format",
      "description",
      "properties",
      "items",
      "additionalProperties",
      "required",
      "enum",
      "default",
      "minimum",
      "maximum",
      "minLength",
      "maxLength",
      "pattern",
      "minItems",
      "maxItems",
      "minProperties",
      "maxProperties",
      "x-kubernetes-preserve-unknown-fields",
      "x-kubernetes-list-type",
      "x-kubernetes-list-map-keys",
      "x-kubernetes-map-type",
      "x-kubernetes-validations",
  };
  static const std::set<std::string> kTypes = {"object",  "array",  "string",
                                               "integer", "number", "boolean"};
  std::vector<std::string> problems;
  WalkSchemas(root_, "", [&](const std::string& path, const YAML::Node& schema) {
    const std::string where = path.empty() ? "(root)" : path;
    if (!schema.IsMap()) {
      problems.push_back(where + ": not a schema");
      return;
    }
    for (const auto& entry : schema) {
      if (kKeywords.count(entry.first.Scalar()) == 0) {
        problems.push_back(where + ": keyword " + entry.first.Scalar());
      }
    }
    const std::string type = Scalar(Get(schema, "type"));
    if (kTypes.count(type) == 0) problems.push_back(where + ": type '" + type + "'");
    const YAML::Node properties = Get(schema, "properties");
    if (properties.IsDefined() && Get(schema, "additionalProperties").IsDefined()) {
      problems.push_back(where + ": properties and additionalProperties together");
    }
    if ((properties.IsDefined() || Get(schema, "additionalProperties").IsDefined()) &&
        type != "object") {
      problems.push_back(where + ": properties on a " + type);
    }
    if (type == "array" && !Get(schema, "items").IsMap()) {
      problems.push_back(where + ": an array without items");
    }
    for (const std::string& required : Strings(Get(schema, "required"))) {
      if (!Get(properties, required).IsDefined()) {
        problems.push_back(where + ": required " + required + " is not a property");
      }
    }
    const std::string format = Scalar(Get(schema, "format"));
    if (!format.empty()) {
      const bool fits = (type == "integer" && (format == "int32" || format == "int64")) ||
                        (type == "string" && format == "date-time");
      if (!fits) problems.push_back(where + ": format " + format + " on a " + type);
    }
    const std::string list_type = Scalar(Get(schema, "x-kubernetes-list-type"));
    if (!list_type.empty() && type != "array")
      problems.push_back(where + ": list-type on non-list");
    if (list_type == "map") {
      const YAML::Node items = Get(schema, "items");
      for (const std::string& key : Strings(Get(schema, "x-kubernetes-list-map-keys"))) {
        const std::vector<std::string> required = Strings(Get(items, "required"));
        if (std::find(required.begin(), required.end(), key) == required.end()) {
          problems.push_back(where + ": list map key " + key + " is not required");
        }
      }
    }
    if (list_type == "set") {
      const std::string item_type = Scalar(Get(Get(schema, "items"), "type"));
      if (item_type == "object" || item_type == "array") {
        problems.push_back(where + ": a set of " + item_type + "s");
      }
    }
    if (Get(schema, "x-kubernetes-preserve-unknown-fields").IsDefined() &&
        (path == ".spec" || path == ".status" || path.empty())) {
      problems.push_back(where + ": preserves unknown fields (no pruning)");
    }
  });
  EXPECT_THAT(problems, IsEmpty());
  // Only the root may describe metadata, and only as an object.
  const YAML::Node metadata = SchemaAt(root_, "metadata");
  ASSERT_TRUE(metadata.IsMap());
  EXPECT_EQ(metadata.size(), 1u);
  EXPECT_EQ(Scalar(Get(metadata, "type")), "object");
}

TEST_P(CrdTest, DefaultsFitTheirSchemas) {
  std::vector<std::string> problems;
  WalkSchemas(root_, "", [&](const std::string& path, const YAML::Node& schema) {
    const YAML::Node value = Get(schema, "default");
    if (!value.IsDefined()) return;
    // Defaults never apply inside maps.
    if (path.find("{}") != std::string::npos) problems.push_back(path + ": default in a map");
    // Since Kubernetes 1.25 a default must also pass the CEL rules of its schema: an empty
    // object under a rule that wants a field makes the whole CRD invalid there.
    if (Get(schema, "x-kubernetes-validations").IsDefined()) {
      problems.push_back(path + ": a default beside CEL rules");
    }
    std::vector<std::string> errors;
    ValidateValue(value, schema, path, &errors);
    problems.insert(problems.end(), errors.begin(), errors.end());
  });
  EXPECT_THAT(problems, IsEmpty());
}

TEST_P(CrdTest, CelRulesUseOnlyRuleAndMessage) {
  // messageExpression (1.27), fieldPath and reason (1.28) are unknown fields to older servers
  // with CEL: kubectl's strict field validation would refuse the CRD there.
  int rules = 0;
  std::vector<std::string> problems;
  WalkSchemas(root_, "", [&](const std::string& path, const YAML::Node& schema) {
    const YAML::Node list = Get(schema, "x-kubernetes-validations");
    if (!list.IsDefined()) return;
    if (!list.IsSequence()) {
      problems.push_back(path + ": x-kubernetes-validations is not a list");
      return;
    }
    for (const YAML::Node& rule : list) {
      ++rules;
      for (const auto& entry : rule) {
        const std::string key = entry.first.Scalar();
        if (key != "rule" && key != "message") problems.push_back(path + ": " + key);
      }
      if (Scalar(Get(rule, "rule")).empty()) problems.push_back(path + ": an empty rule");
      if (Scalar(Get(rule, "message")).empty()) problems.push_back(path + ": no message");
    }
  });
  EXPECT_GT(rules, 0);
  EXPECT_THAT(problems, IsEmpty());
}

const CrdCase kProfileTrigger = {"crds/profiletrigger.yaml",
                                 "ProfileTrigger",
                                 "profiletriggers",
                                 "profiletrigger",
                                 "ptrig",
                                 {{"Rules", ".status.rules", "string", 1},
                                  {"Pods", ".status.pods", "integer", 0},
                                  {"Step Time", ".status.stepTime", "string", 0},
                                  {"Baseline", ".status.baseline", "string", 0},
                                  {"Last Fired", ".status.lastFiredTime", "date", 0},
                                  {"Last Job", ".status.lastJob", "string", 0},
                                  {"Age", ".metadata.creationTimestamp", "date", 0}}};

INSTANTIATE_TEST_SUITE_P(Crds, CrdTest,
                         ::testing::Values(kProfileJob, kProfileSchedule, kProfileTrigger),
                         CaseName);

// ----------------------------------------------------------------------------------------------
// The ProfileJob spec, as the operator reads it. Checked in ProfileJob and in ProfileSchedule's
// job template.

struct IntegerField {
  std::string path;
  std::string format;
  std::optional<int64_t> minimum;
  std::optional<int64_t> maximum;
  std::optional<int64_t> default_value;
};

void ExpectIntegerField(const YAML::Node& spec, const IntegerField& expected) {
  SCOPED_TRACE(expected.path);
  const YAML::Node field = SchemaAt(spec, expected.path);
  ASSERT_TRUE(field.IsMap()) << "no such field";
  EXPECT_EQ(Scalar(Get(field, "type")), "integer");
  EXPECT_EQ(Scalar(Get(field, "format")), expected.format);
  EXPECT_EQ(Integer(Get(field, "minimum")), expected.minimum);
  EXPECT_EQ(Integer(Get(field, "maximum")), expected.maximum);
  EXPECT_EQ(Integer(Get(field, "default")), expected.default_value);
}

void ExpectProfileJobSpec(const YAML::Node& spec) {
  ASSERT_TRUE(spec.IsMap());
  EXPECT_EQ(Scalar(Get(spec, "type")), "object");
  EXPECT_THAT(Strings(Get(spec, "required")), UnorderedElementsAre("targets", "logdir"));
  EXPECT_THAT(
      [&] {
        std::vector<std::string> keys;
        for (const auto& entry : Get(spec, "properties")) keys.push_back(entry.first.Scalar());
        return keys;
      }(),
      UnorderedElementsAre("targets", "durationMs", "delayMs", "lookbackMs", "logdir", "runName",
                           "tracingAttempts", "options", "queueTimeoutSeconds",
                           "ttlSecondsAfterFinished"));

  const std::optional<int64_t> none;
  for (const IntegerField& field : std::vector<IntegerField>{
           {"targets.port", "int32", 1, 65535, none},
           {"targets.minReady", "int32", 0, none, 1},
           {"targets.maxTargets", "int32", 1, 100000, 20000},
           {"targets.waitSeconds", "int64", 0, 86400, 120},
           {"durationMs", "int64", 1, 600000, 2000},
           {"delayMs", "int64", 0, 3600000, 1000},
           {"lookbackMs", "int64", 0, 3600000, 0},
           {"tracingAttempts", "int32", 1, 10, 3},
           {"options.hostTracerLevel", "int32", 0, 3, 2},
           {"options.deviceTracerLevel", "int32", 0, 2, 1},
           {"options.pythonTracerLevel", "int32", 0, 1, 0},
           {"queueTimeoutSeconds", "int64", 0, 86400, 600},
           {"ttlSecondsAfterFinished", "int32", 0, none, none},
       }) {
    ExpectIntegerField(spec, field);
  }

  // targets has no default: {} would break its own rule (a selector or an address).
  const YAML::Node targets = SchemaAt(spec, "targets");
  EXPECT_FALSE(Get(targets, "default").IsDefined());
  const YAML::Node selector = SchemaAt(spec, "targets.selector");
  EXPECT_EQ(Scalar(Get(selector, "type")), "object");
  EXPECT_EQ(Scalar(Get(Get(SchemaAt(spec, "targets.selector.matchLabels"), "additionalProperties"),
                       "type")),
            "string");
  EXPECT_THAT(Strings(Get(SchemaAt(spec, "targets.selector.matchExpressions[].operator"), "enum")),
              ElementsAre("In", "NotIn", "Exists", "DoesNotExist"));
  EXPECT_THAT(Strings(Get(SchemaAt(spec, "targets.selector.matchExpressions[]"), "required")),
              UnorderedElementsAre("key", "operator"));
  EXPECT_EQ(Scalar(Get(SchemaAt(spec, "targets.selector.matchExpressions[].values"), "type")),
            "array");
  const YAML::Node addresses = SchemaAt(spec, "targets.addresses");
  EXPECT_EQ(Integer(Get(addresses, "maxItems")), 1000);
  EXPECT_FALSE(Scalar(Get(Get(addresses, "items"), "pattern")).empty());

  const YAML::Node logdir = SchemaAt(spec, "logdir");
  EXPECT_EQ(Scalar(Get(logdir, "type")), "string");
  EXPECT_EQ(Integer(Get(logdir, "minLength")), 1);
  EXPECT_EQ(Integer(Get(logdir, "maxLength")), 1024);
  const YAML::Node run_name = SchemaAt(spec, "runName");
  EXPECT_EQ(Integer(Get(run_name, "maxLength")), 128);
  EXPECT_EQ(Scalar(Get(run_name, "pattern")), "^[A-Za-z0-9][A-Za-z0-9._-]*$");
  EXPECT_FALSE(Get(run_name, "default").IsDefined()) << "the operator picks the start time";

  const YAML::Node options = SchemaAt(spec, "options");
  ASSERT_TRUE(Get(options, "default").IsMap());
  EXPECT_EQ(Get(options, "default").size(), 0u);
  const YAML::Node advanced = SchemaAt(spec, "options.advancedConfiguration");
  EXPECT_EQ(Scalar(Get(advanced, "type")), "object");
  EXPECT_TRUE(Get(advanced, "x-kubernetes-preserve-unknown-fields").as<bool>(false));
}

// The CEL rules of `schema` as (rule, message) pairs.
std::vector<std::pair<std::string, std::string>> Rules(const YAML::Node& schema) {
  std::vector<std::pair<std::string, std::string>> rules;
  const YAML::Node list = Get(schema, "x-kubernetes-validations");
  if (!list.IsSequence()) return rules;
  for (const YAML::Node& rule : list) {
    rules.emplace_back(Scalar(Get(rule, "rule")), Scalar(Get(rule, "message")));
  }
  return rules;
}

// The rules every ProfileJob spec has, immutability aside.
void ExpectProfileJobSpecRules(const YAML::Node& spec) {
  EXPECT_THAT(Rules(SchemaAt(spec, "targets")),
              ElementsAre(std::pair<std::string, std::string>(
                  "has(self.selector) || (has(self.addresses) && size(self.addresses) > 0)",
                  "targets needs a selector or at least one address")));
  const auto logdir_rules = Rules(SchemaAt(spec, "logdir"));
  ASSERT_EQ(logdir_rules.size(), 1u);
  EXPECT_EQ(logdir_rules[0].first,
            "self.startsWith('gs://') || self.startsWith('/') || self.startsWith('file:///')");
  const auto expression_rules = Rules(SchemaAt(spec, "targets.selector.matchExpressions[]"));
  ASSERT_EQ(expression_rules.size(), 1u);
  EXPECT_THAT(expression_rules[0].second, ::testing::HasSubstr("In and NotIn need values"));
}

// One CRD file's schema: the root, spec and status.
class CrdSchemaTest : public ::testing::Test {
 protected:
  void Load(const std::string& file) {
    crd_.reset(LoadSourceFile(file));
    root_.reset(RootSchema(crd_));
    ASSERT_TRUE(root_.IsMap());
    spec_.reset(SchemaAt(root_, "spec"));
    status_.reset(SchemaAt(root_, "status"));
  }

  YAML::Node crd_;
  YAML::Node root_;
  YAML::Node spec_;
  YAML::Node status_;
};

class ProfileJobCrdTest : public CrdSchemaTest {
 protected:
  void SetUp() override { Load(kProfileJob.file); }
};

TEST_F(ProfileJobCrdTest, SpecFieldsDefaultsAndBounds) { ExpectProfileJobSpec(spec_); }

TEST_F(ProfileJobCrdTest, CelRules) {
  EXPECT_THAT(Rules(spec_), ElementsAre(std::pair<std::string, std::string>(
                                "self == oldSelf",
                                "spec is immutable: delete the ProfileJob and create a new one")));
  ExpectProfileJobSpecRules(spec_);
}

TEST_F(ProfileJobCrdTest, LogdirPattern) {
  const std::string pattern = Scalar(Get(SchemaAt(spec_, "logdir"), "pattern"));
  for (const char* good : {"gs://my-bucket/tensorboard/llama", "gs://abc", "gs://abc/",
                           "gs://a_b.c-d9/x/y", "/data/tb", "/", "file:///data/tb"}) {
    EXPECT_TRUE(MatchesPattern(pattern, good)) << good;
  }
  for (const std::string& bad : std::vector<std::string>{
           "s3://x", "gs://My-Bucket/x", "gs://ab/x", "gs://-abc/x", "gs://abc-/x", "gs:/abc",
           "tb/relative", "file://host/x", "", "gs://" + std::string(64, 'a') + "/x", "/a\nb"}) {
    EXPECT_FALSE(MatchesPattern(pattern, bad)) << bad;
  }
  EXPECT_TRUE(MatchesPattern(pattern, "gs://" + std::string(63, 'a') + "/x"));
}

TEST_F(ProfileJobCrdTest, RunNamePattern) {
  const std::string pattern = Scalar(Get(SchemaAt(spec_, "runName"), "pattern"));
  for (const char* good : {"2024_01_02_03_04_05", "step_1200", "a", "v1.2-rc"}) {
    EXPECT_TRUE(MatchesPattern(pattern, good)) << good;
  }
  for (const char* bad : {"../x", "..", ".hidden", "a/b", "", "-x", "a b", "a\\b"}) {
    EXPECT_FALSE(MatchesPattern(pattern, bad)) << bad;
  }
}

TEST_F(ProfileJobCrdTest, AddressPattern) {
  const std::string pattern = Scalar(Get(SchemaAt(spec_, "targets.addresses[]"), "pattern"));
  for (const char* good : {"10.0.0.5:8466", "trainer-0.trainer.ml.svc:8466", "[fd00::5]:8466",
                           "localhost:1", "h:65535", "H:6553"}) {
    EXPECT_TRUE(MatchesPattern(pattern, good)) << good;
  }
  for (const char* bad : {"10.0.0.5", "h:0", "h:65536", "h:99999", "h:08466", "grpc://h:1", ":8466",
                          "h:port", "-h:1", "fd00::5:8466"}) {
    EXPECT_FALSE(MatchesPattern(pattern, bad)) << bad;
  }
}

TEST_F(ProfileJobCrdTest, StatusIsTypedForTheOperator) {
  EXPECT_THAT(Strings(Get(SchemaAt(status_, "phase"), "enum")),
              ElementsAre("Pending", "Scheduled", "Capturing", "Succeeded", "PartiallySucceeded",
                          "Failed"));
  for (const char* field : {"message", "runName", "runURI", "targetsSucceeded", "manifestURI",
                            "summary.maxStartSkew"}) {
    EXPECT_EQ(Scalar(Get(SchemaAt(status_, field), "type")), "string") << field;
  }
  for (const char* field : {"startTime", "completionTime"}) {
    EXPECT_EQ(Scalar(Get(SchemaAt(status_, field), "format")), "date-time") << field;
  }
  for (const char* field :
       {"startTimeNs", "observedGeneration", "summary.maxStartSkewNs", "targets[].events",
        "targets[].droppedEvents", "targets[].bytes", "targets[].clockOffsetNs",
        "targets[].clockUncertaintyNs", "targets[].startErrorNs"}) {
    EXPECT_EQ(Scalar(Get(SchemaAt(status_, field), "format")), "int64") << field;
  }
  for (const char* field : {"attempt", "targets[].attempts", "summary.targets", "summary.succeeded",
                            "summary.empty", "summary.failed"}) {
    EXPECT_EQ(Scalar(Get(SchemaAt(status_, field), "format")), "int32") << field;
  }
  for (const char* field : {"targets[].name", "targets[].address", "targets[].node",
                            "targets[].file", "targets[].message"}) {
    EXPECT_EQ(Scalar(Get(SchemaAt(status_, field), "type")), "string") << field;
  }
  EXPECT_THAT(Strings(Get(SchemaAt(status_, "targets[].phase"), "enum")),
              ElementsAre("Pending", "Capturing", "Succeeded", "Empty", "Failed", "Skipped"));
}

// What keeps a 10,000-target job's object small is bounded in the schema too: the API server
// refuses a status that lists more than the operator does (docs/operator.md, "Status at scale").
TEST_F(ProfileJobCrdTest, TheListsOfAJobAreBounded) {
  EXPECT_EQ(Scalar(Get(SchemaAt(status_, "targets"), "maxItems")), "100");
  EXPECT_EQ(Scalar(Get(SchemaAt(status_, "analysis.hosts"), "maxItems")), "20");
  EXPECT_EQ(Scalar(Get(SchemaAt(status_, "summary.slowestStarts"), "maxItems")), "5");
  for (const char* field : {"targetsNotListed", "analysis.hostsNotListed", "summary.skipped"}) {
    EXPECT_EQ(Scalar(Get(SchemaAt(status_, field), "format")), "int32") << field;
  }
  for (const char* field : {"summary.startErrorP50Ns", "summary.startErrorP99Ns"}) {
    EXPECT_EQ(Scalar(Get(SchemaAt(status_, field), "format")), "int64") << field;
  }
}

// metav1.Condition, as the API conventions define it.
void ExpectConditions(const YAML::Node& status) {
  const YAML::Node conditions = SchemaAt(status, "conditions");
  ASSERT_TRUE(conditions.IsMap());
  EXPECT_EQ(Scalar(Get(conditions, "x-kubernetes-list-type")), "map");
  EXPECT_THAT(Strings(Get(conditions, "x-kubernetes-list-map-keys")), ElementsAre("type"));
  const YAML::Node item = Get(conditions, "items");
  EXPECT_THAT(Strings(Get(item, "required")),
              UnorderedElementsAre("type", "status", "lastTransitionTime", "reason", "message"));
  EXPECT_THAT(Strings(Get(SchemaAt(item, "status"), "enum")),
              ElementsAre("True", "False", "Unknown"));
  EXPECT_EQ(Scalar(Get(SchemaAt(item, "lastTransitionTime"), "format")), "date-time");
  EXPECT_EQ(Scalar(Get(SchemaAt(item, "observedGeneration"), "format")), "int64");
  const std::string reason = Scalar(Get(SchemaAt(item, "reason"), "pattern"));
  EXPECT_TRUE(MatchesPattern(reason, "TargetsResolved"));
  EXPECT_TRUE(MatchesPattern(reason, "Capture_Failed:Timeout"));
  EXPECT_FALSE(MatchesPattern(reason, "not ready"));
  EXPECT_FALSE(MatchesPattern(reason, "1Reason"));
  const std::string type = Scalar(Get(SchemaAt(item, "type"), "pattern"));
  EXPECT_TRUE(MatchesPattern(type, "Ready"));
  EXPECT_TRUE(MatchesPattern(type, "clusterprof.io/Captured"));
  EXPECT_FALSE(MatchesPattern(type, "Not Ready"));
}

TEST_F(ProfileJobCrdTest, ConditionsAreMetav1Conditions) { ExpectConditions(status_); }

class ProfileScheduleCrdTest : public CrdSchemaTest {
 protected:
  void SetUp() override { Load(kProfileSchedule.file); }
};

TEST_F(ProfileScheduleCrdTest, SpecFieldsDefaultsAndBounds) {
  EXPECT_THAT(Strings(Get(spec_, "required")), UnorderedElementsAre("schedule", "jobTemplate"));
  const YAML::Node schedule = SchemaAt(spec_, "schedule");
  EXPECT_EQ(Scalar(Get(schedule, "type")), "string");
  EXPECT_EQ(Integer(Get(schedule, "minLength")), 1);
  EXPECT_THAT(Scalar(Get(schedule, "description")), ::testing::HasSubstr("*/30 * * * *"));
  EXPECT_THAT(Scalar(Get(schedule, "description")), ::testing::HasSubstr("@hourly"));
  EXPECT_EQ(Scalar(Get(SchemaAt(spec_, "timeZone"), "type")), "string");
  EXPECT_FALSE(Get(SchemaAt(spec_, "timeZone"), "default").IsDefined()) << "unset means UTC";

  const YAML::Node policy = SchemaAt(spec_, "concurrencyPolicy");
  EXPECT_THAT(Strings(Get(policy, "enum")), ElementsAre("Allow", "Forbid", "Replace"));
  EXPECT_EQ(Scalar(Get(policy, "default")), "Forbid");
  EXPECT_THAT(Scalar(Get(policy, "description")), ::testing::HasSubstr("one capture at a time"));

  const YAML::Node suspend = SchemaAt(spec_, "suspend");
  EXPECT_EQ(Scalar(Get(suspend, "type")), "boolean");
  EXPECT_EQ(Scalar(Get(suspend, "default")), "false");

  const std::optional<int64_t> none;
  ExpectIntegerField(spec_, {"startingDeadlineSeconds", "int64", 0, none, none});
  ExpectIntegerField(spec_, {"successfulJobsHistoryLimit", "int32", 0, none, 3});
  ExpectIntegerField(spec_, {"failedJobsHistoryLimit", "int32", 0, none, 1});

  const YAML::Node job_template = SchemaAt(spec_, "jobTemplate");
  EXPECT_THAT(Strings(Get(job_template, "required")), ElementsAre("spec"));
  for (const char* map : {"jobTemplate.metadata.labels", "jobTemplate.metadata.annotations"}) {
    EXPECT_EQ(Scalar(Get(Get(SchemaAt(spec_, map), "additionalProperties"), "type")), "string")
        << map;
  }
}

TEST_F(ProfileScheduleCrdTest, TimeZonePattern) {
  const std::string pattern = Scalar(Get(SchemaAt(spec_, "timeZone"), "pattern"));
  for (const char* good : {"", "UTC", "Etc/UTC", "Europe/Berlin", "America/Argentina/Buenos_Aires",
                           "Etc/GMT+5", "America/Port-au-Prince"}) {
    EXPECT_TRUE(MatchesPattern(pattern, good)) << good;
  }
  for (const char* bad :
       {"../etc/passwd", "/etc/localtime", "Europe/../../x", "Europe Berlin", "Europe/"}) {
    EXPECT_FALSE(MatchesPattern(pattern, bad)) << bad;
  }
}

TEST_F(ProfileScheduleCrdTest, CelRules) {
  const auto schedule_rules = Rules(SchemaAt(spec_, "schedule"));
  ASSERT_EQ(schedule_rules.size(), 2u);
  EXPECT_EQ(schedule_rules[0], (std::pair<std::string, std::string>(
                                   "!self.startsWith('TZ=') && !self.startsWith('CRON_TZ=')",
                                   "use spec.timeZone instead of a TZ= prefix")));
  EXPECT_THAT(schedule_rules[1].first, ::testing::StartsWith("self.startsWith('@') || "));
  EXPECT_THAT(schedule_rules[1].second, ::testing::HasSubstr("five fields"));
  // The schedule, unlike a ProfileJob, may change.
  EXPECT_THAT(Rules(spec_), IsEmpty());
  ExpectProfileJobSpecRules(SchemaAt(spec_, "jobTemplate.spec"));
}

TEST_F(ProfileScheduleCrdTest, JobTemplateSpecIsTheProfileJobSpecButMutable) {
  const YAML::Node job_spec = SchemaAt(RootSchema(LoadSourceFile(kProfileJob.file)), "spec");
  const YAML::Node template_spec = SchemaAt(spec_, "jobTemplate.spec");
  ASSERT_TRUE(job_spec.IsMap());
  ASSERT_TRUE(template_spec.IsMap());
  EXPECT_EQ(FirstDifference(WithoutDescriptionAndTransitionRules(job_spec),
                            WithoutDescriptionAndTransitionRules(template_spec), "spec"),
            "");
  // No transition rule anywhere in a ProfileSchedule: a template is edited in place.
  WalkSchemas(root_, "", [](const std::string& path, const YAML::Node& schema) {
    for (const auto& rule : Rules(schema)) {
      EXPECT_EQ(rule.first.find("oldSelf"), std::string::npos) << path;
    }
  });
  ExpectProfileJobSpec(template_spec);
}

class ProfileTriggerCrdTest : public CrdSchemaTest {
 protected:
  void SetUp() override { Load(kProfileTrigger.file); }
};

TEST_F(ProfileTriggerCrdTest, TargetsAndCaptureAreTheProfileJobsFields) {
  const YAML::Node job_spec = SchemaAt(RootSchema(LoadSourceFile(kProfileJob.file)), "spec");
  EXPECT_EQ(FirstDifference(WithoutDescriptionAndTransitionRules(SchemaAt(job_spec, "targets")),
                            WithoutDescriptionAndTransitionRules(SchemaAt(spec_, "targets")),
                            "spec.targets"),
            "");
  for (const char* field : {"logdir", "options", "tracingAttempts"}) {
    EXPECT_EQ(FirstDifference(WithoutDescriptionAndTransitionRules(SchemaAt(job_spec, field)),
                              WithoutDescriptionAndTransitionRules(
                                  SchemaAt(spec_, std::string("capture.") + field)),
                              field),
              "");
  }
  // The trigger's own defaults: a short capture that reaches back, at once.
  for (const IntegerField& field : std::vector<IntegerField>{
           {"capture.durationMs", "int64", 1, 600000, 5000},
           {"capture.lookbackMs", "int64", 0, 3600000, 10000},
           {"capture.delayMs", "int64", 0, 3600000, 0},
           {"capture.queueTimeoutSeconds", "int64", 0, 86400, 60},
           {"cooldownSeconds", "int64", 0, 604800, 1800},
           {"maxCapturesPerDay", "int32", 1, 1000, 10},
           {"rules[].straggler.steps", "int32", 14, 1000, 20},
           {"rules[].stepTimeRegression.steps", "int32", 1, 512, 10},
           {"rules[].stepStall.seconds", "int64", 1, 86400, 120},
       }) {
    ExpectIntegerField(spec_, field);
  }
  EXPECT_THAT(Strings(Get(spec_, "required")), UnorderedElementsAre("targets", "rules", "capture"));
}

TEST_F(ProfileScheduleCrdTest, Status) {
  for (const char* field : {"apiVersion", "kind", "name", "namespace", "uid"}) {
    EXPECT_EQ(Scalar(Get(SchemaAt(status_, std::string("active[].") + field), "type")), "string")
        << field;
  }
  EXPECT_EQ(Scalar(Get(SchemaAt(status_, "activeCount"), "format")), "int32");
  EXPECT_EQ(Scalar(Get(SchemaAt(status_, "lastScheduleTime"), "format")), "date-time");
  EXPECT_EQ(Scalar(Get(SchemaAt(status_, "lastSuccessfulTime"), "format")), "date-time");
  EXPECT_EQ(Scalar(Get(SchemaAt(status_, "observedGeneration"), "format")), "int64");
  EXPECT_EQ(Scalar(Get(SchemaAt(status_, "message"), "type")), "string");
  ExpectConditions(status_);
}

// ----------------------------------------------------------------------------------------------
// The examples.

TEST(ExamplesTest, ValidatorCatchesWhatTheServerWould) {
  const YAML::Node crd = LoadSourceFile(kProfileJob.file);
  const YAML::Node good = YAML::Load(R"(
apiVersion: clusterprof.io/v1alpha1
kind: ProfileJob
metadata: {name: x}
spec: {targets: {selector: {}}, logdir: /data, options: {advancedConfiguration: {a: {b: 1}}}}
)");
  EXPECT_THAT(ValidateManifest(good, crd), IsEmpty());
  const YAML::Node bad = YAML::Load(R"(
apiVersion: clusterprof.io/v1alpha1
kind: ProfileJob
metadata: {name: x}
spec:
  targets: {selector: {matchLabels: {app: 1}}, addresses: ["nope"], minReady: -1}
  durationMS: 2000
  delayMs: "1000"
  runName: ../x
  options: {hostTracerLevel: 9}
)");
  EXPECT_THAT(ValidateManifest(bad, crd),
              UnorderedElementsAre(
                  ".spec.logdir: missing",
                  ".spec.targets.selector.matchLabels.app: '1' is not a string (quote it)",
                  ::testing::StartsWith(".spec.targets.addresses[0]: 'nope' does not match"),
                  ".spec.targets.minReady: below the minimum", ".spec.durationMS: unknown field",
                  ".spec.delayMs: '1000' is not an integer",
                  ::testing::StartsWith(".spec.runName: '../x' does not match"),
                  ".spec.options.hostTracerLevel: above the maximum"));
}

TEST(ExamplesTest, ProfileJobExampleFollowsTheSchema) {
  const YAML::Node example = LoadSourceFile("examples/profilejob.yaml");
  ASSERT_TRUE(example.IsMap());
  EXPECT_EQ(Scalar(Get(example, "apiVersion")), "clusterprof.io/v1alpha1");
  EXPECT_EQ(Scalar(Get(example, "kind")), "ProfileJob");
  // No namespace: `kubectl apply -n NS` puts it anywhere.
  EXPECT_FALSE(Get(Get(example, "metadata"), "namespace").IsDefined());
  EXPECT_THAT(ValidateManifest(example, LoadSourceFile(kProfileJob.file)), IsEmpty());

  const YAML::Node spec = Get(example, "spec");
  EXPECT_EQ(Scalar(Get(Get(Get(Get(spec, "targets"), "selector"), "matchLabels"), "app")),
            "llama-trainer");
  EXPECT_EQ(Scalar(Get(spec, "durationMs")), "2000");
  EXPECT_EQ(Scalar(Get(spec, "delayMs")), "1000");
  EXPECT_EQ(Scalar(Get(spec, "logdir")), "gs://my-bucket/tensorboard/llama");
}

TEST(ExamplesTest, ProfileScheduleExampleFollowsTheSchema) {
  const YAML::Node example = LoadSourceFile("examples/profileschedule.yaml");
  ASSERT_TRUE(example.IsMap());
  EXPECT_EQ(Scalar(Get(example, "apiVersion")), "clusterprof.io/v1alpha1");
  EXPECT_EQ(Scalar(Get(example, "kind")), "ProfileSchedule");
  EXPECT_FALSE(Get(Get(example, "metadata"), "namespace").IsDefined());
  EXPECT_THAT(ValidateManifest(example, LoadSourceFile(kProfileSchedule.file)), IsEmpty());

  const YAML::Node spec = Get(example, "spec");
  EXPECT_EQ(Scalar(Get(spec, "schedule")), "*/30 * * * *");
  EXPECT_EQ(Scalar(Get(spec, "timeZone")), "Etc/UTC");
  EXPECT_EQ(Scalar(Get(spec, "concurrencyPolicy")), "Forbid");
  // A fixed run name would make every run overwrite the last.
  EXPECT_FALSE(Get(Get(Get(spec, "jobTemplate"), "spec"), "runName").IsDefined());
}

}  // namespace
}  // namespace clusterprof::crds
