# The tests behind docs/security.md's claims that no other suite makes: registered by
# tests/CMakeLists.txt through include(), so paths are relative to tests/.

# The logdir allowlist from a ProfileJob's spec through the operator's check, the sidecar's and
# the confined write: look-alike buckets and prefixes, '..', schemes, percent signs, symbolic
# links at every level of the run layout, and run and host names.
clusterprof_add_test(logdir_allowlist_test SOURCES security/logdir_allowlist_test.cc
  DEPS clusterprof_sidecar_lib clusterprof_api clusterprof_storage
    clusterprof_fake_http_transport clusterprof_test_support)

# The webhook's patches against docs/webhook.md's table "What a pod gets": every operation an
# "add" at a documented path with a documented value, for representative pods and settings;
# everything else of the pod and its containers left as it was; the sidecar locked down.
set_property(SOURCE security/webhook_patch_scope_test.cc
  APPEND PROPERTY COMPILE_DEFINITIONS CLUSTERPROF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
clusterprof_add_test(webhook_patch_scope_test SOURCES security/webhook_patch_scope_test.cc
  DEPS clusterprof_webhook cpprestsdk::cpprest yaml-cpp absl::strings)
target_compile_definitions(webhook_patch_scope_test PRIVATE _TURN_OFF_PLATFORM_STRING)

# The chart's RBAC on a real kube-apiserver: the operator's ServiceAccount may do exactly what
# the rendered roles grant (SubjectAccessReviews over a matrix of resources, verbs and
# namespaces; SelfSubjectRulesReviews as the account), and never read Secrets, exec, port-forward,
# mint tokens, impersonate, escalate or touch nodes, namespaces, webhooks or CRDs. Skipped
# without helm (helm/tests.cmake says where it comes from) or the control plane.
set_property(SOURCE security/operator_rbac_integration_test.cc
  APPEND PROPERTY COMPILE_DEFINITIONS CLUSTERPROF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
clusterprof_add_test(operator_rbac_integration_test ONE_PROCESS TIMEOUT 600
  SOURCES security/operator_rbac_integration_test.cc
  DEPS clusterprof_kube clusterprof_kube_test_support yaml-cpp cpprestsdk::cpprest)
set_tests_properties(operator_rbac_integration_test PROPERTIES
  SKIP_RETURN_CODE 77 ENVIRONMENT "${helm_test_environment}")
if(CLUSTERPROF_SANITIZE STREQUAL "address")
  # HTTPS through cpprestsdk: see tests/support/lsan.supp.
  set_tests_properties(operator_rbac_integration_test PROPERTIES ENVIRONMENT
    "${helm_test_environment};ASAN_OPTIONS=fast_unwind_on_malloc=0:malloc_context_size=8;\
LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/support/lsan.supp")
endif()

# The operator binary over every namespace, against the real API server: two namespaces with
# the same pod (name and labels) and a sidecar each, a third with none; a ProfileJob captures
# its own namespace's pod only.
set_property(SOURCE security/namespace_isolation_e2e_test.cc
  APPEND PROPERTY COMPILE_DEFINITIONS CLUSTERPROF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
clusterprof_add_test(namespace_isolation_e2e_test ONE_PROCESS TIMEOUT 600
  SOURCES security/namespace_isolation_e2e_test.cc
  DEPS clusterprof_controllers clusterprof_kube_test_support cpprestsdk::cpprest)
add_dependencies(namespace_isolation_e2e_test clusterprof-operator clusterprof-sidecar
  test_annotator train_loop)
target_compile_definitions(namespace_isolation_e2e_test PRIVATE
  CLUSTERPROF_OPERATOR_PATH="$<TARGET_FILE:clusterprof-operator>"
  CLUSTERPROF_SIDECAR_PATH="$<TARGET_FILE:clusterprof-sidecar>"
  CLUSTERPROF_TEST_ANNOTATOR_PATH="$<TARGET_FILE:test_annotator>"
  CLUSTERPROF_TRAIN_LOOP_PATH="$<TARGET_FILE:train_loop>")
if(CLUSTERPROF_SANITIZE STREQUAL "address")
  # HTTPS through cpprestsdk: see tests/support/lsan.supp.
  set_tests_properties(namespace_isolation_e2e_test PROPERTIES ENVIRONMENT
    "ASAN_OPTIONS=fast_unwind_on_malloc=0:malloc_context_size=8;\
LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/support/lsan.supp")
endif()
