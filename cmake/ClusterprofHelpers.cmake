# Build helpers shared by every component.

# Applies CLUSTERPROF_SANITIZE to the whole build. Sanitizer builds compile at -O1 (what the
# sanitizers' authors recommend: fast enough, with reports that match the source), which with
# line tables builds about 2.4 times faster than -O2 -g under ASan+UBSan (bench/RESULTS.md,
# "How long scripts/test takes").
# Links `target` (an executable) with jemalloc, which then serves every malloc of the process,
# with the settings of common/base/jemalloc_conf.cc; nothing in sanitizer builds.
function(clusterprof_use_jemalloc target)
  if(TARGET PkgConfig::JEMALLOC)
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/common/base/jemalloc_conf.cc)
    target_link_libraries(${target} PRIVATE PkgConfig::JEMALLOC)
  endif()
endfunction()

macro(clusterprof_configure_sanitizers)
  if(NOT CLUSTERPROF_SANITIZE STREQUAL "")
    add_compile_options("$<$<COMPILE_LANGUAGE:C,CXX>:-O1>")
  endif()
  if(CLUSTERPROF_SANITIZE STREQUAL "address")
    add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
    add_link_options(-fsanitize=address,undefined)
  elseif(CLUSTERPROF_SANITIZE STREQUAL "thread")
    # Debian's protobuf and abseil are prebuilt without TSan, and their headers change class
    # layouts when __SANITIZE_THREAD__ is defined (protobuf's MapFieldBase gains two members):
    # undefine it so our code and the prebuilt libraries agree.
    add_compile_options(-fsanitize=thread -fno-omit-frame-pointer -U__SANITIZE_THREAD__)
    add_link_options(-fsanitize=thread)
  elseif(NOT CLUSTERPROF_SANITIZE STREQUAL "")
    message(FATAL_ERROR "CLUSTERPROF_SANITIZE must be '', 'address' or 'thread', not '${CLUSTERPROF_SANITIZE}'")
  endif()
endmacro()

# clusterprof_add_test(NAME SOURCES... [DEPS targets...] [LABELS extra...] [TIMEOUT s]
#                      [ONE_PROCESS] [CPPREST])
# Builds a GoogleTest binary and registers its tests with ctest. The label comes from the name's
# suffix: _test -> unit, _integration_test -> integration, _e2e_test -> e2e.
# ctest runs each test in a process of its own; with ONE_PROCESS it runs the whole binary as one
# ctest test instead, for suites that share an expensive fixture (a Kubernetes control plane)
# across their tests. ctest then reports the binary as a whole: a test of it that skipped shows
# in its output only (a skip regular expression would also hide the failures of the others).
# CPPREST: the tests make HTTP requests through cpprestsdk; under ASan they get the LeakSanitizer
# suppressions of tests/support/lsan.supp (leaks inside prebuilt libraries).
function(clusterprof_add_test name)
  cmake_parse_arguments(ARG "ONE_PROCESS;CPPREST" "TIMEOUT" "SOURCES;DEPS;LABELS" ${ARGN})
  if(name MATCHES "_e2e_test$")
    set(label e2e)
  elseif(name MATCHES "_integration_test$")
    set(label integration)
  elseif(name MATCHES "_test$")
    set(label unit)
  else()
    message(FATAL_ERROR "test target '${name}' must end in _test, _integration_test or _e2e_test")
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} GTest::gmock GTest::gtest_main)
  set(environment)
  if(CLUSTERPROF_SANITIZE STREQUAL "thread")
    set(environment "TSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/support/tsan.supp")
  endif()
  if(ARG_CPPREST AND CLUSTERPROF_SANITIZE STREQUAL "address")
    # One variable (gtest_discover_tests would split a list of two): the unwinding options are
    # common sanitizer flags, which LSAN_OPTIONS sets too. Deep stacks: cpprestsdk's task frames
    # sit below a dozen template frames.
    set(environment "LSAN_OPTIONS=suppressions=${PROJECT_SOURCE_DIR}/tests/support/lsan.supp:\
fast_unwind_on_malloc=0:malloc_context_size=30")
  endif()
  if(ARG_ONE_PROCESS)
    add_test(NAME ${name} COMMAND ${name})
    set_tests_properties(${name} PROPERTIES
      LABELS "${label};${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "${environment}")
  else()
    gtest_discover_tests(${name}
      DISCOVERY_TIMEOUT 60
      PROPERTIES LABELS "${label};${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                 ENVIRONMENT "${environment}")
  endif()
endfunction()

# clusterprof_add_fuzzer(NAME SOURCES... DEPS targets... CORPUS dir)
# With CLUSTERPROF_BUILD_FUZZERS (clang) this is a libFuzzer binary. Otherwise it links a small
# driver that replays every file of the corpus, and ctest runs that replay under the label fuzz,
# so the corpus stays a regression suite in every build.
function(clusterprof_add_fuzzer name)
  cmake_parse_arguments(ARG "" "CORPUS" "SOURCES;DEPS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS})
  if(CLUSTERPROF_BUILD_FUZZERS)
    target_compile_options(${name} PRIVATE -fsanitize=fuzzer)
    target_link_options(${name} PRIVATE -fsanitize=fuzzer)
    # libFuzzer only sees the code built with coverage instrumentation, and the code under test is
    # in the libraries: instrument every project library the fuzzer links, transitively (imported
    # targets such as protobuf and abseil are prebuilt and stay as they are). The link option
    # gives any other executable that links an instrumented library (tests, the CLI) the runtime
    # that defines the coverage callbacks.
    set(pending ${ARG_DEPS})
    set(instrumented)
    while(pending)
      list(POP_FRONT pending dep)
      if(NOT TARGET ${dep} OR dep IN_LIST instrumented)
        continue()
      endif()
      get_target_property(imported ${dep} IMPORTED)
      get_target_property(type ${dep} TYPE)
      if(imported OR type STREQUAL "INTERFACE_LIBRARY")
        continue()
      endif()
      list(APPEND instrumented ${dep})
      target_compile_options(${dep} PRIVATE -fsanitize=fuzzer-no-link)
      target_link_options(${dep} INTERFACE -fsanitize=fuzzer-no-link)
      get_target_property(links ${dep} LINK_LIBRARIES)
      if(links)
        list(APPEND pending ${links})
      endif()
    endwhile()
  else()
    target_sources(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests/support/fuzz_replay_main.cc)
  endif()
  add_test(NAME ${name} COMMAND ${name} ${ARG_CORPUS})
  set_tests_properties(${name} PROPERTIES LABELS fuzz TIMEOUT 300)
endfunction()
