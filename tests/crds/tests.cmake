# CRD tests: registered by tests/CMakeLists.txt through include(), so paths are relative to
# tests/.

# Both read crds/ and examples/ from the source tree. The path goes to these two sources only: a
# path in a compile definition makes ccache miss for every other clone.
set_property(SOURCE
    crds/crd_schema_test.cc
    crds/crd_apply_integration_test.cc
  APPEND PROPERTY COMPILE_DEFINITIONS
    CLUSTERPROF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# The CRDs' shape: names, printer columns, structural schemas, descriptions, defaults, bounds,
# CEL rules, and the examples against the schemas.
clusterprof_add_test(crd_schema_test SOURCES crds/crd_schema_test.cc DEPS yaml-cpp)

# The CRDs and the examples applied to a real kube-apiserver (kubectl and the REST client):
# defaulting, pruning, validation errors, the status subresource, printer columns.
clusterprof_add_test(crd_apply_integration_test ONE_PROCESS
  SOURCES crds/crd_apply_integration_test.cc
  DEPS clusterprof_kube clusterprof_kube_test_support)
if(CLUSTERPROF_SANITIZE STREQUAL "address")
  # HTTPS through cpprestsdk: see tests/support/lsan.supp.
  set_tests_properties(crd_apply_integration_test PROPERTIES ENVIRONMENT
    "ASAN_OPTIONS=fast_unwind_on_malloc=0:malloc_context_size=8;\
LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/support/lsan.supp")
endif()
