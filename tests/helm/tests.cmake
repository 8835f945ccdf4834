# Helm chart tests (helm/clusterprof): registered by tests/CMakeLists.txt through include(), so
# paths are relative to tests/.
#
# Helm comes from CLUSTERPROF_HELM (this cache variable, else the environment variable of that
# name at test time, which scripts/test exports from scripts/install-helm), else
# scripts/install-helm's cache, else PATH. Without one both tests exit 77: ctest reports them as
# skipped, with the reason in their output.
set(CLUSTERPROF_HELM "" CACHE FILEPATH
  "Helm 3 binary for the chart's tests (empty: $CLUSTERPROF_HELM at test time, then scripts/install-helm's cache, then PATH)")
set(helm_test_environment "CLUSTERPROF_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
if(CLUSTERPROF_HELM)
  list(APPEND helm_test_environment "CLUSTERPROF_HELM=${CLUSTERPROF_HELM}")
endif()

# The chart rendered with helm lint and helm template, every document parsed and checked:
# RBAC against the operator's calls, the Deployment, the webhook and its certificate (openssl),
# the injection config, the token, the sidecars' TLS certificate and CA (openssl), a Deployment
# that a new token or certificate leaves unchanged, the NetworkPolicy, the ServiceMonitor, the
# schema.
add_test(NAME helm_chart_test
  COMMAND ${CLUSTERPROF_TEST_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/helm/chart_test.py)
set_tests_properties(helm_chart_test PROPERTIES
  LABELS unit TIMEOUT 300 SKIP_RETURN_CODE 77 ENVIRONMENT "${helm_test_environment}")

# The rendered chart applied to a real kube-apiserver, and the operator binary run with the
# chart's flags and files under exactly the rendered ClusterRole and lease Role, capturing a
# ProfileJob from a real sidecar that requires the chart's token and serves TLS with the chart's
# certificate; then upgrades rendered against that server (lookup): the sidecars' CA, certificate
# and token kept, the certificate renewed from the same CA, the token replaced.
set_property(SOURCE helm/chart_apply_integration_test.cc
  APPEND PROPERTY COMPILE_DEFINITIONS CLUSTERPROF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
clusterprof_add_test(helm_chart_apply_integration_test ONE_PROCESS TIMEOUT 600
  SOURCES helm/chart_apply_integration_test.cc
  DEPS clusterprof_kube clusterprof_controllers clusterprof_kube_test_support yaml-cpp
       cpprestsdk::cpprest)
add_dependencies(helm_chart_apply_integration_test
  clusterprof-operator clusterprof-sidecar test_annotator)
target_compile_definitions(helm_chart_apply_integration_test PRIVATE
  CLUSTERPROF_OPERATOR_PATH="$<TARGET_FILE:clusterprof-operator>"
  CLUSTERPROF_SIDECAR_PATH="$<TARGET_FILE:clusterprof-sidecar>"
  CLUSTERPROF_TEST_ANNOTATOR_PATH="$<TARGET_FILE:test_annotator>")
set_tests_properties(helm_chart_apply_integration_test PROPERTIES
  SKIP_RETURN_CODE 77 ENVIRONMENT "${helm_test_environment}")
if(CLUSTERPROF_SANITIZE STREQUAL "address")
  # HTTPS through cpprestsdk: see tests/support/lsan.supp.
  set_tests_properties(helm_chart_apply_integration_test PROPERTIES ENVIRONMENT
    "${helm_test_environment};ASAN_OPTIONS=fast_unwind_on_malloc=0:malloc_context_size=8;\
LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/support/lsan.supp")
endif()

# The Grafana dashboard's queries (helm/clusterprof/dashboards/clusterprof.json) against the
# metrics the operator and the sidecar really export, through a PromQL checker
# (helm/promql_check.h) whose own tests are in the same binary.
add_library(clusterprof_promql_check STATIC helm/promql_check.cc)
target_link_libraries(clusterprof_promql_check PUBLIC clusterprof_base absl::status absl::statusor)
set_property(SOURCE helm/dashboard_queries_test.cc
  APPEND PROPERTY COMPILE_DEFINITIONS CLUSTERPROF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
clusterprof_add_test(dashboard_queries_test CPPREST
  SOURCES helm/dashboard_queries_test.cc
  DEPS clusterprof_promql_check clusterprof_controllers clusterprof_sidecar_lib
       prometheus-cpp::core cpprestsdk::cpprest)
# cpprest's U() macro collides with GoogleTest's template parameters.
target_compile_definitions(dashboard_queries_test PRIVATE _TURN_OFF_PLATFORM_STRING)
