# The sidecar-injection webhook: registered by tests/CMakeLists.txt through include(), so paths
# are relative to tests/.

# The examples and the AdmissionReview samples are read from the source tree. The path goes to
# these sources only: a path in a compile definition makes ccache miss for every other clone.
set_property(SOURCE
    operator/webhook/injection_test.cc
    operator/webhook/webhook_e2e_test.cc
  APPEND PROPERTY COMPILE_DEFINITIONS
    CLUSTERPROF_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

# HTTPS test helpers: certificates made with the openssl CLI, and an OpenSSL client.
add_library(clusterprof_tls_test_support STATIC support/test_certificates.cc)
target_link_libraries(clusterprof_tls_test_support
  PUBLIC clusterprof_base absl::status absl::statusor
  PRIVATE clusterprof_kube_test_support OpenSSL::SSL OpenSSL::Crypto)

# The patches for the example pods and real AdmissionReview JSON; the injection config file.
clusterprof_add_test(injection_test SOURCES operator/webhook/injection_test.cc
  DEPS clusterprof_webhook cpprestsdk::cpprest yaml-cpp absl::strings)
target_compile_definitions(injection_test PRIVATE CLUSTERPROF_VERSION="${PROJECT_VERSION}"
  _TURN_OFF_PLATFORM_STRING)
# AdmissionReview bodies as the API server could send them: the answer, its patch applied, and
# injection into the patched pod again.
clusterprof_add_fuzzer(admission_review_fuzzer SOURCES operator/webhook/admission_review_fuzzer.cc
  DEPS clusterprof_webhook cpprestsdk::cpprest yaml-cpp absl::strings
  CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/data/fuzz/admission_review)
target_compile_definitions(admission_review_fuzzer PRIVATE _TURN_OFF_PLATFORM_STRING)

# The HTTPS server: AdmissionReviews over TLS, certificate rotation, bad requests, metrics.
clusterprof_add_test(webhook_server_integration_test
  SOURCES operator/webhook/webhook_server_integration_test.cc
  DEPS clusterprof_webhook clusterprof_tls_test_support clusterprof_test_support
    cpprestsdk::cpprest yaml-cpp prometheus-cpp::core)
target_compile_definitions(webhook_server_integration_test PRIVATE _TURN_OFF_PLATFORM_STRING)

# The operator binary serving the webhook to the real API server (tests/support), which calls it
# for the example pods: injection, namespace selection, opt-out, a bad annotation, and pods
# admitted while the webhook is down (failurePolicy Ignore).
clusterprof_add_test(webhook_e2e_test ONE_PROCESS TIMEOUT 600
  SOURCES operator/webhook/webhook_e2e_test.cc
  DEPS clusterprof_kube clusterprof_kube_test_support clusterprof_tls_test_support
    clusterprof_test_support cpprestsdk::cpprest yaml-cpp absl::strings)
add_dependencies(webhook_e2e_test clusterprof-operator)
target_compile_definitions(webhook_e2e_test PRIVATE
  CLUSTERPROF_OPERATOR_PATH="$<TARGET_FILE:clusterprof-operator>")
