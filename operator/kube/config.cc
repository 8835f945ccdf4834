#include "operator/kube/config.h"

namespace clusterprof::kube {
namespace {
class Static : public TokenSource {
 public:
  explicit Static(std::string t) : t_(std::move(t)) {}
  absl::StatusOr<std::string> Token() override { return t_; }

 private:
  std::string t_;
};
}  // namespace
std::shared_ptr<TokenSource> StaticToken(std::string token) {
  return std::make_shared<Static>(std::move(token));
}
}  // namespace clusterprof::kube
