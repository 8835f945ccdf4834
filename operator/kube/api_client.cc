#include "operator/kube/api_client.h"

#include <iterator>
#include <utility>

#include "common/base/status.h"

namespace clusterprof::kube {

std::string_view WatchEventTypeName(WatchEvent::Type type) {
  switch (type) {
    case WatchEvent::Type::kAdded:
      return "ADDED";
    case WatchEvent::Type::kModified:
      return "MODIFIED";
    case WatchEvent::Type::kDeleted:
      return "DELETED";
    case WatchEvent::Type::kBookmark:
      return "BOOKMARK";
    case WatchEvent::Type::kError:
      return "ERROR";
  }
  return "UNKNOWN";
}

absl::StatusOr<ObjectList> ApiClient::ListAll(const ResourceType& type, std::string_view ns,
                                              ListOptions options) {
  ObjectList all;
  while (true) {
    CLUSTERPROF_ASSIGN_OR_RETURN(ObjectList page, List(type, ns, options));
    // Every page of a paged list is a snapshot at the first page's resourceVersion.
    if (all.resource_version.empty()) all.resource_version = page.resource_version;
    if (all.items.empty()) {
      all.items = std::move(page.items);
    } else {
      all.items.insert(all.items.end(), std::make_move_iterator(page.items.begin()),
                       std::make_move_iterator(page.items.end()));
    }
    if (page.continue_token.empty()) return all;
    options.continue_token = std::move(page.continue_token);
    // The continue token carries the snapshot; a resourceVersion beside it is an error.
    options.resource_version.clear();
  }
}

}  // namespace clusterprof::kube
