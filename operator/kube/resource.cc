#include "operator/kube/resource.h"

#include "common/base/strings.h"

namespace clusterprof::kube {

std::string ResourceType::ApiVersion() const {
  return group.empty() ? version : StrCat(group, "/", version);
}

std::string ResourceType::ApiPrefix() const {
  return group.empty() ? StrCat("/api/", version) : StrCat("/apis/", group, "/", version);
}

std::string ResourceType::CollectionPath(std::string_view ns) const {
  if (!namespaced || ns.empty()) return StrCat(ApiPrefix(), "/", resource);
  return StrCat(ApiPrefix(), "/namespaces/", ns, "/", resource);
}

std::string ResourceType::ObjectPath(std::string_view ns, std::string_view name,
                                     std::string_view subresource) const {
  std::string path = StrCat(CollectionPath(ns), "/", name);
  if (!subresource.empty()) StrAppend(&path, "/", subresource);
  return path;
}

std::string ResourceType::Describe() const {
  return group.empty() ? resource : StrCat(resource, ".", group);
}

ResourceType Pods() { return {"", "v1", "pods", "Pod", true}; }
ResourceType Namespaces() { return {"", "v1", "namespaces", "Namespace", false}; }
ResourceType ConfigMaps() { return {"", "v1", "configmaps", "ConfigMap", true}; }
ResourceType Events() { return {"", "v1", "events", "Event", true}; }
ResourceType Leases() { return {"coordination.k8s.io", "v1", "leases", "Lease", true}; }
ResourceType CustomResourceDefinitions() {
  return {"apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition",
          false};
}
ResourceType Roles() { return {"rbac.authorization.k8s.io", "v1", "roles", "Role", true}; }
ResourceType RoleBindings() {
  return {"rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", true};
}

}  // namespace clusterprof::kube
