# The node tests (ctest label `node`): our images in real pods on a real single-node cluster
# (docs/development.md, "A real node"). Registered by tests/CMakeLists.txt through include().
#
# A ctest fixture around one test: node_setup builds the images from this build's binaries and
# starts the node (tests/e2e/node_fixture), node_e2e_test walks the user's path on it, and
# node_cleanup stops the node and fails if anything of it was left behind. Without root or
# scripts/install-kube-node's binaries the setup starts nothing and the test skips (exit 77),
# unless CLUSTERPROF_REQUIRE_NODE=1. Not in sanitizer builds: the images carry this build's
# binaries, and the node suite's value is the real path, not instrumentation.
if(CLUSTERPROF_SANITIZE)
  return()
endif()
set(node_fixture ${CMAKE_CURRENT_SOURCE_DIR}/e2e/node_fixture)
add_test(NAME node_setup COMMAND ${node_fixture} setup ${PROJECT_BINARY_DIR})
add_test(NAME node_cleanup COMMAND ${node_fixture} cleanup ${PROJECT_BINARY_DIR})
add_test(NAME node_e2e_test
  COMMAND ${CLUSTERPROF_TEST_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/node_e2e_test.py)
set_tests_properties(node_setup PROPERTIES
  LABELS node FIXTURES_SETUP node TIMEOUT 1800 RUN_SERIAL TRUE)
set_tests_properties(node_cleanup PROPERTIES
  LABELS node FIXTURES_CLEANUP node TIMEOUT 120 RUN_SERIAL TRUE)
set_tests_properties(node_e2e_test PROPERTIES
  LABELS node FIXTURES_REQUIRED node TIMEOUT 1200 RUN_SERIAL TRUE SKIP_RETURN_CODE 77
  ENVIRONMENT "CLUSTERPROF_SOURCE_DIR=${PROJECT_SOURCE_DIR};CLUSTERPROF_BINARY_DIR=${PROJECT_BINARY_DIR}")

# README.md's "On Kubernetes" block run as written (registry and bucket replaced) on the same
# node after node_e2e_test, which leaves the cluster without a release; then users' roles
# through edit and view, the restricted Pod Security Standard on injected pods, and the upgrade
# from the last commit's chart with the CRDs applied first. It removes what it made.
add_test(NAME readme_e2e_test
  COMMAND ${CLUSTERPROF_TEST_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/readme_e2e_test.py)
set_tests_properties(readme_e2e_test PROPERTIES
  LABELS node FIXTURES_REQUIRED node DEPENDS node_e2e_test TIMEOUT 1200 RUN_SERIAL TRUE
  SKIP_RETURN_CODE 77
  ENVIRONMENT "CLUSTERPROF_SOURCE_DIR=${PROJECT_SOURCE_DIR};CLUSTERPROF_BINARY_DIR=${PROJECT_BINARY_DIR}")
