// Label selectors, as Kubernetes defines them: the string form of list requests
// ("app=trainer,tier in (a,b),!canary") and the metav1.LabelSelector object of specs
// ({matchLabels, matchExpressions}). Both parse to the same requirements, which match label
// sets and print back as the string form.
#ifndef CLUSTERPROF_OPERATOR_KUBE_SELECTOR_H_
#define CLUSTERPROF_OPERATOR_KUBE_SELECTOR_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "cpprest/json.h"
#include "operator/kube/object.h"

namespace clusterprof::kube {

struct LabelRequirement {
  enum class Operator { kEquals, kNotEquals, kIn, kNotIn, kExists, kDoesNotExist };
  std::string key;
  Operator op = Operator::kEquals;
  // One value for kEquals/kNotEquals; one or more for kIn/kNotIn; none otherwise. Sorted.
  std::vector<std::string> values;

  bool Matches(const StringMap& labels) const;
};

// A conjunction of requirements. Empty matches everything. Immutable once built; thread-safe.
class LabelSelector {
 public:
  LabelSelector() = default;

  // The string form. InvalidArgument naming the position for a malformed selector.
  static absl::StatusOr<LabelSelector> Parse(std::string_view text);
  // A metav1.LabelSelector object. Null (or absent) is not accepted here: callers decide
  // whether "no selector" means nothing or everything. InvalidArgument naming the field.
  static absl::StatusOr<LabelSelector> FromJson(const web::json::value& selector);

  bool Matches(const StringMap& labels) const;
  bool empty() const { return requirements_.empty(); }
  const std::vector<LabelRequirement>& requirements() const { return requirements_; }

  // The string form, requirements sorted by key: parses back to an equal selector.
  std::string ToString() const;

 private:
  std::vector<LabelRequirement> requirements_;
};

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_SELECTOR_H_
