// Which collection of the API a request is about: group, version, resource name, and whether
// it lives in namespaces. The well-known ones the operator uses are below; custom resources are
// built the same way.
#ifndef CLUSTERPROF_OPERATOR_KUBE_RESOURCE_H_
#define CLUSTERPROF_OPERATOR_KUBE_RESOURCE_H_

#include <string>
#include <string_view>

namespace clusterprof::kube {

struct ResourceType {
  std::string group;     // "" for the core group
  std::string version;   // "v1"
  std::string resource;  // plural, lower case: "pods"
  std::string kind;      // "Pod", for the objects the client creates
  bool namespaced = true;

  // "v1" or "coordination.k8s.io/v1": an object's apiVersion.
  std::string ApiVersion() const;
  // "/api/v1" or "/apis/coordination.k8s.io/v1".
  std::string ApiPrefix() const;
  // The collection's path: "/api/v1/namespaces/NS/pods", or "/api/v1/pods" across namespaces
  // (`ns` empty) and for cluster-scoped resources.
  std::string CollectionPath(std::string_view ns) const;
  // An object's path, with an optional subresource: ".../pods/NAME/status".
  std::string ObjectPath(std::string_view ns, std::string_view name,
                         std::string_view subresource = "") const;
  // "pods" or "leases.coordination.k8s.io", for messages.
  std::string Describe() const;
};

ResourceType Pods();
ResourceType Namespaces();
ResourceType ConfigMaps();
ResourceType Events();
ResourceType Leases();
ResourceType CustomResourceDefinitions();
ResourceType Roles();
ResourceType RoleBindings();

}  // namespace clusterprof::kube

#endif  // CLUSTERPROF_OPERATOR_KUBE_RESOURCE_H_
