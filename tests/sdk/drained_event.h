// Test helper: drains every ring file in a directory, as the sidecar's annotation tracer does,
// into plain structs, and describes an event's full metadata (inline args and the TraceMe
// metadata in its name) as the sidecar would decode it.
#ifndef CLUSTERPROF_TESTS_SDK_DRAINED_EVENT_H_
#define CLUSTERPROF_TESTS_SDK_DRAINED_EVENT_H_

#include <bit>
#include <cstdint>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "common/xspace/traceme.h"
#include "gtest/gtest.h"
#include "sdk/shm_format.h"
#include "sidecar/tracers/ring_reader.h"

namespace clusterprof::testing {

struct DrainedEvent {
  std::string name;  // as recorded: may carry TraceMe metadata
  std::string thread;
  uint32_t tid = 0;
  uint32_t pid = 0;
  shm::RecordKind kind = shm::RecordKind::kComplete;
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  uint64_t async_id = 0;
  std::vector<std::string> args;  // inline args, "key=type:value" with type i, u, d or s

  // The decoded name, and every stat: the inline args, then the name's metadata, typed as the
  // TraceMe decoder types them ("key=i:7", "key=s:text").
  std::string BaseName() const { return std::string(traceme::Decode(name).name); }
  std::vector<std::string> Stats() const {
    std::vector<std::string> stats = args;
    for (const traceme::Stat& stat : traceme::Decode(name).stats) {
      std::string text = std::string(stat.key) + "=";
      std::visit(
          [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, int64_t>) {
              text += "i:" + std::to_string(v);
            } else if constexpr (std::is_same_v<T, uint64_t>) {
              text += "u:" + std::to_string(v);
            } else if constexpr (std::is_same_v<T, double>) {
              text += "d:" + std::to_string(v);
            } else {
              text += "s:" + std::string(v);
            }
          },
          stat.value);
      stats.push_back(std::move(text));
    }
    return stats;
  }
};

inline std::string DescribeArg(const shm::RingReader& reader, const shm::Arg& arg) {
  std::string value;
  switch (arg.type) {
    case shm::ArgType::kInt64:
      value = "i:" + std::to_string(static_cast<int64_t>(arg.value));
      break;
    case shm::ArgType::kUint64:
      value = "u:" + std::to_string(arg.value);
      break;
    case shm::ArgType::kDouble:
      value = "d:" + std::to_string(std::bit_cast<double>(arg.value));
      break;
    case shm::ArgType::kString:
      value = "s:" + std::string(reader.String(static_cast<uint32_t>(arg.value)));
      break;
    default:
      value = "?";
  }
  return std::string(reader.String(arg.key_id)) + "=" + value;
}

// Every record written to the ring files in `dir` since the last drain, file by file, thread by
// thread in write order.
inline std::vector<DrainedEvent> DrainEvents(const std::string& dir) {
  std::vector<DrainedEvent> events;
  auto files = shm::ListRingFiles(dir);
  if (!files.ok()) return events;
  for (const std::string& file : *files) {
    auto reader = shm::RingReader::Open(file);
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) continue;
    const shm::RingReader& r = **reader;
    (*reader)->Drain([&](const shm::ThreadInfo& thread, const shm::Record& record) {
      DrainedEvent event;
      event.name = std::string(r.String(record.name_id));
      event.thread = std::string(thread.name);
      event.tid = thread.tid;
      event.pid = r.pid();
      event.kind = record.kind;
      event.start_ns = record.start_ns;
      event.end_ns = record.end_ns;
      event.async_id = record.async_id;
      for (int i = 0; i < record.num_args && i < shm::kMaxInlineArgs; ++i) {
        event.args.push_back(DescribeArg(r, record.args[i]));
      }
      events.push_back(std::move(event));
    });
  }
  return events;
}

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SDK_DRAINED_EVENT_H_
