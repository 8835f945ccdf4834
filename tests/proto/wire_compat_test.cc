// Wire compatibility with the TensorFlow/JAX profiler protocol (docs/protocol.md, "Messages").
//
// The bytes here are built by hand from the contract's field numbers and wire types, never by our
// own serializer, so a wrong number, a wrong scalar type (int64 vs sint64, double vs float) or a
// wrong package in our .proto files fails these tests even though our code would round-trip its
// own mistakes happily. The reverse direction (our serializer against the same hand-built bytes)
// checks what we send to upstream servers and clients.
#include <bit>
#include <cstdint>
#include <future>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>

#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "clusterprof/v1alpha1/sidecar.pb.h"
#include "common/base/mutex.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tsl/profiler/protos/profiler_options.pb.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"
#include "tsl/profiler/protos/profiler_service.pb.h"
#include "tsl/profiler/protos/profiler_service_monitor_result.pb.h"
#include "tsl/profiler/protos/xplane.pb.h"

namespace clusterprof {
namespace {

using ::tensorflow::MonitorRequest;
using ::tensorflow::MonitorResponse;
using ::tensorflow::ProfileOptions;
using ::tensorflow::ProfileRequest;
using ::tensorflow::ProfileResponse;
using ::tensorflow::ProfilerServiceMonitorResult;
using ::tensorflow::ProfileToolData;
using ::tensorflow::RemoteProfilerSessionManagerOptions;
using ::tensorflow::TerminateRequest;
using ::tensorflow::TerminateResponse;
using ::tensorflow::ToolRequestOptions;
using ::tensorflow::profiler::XEvent;
using ::tensorflow::profiler::XEventMetadata;
using ::tensorflow::profiler::XLine;
using ::tensorflow::profiler::XPlane;
using ::tensorflow::profiler::XSpace;
using ::tensorflow::profiler::XStat;
using ::tensorflow::profiler::XStatMetadata;

// ---------------------------------------------------------------------------------------------
// A minimal protobuf wire encoder (https://protobuf.dev/programming-guides/encoding/).

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

std::string Varint(uint64_t value) {
  std::string out;
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
  return out;
}

std::string Tag(uint32_t field, WireType type) {
  return Varint((static_cast<uint64_t>(field) << 3) | type);
}

// uint64, uint32, bool and enums as they are; int64 and int32 as two's complement (a negative
// value takes ten bytes: int32 is sign-extended, and neither is zigzag like sint64).
std::string VarintField(uint32_t field, uint64_t value) {
  return Tag(field, kVarint) + Varint(value);
}
std::string Int64Field(uint32_t field, int64_t value) {
  return VarintField(field, static_cast<uint64_t>(value));
}

std::string BytesField(uint32_t field, std::string_view payload) {
  return Tag(field, kLengthDelimited) + Varint(payload.size()) + std::string(payload);
}

std::string DoubleField(uint32_t field, double value) {
  uint64_t bits = std::bit_cast<uint64_t>(value);
  std::string out = Tag(field, kFixed64);
  for (int i = 0; i < 8; ++i) {
    out.push_back(static_cast<char>(bits & 0xff));
    bits >>= 8;
  }
  return out;
}

// A map<K, V> entry is a nested message with the key as field 1 and the value as field 2.
std::string MapEntry(uint32_t field, std::string_view key_field, std::string_view value_field) {
  return BytesField(field, std::string(key_field) + std::string(value_field));
}

std::string Cat(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& part : parts) out += part;
  return out;
}

template <typename Message>
Message ParseOrDie(const std::string& bytes) {
  Message message;
  EXPECT_TRUE(message.ParseFromString(bytes)) << Message::descriptor()->full_name();
  return message;
}

std::string SerializeDeterministic(const google::protobuf::Message& message) {
  std::string out;
  {
    google::protobuf::io::StringOutputStream stream(&out);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    EXPECT_TRUE(message.SerializeToCodedStream(&coded));
  }
  return out;
}

std::string Hex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 0xf]);
  }
  return out;
}

// The encoder itself, checked against byte values from the protobuf encoding guide, so that the
// tests below do not rest on a helper that shares our misunderstanding.
TEST(WireEncoderTest, MatchesTheProtobufEncodingGuide) {
  EXPECT_EQ(Hex(Varint(1)), "01");
  EXPECT_EQ(Hex(Varint(150)), "9601");
  EXPECT_EQ(Hex(Varint(300)), "ac02");
  EXPECT_EQ(Hex(VarintField(1, 150)), "089601");
  EXPECT_EQ(Hex(BytesField(2, "testing")), "120774657374696e67");
  EXPECT_EQ(Hex(Int64Field(1, -2)), "08feffffffffffffffff01");
  EXPECT_EQ(Hex(DoubleField(2, 1.0)), "11000000000000f03f");
  EXPECT_EQ(Hex(Tag(10, kVarint)), "50");
  EXPECT_EQ(Hex(Tag(16, kLengthDelimited)), "8201");
}

// ---------------------------------------------------------------------------------------------
// Service messages (package tensorflow).

std::string ToolRequestOptionsBytes() { return Cat({BytesField(2, "json,pb"), VarintField(3, 1)}); }

TEST(WireCompatTest, ToolRequestOptions) {
  const auto options = ParseOrDie<ToolRequestOptions>(ToolRequestOptionsBytes());
  EXPECT_EQ(options.output_formats(), "json,pb");
  EXPECT_TRUE(options.save_to_repo());
  EXPECT_EQ(SerializeDeterministic(options), ToolRequestOptionsBytes());
}

std::string TraceOptionsBytes() { return VarintField(1, 0xffff'0000'0000'0001ULL); }

// All 15 fields, in ascending order (as a deterministic serializer writes them), and the three
// kinds of advanced configuration value, with map keys in ascending order.
std::string ProfileOptionsBytes() {
  return Cat({
      VarintField(1, 1),                             // include_dataset_ops
      VarintField(2, 2),                             // host_tracer_level
      VarintField(3, 1),                             // device_tracer_level
      VarintField(4, 1),                             // python_tracer_level
      VarintField(5, 1),                             // version
      VarintField(6, 2),                             // device_type GPU
      VarintField(7, 1),                             // enable_hlo_proto
      VarintField(8, 1'778'042'856'123'456'789ULL),  // start_timestamp_ns
      VarintField(9, 2000),                          // duration_ms
      BytesField(10, "/logs/plugins/profile"),       // repository_path
      BytesField(11, TraceOptionsBytes()),           // trace_options
      MapEntry(12, BytesField(1, "delay_ms"), BytesField(2, Int64Field(3, -7))),
      MapEntry(12, BytesField(1, "gpu_max_events"), BytesField(2, Int64Field(3, 4'000'000))),
      MapEntry(12, BytesField(1, "override_hostname"), BytesField(2, BytesField(1, "worker-0"))),
      MapEntry(12, BytesField(1, "trace_python"), BytesField(2, VarintField(2, 1))),
      VarintField(13, 1),                     // raise_error_on_start_failure
      BytesField(14, "2026_05_06_04_47_36"),  // session_id
      BytesField(15, "host-a"),               // override_hostname
  });
}

void ExpectProfileOptions(const ProfileOptions& opts) {
  EXPECT_TRUE(opts.include_dataset_ops());
  EXPECT_EQ(opts.host_tracer_level(), 2u);
  EXPECT_EQ(opts.device_tracer_level(), 1u);
  EXPECT_EQ(opts.python_tracer_level(), 1u);
  EXPECT_EQ(opts.version(), 1u);
  EXPECT_EQ(opts.device_type(), ProfileOptions::GPU);
  EXPECT_TRUE(opts.enable_hlo_proto());
  EXPECT_EQ(opts.start_timestamp_ns(), 1'778'042'856'123'456'789ULL);
  EXPECT_EQ(opts.duration_ms(), 2000u);
  EXPECT_EQ(opts.repository_path(), "/logs/plugins/profile");
  EXPECT_EQ(opts.trace_options().host_traceme_filter_mask(), 0xffff'0000'0000'0001ULL);
  ASSERT_EQ(opts.advanced_configuration_size(), 4);
  const auto& config = opts.advanced_configuration();
  ASSERT_TRUE(config.contains("override_hostname"));
  EXPECT_EQ(config.at("override_hostname").value_case(),
            ProfileOptions::AdvancedConfigValue::kStringValue);
  EXPECT_EQ(config.at("override_hostname").string_value(), "worker-0");
  ASSERT_TRUE(config.contains("trace_python"));
  EXPECT_EQ(config.at("trace_python").value_case(),
            ProfileOptions::AdvancedConfigValue::kBoolValue);
  EXPECT_TRUE(config.at("trace_python").bool_value());
  ASSERT_TRUE(config.contains("gpu_max_events"));
  EXPECT_EQ(config.at("gpu_max_events").value_case(),
            ProfileOptions::AdvancedConfigValue::kInt64Value);
  EXPECT_EQ(config.at("gpu_max_events").int64_value(), 4'000'000);
  ASSERT_TRUE(config.contains("delay_ms"));
  EXPECT_EQ(config.at("delay_ms").int64_value(), -7);
  EXPECT_TRUE(opts.raise_error_on_start_failure());
  EXPECT_EQ(opts.session_id(), "2026_05_06_04_47_36");
  EXPECT_EQ(opts.override_hostname(), "host-a");
}

TEST(WireCompatTest, ProfileOptionsAllFields) {
  const auto opts = ParseOrDie<ProfileOptions>(ProfileOptionsBytes());
  ExpectProfileOptions(opts);
  EXPECT_EQ(Hex(SerializeDeterministic(opts)), Hex(ProfileOptionsBytes()));
}

TEST(WireCompatTest, ProfileOptionsDeviceTypes) {
  const std::pair<uint64_t, ProfileOptions::DeviceType> kTypes[] = {
      {0, ProfileOptions::UNSPECIFIED},
      {1, ProfileOptions::CPU},
      {2, ProfileOptions::GPU},
      {3, ProfileOptions::TPU},
      {4, ProfileOptions::PLUGGABLE_DEVICE},
  };
  for (const auto& [number, type] : kTypes) {
    const auto opts = ParseOrDie<ProfileOptions>(VarintField(6, number));
    EXPECT_EQ(opts.device_type(), type) << number;
  }
}

TEST(WireCompatTest, AdvancedConfigValueOneofLastWins) {
  // A value that arrives twice with different members keeps the last, as any protobuf parser.
  const auto value = ParseOrDie<ProfileOptions::AdvancedConfigValue>(
      Cat({BytesField(1, "text"), VarintField(2, 1), Int64Field(3, 42)}));
  EXPECT_EQ(value.value_case(), ProfileOptions::AdvancedConfigValue::kInt64Value);
  EXPECT_EQ(value.int64_value(), 42);
}

std::string ProfileRequestBytes() {
  return Cat({
      VarintField(1, 1500),                    // duration_ms
      VarintField(2, 1'000'000),               // max_events
      BytesField(3, "trace_viewer"),           // tools
      BytesField(3, "xplane.pb"),              //
      BytesField(4, ProfileOptionsBytes()),    // opts
      BytesField(5, "/logs/plugins/profile"),  // repository_root
      BytesField(6, "2026_05_06_04_47_36"),    // session_id
      BytesField(7, "10.0.0.2:8466"),          // host_name
      MapEntry(8, BytesField(1, "trace_viewer"), BytesField(2, ToolRequestOptionsBytes())),
      VarintField(9, 1),  // emit_xspace
  });
}

TEST(WireCompatTest, ProfileRequestAllFields) {
  const auto request = ParseOrDie<ProfileRequest>(ProfileRequestBytes());
  EXPECT_EQ(request.duration_ms(), 1500u);
  EXPECT_EQ(request.max_events(), 1'000'000u);
  ASSERT_EQ(request.tools_size(), 2);
  EXPECT_EQ(request.tools(0), "trace_viewer");
  EXPECT_EQ(request.tools(1), "xplane.pb");
  ASSERT_TRUE(request.has_opts());
  ExpectProfileOptions(request.opts());
  EXPECT_EQ(request.repository_root(), "/logs/plugins/profile");
  EXPECT_EQ(request.session_id(), "2026_05_06_04_47_36");
  EXPECT_EQ(request.host_name(), "10.0.0.2:8466");
  ASSERT_EQ(request.tool_options_size(), 1);
  ASSERT_TRUE(request.tool_options().contains("trace_viewer"));
  EXPECT_EQ(request.tool_options().at("trace_viewer").output_formats(), "json,pb");
  EXPECT_TRUE(request.tool_options().at("trace_viewer").save_to_repo());
  EXPECT_TRUE(request.emit_xspace());
  // What our client sends to an upstream server.
  EXPECT_EQ(Hex(SerializeDeterministic(request)), Hex(ProfileRequestBytes()));
}

TEST(WireCompatTest, ProfileRequestToleratesUnknownFields) {
  // A newer upstream client may add fields; they must not break parsing.
  const auto request = ParseOrDie<ProfileRequest>(
      Cat({VarintField(1, 5), BytesField(99, "future"), VarintField(100, 7), BytesField(6, "s")}));
  EXPECT_EQ(request.duration_ms(), 5u);
  EXPECT_EQ(request.session_id(), "s");
}

TEST(WireCompatTest, ProfileToolData) {
  const std::string bytes =
      Cat({BytesField(1, "trace.json.gz"), BytesField(2, {"\x1f\x8b\0\xff", 4})});
  const auto data = ParseOrDie<ProfileToolData>(bytes);
  EXPECT_EQ(data.name(), "trace.json.gz");
  EXPECT_EQ(data.data(), std::string("\x1f\x8b\0\xff", 4));
  EXPECT_EQ(SerializeDeterministic(data), bytes);
}

std::string XSpaceBytes();  // Defined with the xplane messages below.

TEST(WireCompatTest, ProfileResponse) {
  const std::string bytes = Cat({
      BytesField(6, Cat({BytesField(1, "a"), BytesField(2, "1")})),
      BytesField(6, Cat({BytesField(1, "b"), BytesField(2, "2")})),
      VarintField(7, 1),
      BytesField(8, XSpaceBytes()),
  });
  const auto response = ParseOrDie<ProfileResponse>(bytes);
  ASSERT_EQ(response.tool_data_size(), 2);
  EXPECT_EQ(response.tool_data(0).name(), "a");
  EXPECT_EQ(response.tool_data(0).data(), "1");
  EXPECT_EQ(response.tool_data(1).name(), "b");
  EXPECT_EQ(response.tool_data(1).data(), "2");
  EXPECT_TRUE(response.empty_trace());
  ASSERT_TRUE(response.has_xspace());
  EXPECT_EQ(response.xspace().planes_size(), 2);
  EXPECT_EQ(response.xspace().hostnames(0), "worker-0");
  // What our sidecar sends to an upstream client.
  EXPECT_EQ(Hex(SerializeDeterministic(response)), Hex(bytes));
}

TEST(WireCompatTest, TerminateRequestAndResponse) {
  const std::string bytes = BytesField(1, "2026_05_06_04_47_36");
  const auto request = ParseOrDie<TerminateRequest>(bytes);
  EXPECT_EQ(request.session_id(), "2026_05_06_04_47_36");
  EXPECT_EQ(SerializeDeterministic(request), bytes);
  EXPECT_EQ(SerializeDeterministic(TerminateResponse()), "");
  EXPECT_EQ(TerminateResponse::descriptor()->field_count(), 0);
}

TEST(WireCompatTest, MonitorRequest) {
  // monitoring_level is int32: a negative value is sign-extended to ten bytes.
  const std::string bytes = Cat({VarintField(1, 1000), Int64Field(2, -1), VarintField(3, 1)});
  const auto request = ParseOrDie<MonitorRequest>(bytes);
  EXPECT_EQ(request.duration_ms(), 1000u);
  EXPECT_EQ(request.monitoring_level(), -1);
  EXPECT_TRUE(request.timestamp());
  EXPECT_EQ(Hex(SerializeDeterministic(request)), Hex(bytes));
  EXPECT_EQ(ParseOrDie<MonitorRequest>(VarintField(2, 2)).monitoring_level(), 2);
}

std::string MonitorResultBytes() {
  return Cat({
      VarintField(1, 3),  // UTIL_IDLE_STEP
      DoubleField(2, 12.5),
      DoubleField(3, 40.25),
      DoubleField(4, 101.5),
      DoubleField(5, 99.0),
      DoubleField(6, 110.75),
      DoubleField(7, 3.5),
      DoubleField(8, 0.125),
      DoubleField(9, 7.0),
  });
}

TEST(WireCompatTest, ProfilerServiceMonitorResultAllFields) {
  const auto result = ParseOrDie<ProfilerServiceMonitorResult>(MonitorResultBytes());
  EXPECT_EQ(result.response_type(), ProfilerServiceMonitorResult::UTIL_IDLE_STEP);
  EXPECT_EQ(result.device_idle_time_percent(), 12.5);
  EXPECT_EQ(result.matrix_unit_utilization_percent(), 40.25);
  EXPECT_EQ(result.step_time_ms_avg(), 101.5);
  EXPECT_EQ(result.step_time_ms_min(), 99.0);
  EXPECT_EQ(result.step_time_ms_max(), 110.75);
  EXPECT_EQ(result.infeed_percent_avg(), 3.5);
  EXPECT_EQ(result.infeed_percent_min(), 0.125);
  EXPECT_EQ(result.infeed_percent_max(), 7.0);
  EXPECT_EQ(Hex(SerializeDeterministic(result)), Hex(MonitorResultBytes()));

  const std::pair<uint64_t, ProfilerServiceMonitorResult::ResponseType> kTypes[] = {
      {0, ProfilerServiceMonitorResult::EMPTY_RESULT},
      {1, ProfilerServiceMonitorResult::UTIL_ONLY},
      {2, ProfilerServiceMonitorResult::UTIL_IDLE},
      {3, ProfilerServiceMonitorResult::UTIL_IDLE_STEP},
  };
  for (const auto& [number, type] : kTypes) {
    EXPECT_EQ(ParseOrDie<ProfilerServiceMonitorResult>(VarintField(1, number)).response_type(),
              type);
  }
}

TEST(WireCompatTest, MonitorResponse) {
  const std::string bytes =
      Cat({BytesField(1, "idle 12.5%"), BytesField(10, MonitorResultBytes())});
  const auto response = ParseOrDie<MonitorResponse>(bytes);
  EXPECT_EQ(response.data(), "idle 12.5%");
  ASSERT_TRUE(response.has_monitor_result());
  EXPECT_EQ(response.monitor_result().step_time_ms_avg(), 101.5);
  EXPECT_EQ(Hex(SerializeDeterministic(response)), Hex(bytes));
}

TEST(WireCompatTest, RemoteProfilerSessionManagerOptions) {
  const std::string bytes = Cat({
      BytesField(1, ProfileOptionsBytes()),
      BytesField(2, "10.0.0.2:8466"),
      BytesField(2, "10.0.0.3:8466"),
      VarintField(3, 1'778'042'856'000'000'000ULL),
      VarintField(4, 60'000),
      VarintField(5, 250),
  });
  const auto options = ParseOrDie<RemoteProfilerSessionManagerOptions>(bytes);
  ExpectProfileOptions(options.profiler_options());
  ASSERT_EQ(options.service_addresses_size(), 2);
  EXPECT_EQ(options.service_addresses(0), "10.0.0.2:8466");
  EXPECT_EQ(options.service_addresses(1), "10.0.0.3:8466");
  EXPECT_EQ(options.session_creation_timestamp_ns(), 1'778'042'856'000'000'000ULL);
  EXPECT_EQ(options.max_session_duration_ms(), 60'000u);
  EXPECT_EQ(options.delay_ms(), 250u);
}

// ---------------------------------------------------------------------------------------------
// XSpace and friends (package tensorflow.profiler).

// proto3 writes no field that holds its default value, so neither do these builders.
std::string XStatMetadataBytes(int64_t id, std::string_view name, std::string_view description) {
  return Cat({Int64Field(1, id), BytesField(2, name),
              description.empty() ? std::string() : BytesField(3, description)});
}

TEST(WireCompatTest, XStatMetadata) {
  const std::string bytes = XStatMetadataBytes(7, "step_num", "the training step");
  const auto md = ParseOrDie<XStatMetadata>(bytes);
  EXPECT_EQ(md.id(), 7);
  EXPECT_EQ(md.name(), "step_num");
  EXPECT_EQ(md.description(), "the training step");
  EXPECT_EQ(SerializeDeterministic(md), bytes);
}

TEST(WireCompatTest, XStatEveryValueKind) {
  // metadata_id and each member of the value oneof, with its wire type.
  const auto dbl = ParseOrDie<XStat>(Cat({Int64Field(1, 1), DoubleField(2, -0.5)}));
  EXPECT_EQ(dbl.metadata_id(), 1);
  EXPECT_EQ(dbl.value_case(), XStat::kDoubleValue);
  EXPECT_EQ(dbl.double_value(), -0.5);

  const auto u64 = ParseOrDie<XStat>(Cat({Int64Field(1, 2), VarintField(3, UINT64_MAX)}));
  EXPECT_EQ(u64.metadata_id(), 2);
  EXPECT_EQ(u64.value_case(), XStat::kUint64Value);
  EXPECT_EQ(u64.uint64_value(), UINT64_MAX);

  const auto i64 = ParseOrDie<XStat>(Cat({Int64Field(1, 3), Int64Field(4, -42)}));
  EXPECT_EQ(i64.metadata_id(), 3);
  EXPECT_EQ(i64.value_case(), XStat::kInt64Value);
  EXPECT_EQ(i64.int64_value(), -42);

  const auto str = ParseOrDie<XStat>(Cat({Int64Field(1, 4), BytesField(5, "hello")}));
  EXPECT_EQ(str.metadata_id(), 4);
  EXPECT_EQ(str.value_case(), XStat::kStrValue);
  EXPECT_EQ(str.str_value(), "hello");

  const std::string raw("\x00\x01\xfe\xff", 4);
  const auto bytes = ParseOrDie<XStat>(Cat({Int64Field(1, 5), BytesField(6, raw)}));
  EXPECT_EQ(bytes.metadata_id(), 5);
  EXPECT_EQ(bytes.value_case(), XStat::kBytesValue);
  EXPECT_EQ(bytes.bytes_value(), raw);

  const auto ref = ParseOrDie<XStat>(Cat({Int64Field(1, 6), VarintField(7, 9)}));
  EXPECT_EQ(ref.metadata_id(), 6);
  EXPECT_EQ(ref.value_case(), XStat::kRefValue);
  EXPECT_EQ(ref.ref_value(), 9u);

  // Negative metadata ids are int64, not zigzag.
  EXPECT_EQ(ParseOrDie<XStat>(Int64Field(1, -3)).metadata_id(), -3);

  for (const XStat* stat : {&dbl, &u64, &i64, &str, &bytes, &ref}) {
    EXPECT_EQ(ParseOrDie<XStat>(SerializeDeterministic(*stat)).DebugString(), stat->DebugString());
  }
  EXPECT_EQ(Hex(SerializeDeterministic(dbl)), Hex(Cat({Int64Field(1, 1), DoubleField(2, -0.5)})));
  EXPECT_EQ(Hex(SerializeDeterministic(i64)), Hex(Cat({Int64Field(1, 3), Int64Field(4, -42)})));
}

std::string XEventMetadataBytes() {
  return Cat({
      Int64Field(1, 11),                                                 // id
      BytesField(2, "train#step_num=3,_r=1#"),                           // name
      BytesField(3, std::string("\x08\x01", 2)),                         // metadata (bytes)
      BytesField(4, "train"),                                            // display_name
      BytesField(5, Cat({Int64Field(1, 7), VarintField(7, 8)})),         // stats
      BytesField(6, Cat({Varint(12), Varint(13), Varint(UINT64_MAX)})),  // child_id, packed
  });
}

TEST(WireCompatTest, XEventMetadata) {
  const auto md = ParseOrDie<XEventMetadata>(XEventMetadataBytes());
  EXPECT_EQ(md.id(), 11);
  EXPECT_EQ(md.name(), "train#step_num=3,_r=1#");
  EXPECT_EQ(md.display_name(), "train");
  EXPECT_EQ(md.metadata(), std::string("\x08\x01", 2));
  ASSERT_EQ(md.stats_size(), 1);
  EXPECT_EQ(md.stats(0).metadata_id(), 7);
  EXPECT_EQ(md.stats(0).ref_value(), 8u);
  ASSERT_EQ(md.child_id_size(), 3);
  EXPECT_EQ(md.child_id(0), 12);
  EXPECT_EQ(md.child_id(1), 13);
  EXPECT_EQ(md.child_id(2), -1);
  // proto3 packs repeated scalars; ours must too, as upstream readers expect either.
  EXPECT_EQ(Hex(SerializeDeterministic(md)), Hex(XEventMetadataBytes()));
}

TEST(WireCompatTest, XEventMetadataAcceptsUnpackedChildIds) {
  const auto md = ParseOrDie<XEventMetadata>(Cat({Int64Field(6, 12), Int64Field(6, 13)}));
  ASSERT_EQ(md.child_id_size(), 2);
  EXPECT_EQ(md.child_id(0), 12);
  EXPECT_EQ(md.child_id(1), 13);
}

std::string XEventBytes() {
  return Cat({
      Int64Field(1, 11),         // metadata_id
      Int64Field(2, 250'000),    // offset_ps
      Int64Field(3, 1'500'000),  // duration_ps
      BytesField(4, Cat({Int64Field(1, 1), DoubleField(2, 0.5)})),
      BytesField(4, Cat({Int64Field(1, 3), Int64Field(4, -42)})),
  });
}

TEST(WireCompatTest, XEventWithOffset) {
  const auto event = ParseOrDie<XEvent>(XEventBytes());
  EXPECT_EQ(event.metadata_id(), 11);
  EXPECT_EQ(event.data_case(), XEvent::kOffsetPs);
  EXPECT_EQ(event.offset_ps(), 250'000);
  EXPECT_EQ(event.duration_ps(), 1'500'000);
  ASSERT_EQ(event.stats_size(), 2);
  EXPECT_EQ(event.stats(0).double_value(), 0.5);
  EXPECT_EQ(event.stats(1).int64_value(), -42);
  EXPECT_EQ(Hex(SerializeDeterministic(event)), Hex(XEventBytes()));
}

TEST(WireCompatTest, XEventWithNumOccurrences) {
  const std::string bytes = Cat({Int64Field(1, 4), Int64Field(3, 10), Int64Field(5, 17)});
  const auto event = ParseOrDie<XEvent>(bytes);
  EXPECT_EQ(event.metadata_id(), 4);
  EXPECT_EQ(event.data_case(), XEvent::kNumOccurrences);
  EXPECT_EQ(event.num_occurrences(), 17);
  EXPECT_EQ(event.offset_ps(), 0);
  EXPECT_EQ(event.duration_ps(), 10);
  EXPECT_EQ(Hex(SerializeDeterministic(event)), Hex(bytes));

  // offset_ps and num_occurrences share a oneof: the last one on the wire wins.
  const auto last = ParseOrDie<XEvent>(Cat({Int64Field(5, 17), Int64Field(2, -5)}));
  EXPECT_EQ(last.data_case(), XEvent::kOffsetPs);
  EXPECT_EQ(last.offset_ps(), -5);
}

std::string XLineBytes() {
  return Cat({
      Int64Field(1, 4242),                       // id
      BytesField(2, "python3"),                  // name
      Int64Field(3, 1'778'042'856'000'000'000),  // timestamp_ns
      BytesField(4, XEventBytes()),              // events
      BytesField(4, Cat({Int64Field(1, 12), Int64Field(2, 0), Int64Field(3, 1)})),
      Int64Field(9, 5'000'000),             // duration_ps
      Int64Field(10, 7),                    // display_id
      BytesField(11, "Stream #7(Kernel)"),  // display_name
  });
}

TEST(WireCompatTest, XLine) {
  const auto line = ParseOrDie<XLine>(XLineBytes());
  EXPECT_EQ(line.id(), 4242);
  EXPECT_EQ(line.display_id(), 7);
  EXPECT_EQ(line.name(), "python3");
  EXPECT_EQ(line.display_name(), "Stream #7(Kernel)");
  EXPECT_EQ(line.timestamp_ns(), 1'778'042'856'000'000'000);
  EXPECT_EQ(line.duration_ps(), 5'000'000);
  ASSERT_EQ(line.events_size(), 2);
  EXPECT_EQ(line.events(0).metadata_id(), 11);
  EXPECT_EQ(line.events(1).metadata_id(), 12);
  // An explicit zero offset still selects the oneof member.
  EXPECT_EQ(line.events(1).data_case(), XEvent::kOffsetPs);
  EXPECT_EQ(Hex(SerializeDeterministic(line)), Hex(XLineBytes()));
}

std::string XPlaneBytes() {
  return Cat({
      Int64Field(1, 3),                // id
      BytesField(2, "/device:GPU:0"),  // name
      BytesField(3, XLineBytes()),     // lines
      // map<int64, XEventMetadata>: key field 1 (int64), value field 2.
      MapEntry(4, Int64Field(1, -2), BytesField(2, Cat({Int64Field(1, -2), BytesField(2, "neg")}))),
      MapEntry(4, Int64Field(1, 11), BytesField(2, XEventMetadataBytes())),
      // map<int64, XStatMetadata>.
      MapEntry(5, Int64Field(1, 1), BytesField(2, XStatMetadataBytes(1, "clock_rate", ""))),
      MapEntry(5, Int64Field(1, 7), BytesField(2, XStatMetadataBytes(7, "step_num", "d"))),
      MapEntry(5, Int64Field(1, 8), BytesField(2, Cat({Int64Field(1, 8), BytesField(2, "x")}))),
      // stats
      BytesField(6, Cat({Int64Field(1, 1), DoubleField(2, 1.41e9)})),
      BytesField(6, Cat({Int64Field(1, 7), BytesField(5, "Nvidia")})),
  });
}

TEST(WireCompatTest, XPlane) {
  const auto plane = ParseOrDie<XPlane>(XPlaneBytes());
  EXPECT_EQ(plane.id(), 3);
  EXPECT_EQ(plane.name(), "/device:GPU:0");
  ASSERT_EQ(plane.lines_size(), 1);
  EXPECT_EQ(plane.lines(0).display_name(), "Stream #7(Kernel)");

  ASSERT_EQ(plane.event_metadata_size(), 2);
  ASSERT_TRUE(plane.event_metadata().contains(11));
  EXPECT_EQ(plane.event_metadata().at(11).name(), "train#step_num=3,_r=1#");
  EXPECT_EQ(plane.event_metadata().at(11).child_id_size(), 3);
  ASSERT_TRUE(plane.event_metadata().contains(-2));
  EXPECT_EQ(plane.event_metadata().at(-2).id(), -2);
  EXPECT_EQ(plane.event_metadata().at(-2).name(), "neg");

  ASSERT_EQ(plane.stat_metadata_size(), 3);
  EXPECT_EQ(plane.stat_metadata().at(1).name(), "clock_rate");
  EXPECT_EQ(plane.stat_metadata().at(7).name(), "step_num");
  EXPECT_EQ(plane.stat_metadata().at(7).description(), "d");
  EXPECT_EQ(plane.stat_metadata().at(8).name(), "x");

  ASSERT_EQ(plane.stats_size(), 2);
  EXPECT_EQ(plane.stats(0).metadata_id(), 1);
  EXPECT_EQ(plane.stats(0).double_value(), 1.41e9);
  EXPECT_EQ(plane.stats(1).str_value(), "Nvidia");
  // Deterministic serialization writes map entries sorted by key (signed order for int64).
  EXPECT_EQ(Hex(SerializeDeterministic(plane)), Hex(XPlaneBytes()));
}

std::string XSpaceBytes() {
  return Cat({
      BytesField(1, XPlaneBytes()),
      BytesField(1, BytesField(2, "/host:CPU")),  // id 0 is the default: not written
      BytesField(2, "error one"),
      BytesField(3, "warning one"),
      BytesField(3, "warning two"),
      BytesField(4, "worker-0"),
  });
}

TEST(WireCompatTest, XSpace) {
  const auto space = ParseOrDie<XSpace>(XSpaceBytes());
  ASSERT_EQ(space.planes_size(), 2);
  EXPECT_EQ(space.planes(0).name(), "/device:GPU:0");
  EXPECT_EQ(space.planes(0).lines(0).events(0).stats(1).int64_value(), -42);
  EXPECT_EQ(space.planes(1).name(), "/host:CPU");
  ASSERT_EQ(space.errors_size(), 1);
  EXPECT_EQ(space.errors(0), "error one");
  ASSERT_EQ(space.warnings_size(), 2);
  EXPECT_EQ(space.warnings(0), "warning one");
  EXPECT_EQ(space.warnings(1), "warning two");
  ASSERT_EQ(space.hostnames_size(), 1);
  EXPECT_EQ(space.hostnames(0), "worker-0");
  // What we write as <host>.xplane.pb for XProf.
  EXPECT_EQ(Hex(SerializeDeterministic(space)), Hex(XSpaceBytes()));
}

// ---------------------------------------------------------------------------------------------
// Names: packages, message names, reserved numbers and gRPC paths.

TEST(ProtocolNamesTest, Packages) {
  EXPECT_EQ(ProfileRequest::descriptor()->file()->package(), "tensorflow");
  EXPECT_EQ(ProfileOptions::descriptor()->file()->package(), "tensorflow");
  EXPECT_EQ(ProfilerServiceMonitorResult::descriptor()->file()->package(), "tensorflow");
  EXPECT_EQ(XSpace::descriptor()->file()->package(), "tensorflow.profiler");
  EXPECT_EQ(XSpace::descriptor()->full_name(), "tensorflow.profiler.XSpace");
  EXPECT_EQ(ProfileOptions::descriptor()->full_name(), "tensorflow.ProfileOptions");
  EXPECT_EQ(ProfileOptions::AdvancedConfigValue::descriptor()->full_name(),
            "tensorflow.ProfileOptions.AdvancedConfigValue");
  EXPECT_EQ(ProfileResponse::descriptor()->FindFieldByName("xspace")->message_type()->full_name(),
            "tensorflow.profiler.XSpace");
}

TEST(ProtocolNamesTest, ReservedNumbersStayReserved) {
  for (int number = 1; number <= 5; ++number) {
    EXPECT_TRUE(ProfileResponse::descriptor()->IsReservedNumber(number)) << number;
  }
  for (int number = 2; number <= 9; ++number) {
    EXPECT_TRUE(MonitorResponse::descriptor()->IsReservedNumber(number)) << number;
  }
  for (int number = 5; number <= 8; ++number) {
    EXPECT_TRUE(XLine::descriptor()->IsReservedNumber(number)) << number;
  }
  EXPECT_TRUE(ProfileOptions::AdvancedConfigValue::descriptor()->IsReservedNumber(4));
}

TEST(ProtocolNamesTest, ProfilerServiceMethods) {
  EXPECT_STREQ(tensorflow::ProfilerService::service_full_name(), "tensorflow.ProfilerService");
  const google::protobuf::ServiceDescriptor* service =
      ProfileRequest::descriptor()->file()->FindServiceByName("ProfilerService");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->full_name(), "tensorflow.ProfilerService");
  struct Expected {
    const char* name;
    const char* path;
    const char* input;
    const char* output;
  };
  const Expected kMethods[] = {
      {"Profile", "/tensorflow.ProfilerService/Profile", "tensorflow.ProfileRequest",
       "tensorflow.ProfileResponse"},
      {"Terminate", "/tensorflow.ProfilerService/Terminate", "tensorflow.TerminateRequest",
       "tensorflow.TerminateResponse"},
      {"Monitor", "/tensorflow.ProfilerService/Monitor", "tensorflow.MonitorRequest",
       "tensorflow.MonitorResponse"},
  };
  for (const Expected& expected : kMethods) {
    const google::protobuf::MethodDescriptor* method = service->FindMethodByName(expected.name);
    ASSERT_NE(method, nullptr) << expected.name;
    // gRPC's path is "/" + service full name + "/" + method name.
    EXPECT_EQ("/" + service->full_name() + "/" + method->name(), expected.path);
    EXPECT_EQ(method->input_type()->full_name(), expected.input);
    EXPECT_EQ(method->output_type()->full_name(), expected.output);
    EXPECT_FALSE(method->client_streaming());
    EXPECT_FALSE(method->server_streaming());
  }
}

TEST(ProtocolNamesTest, SidecarServiceMethods) {
  EXPECT_STREQ(clusterprof::v1alpha1::Sidecar::service_full_name(), "clusterprof.v1alpha1.Sidecar");
  const google::protobuf::ServiceDescriptor* service =
      clusterprof::v1alpha1::GetInfoRequest::descriptor()->file()->FindServiceByName("Sidecar");
  ASSERT_NE(service, nullptr);
  EXPECT_EQ(service->full_name(), "clusterprof.v1alpha1.Sidecar");
  const google::protobuf::MethodDescriptor* get_info = service->FindMethodByName("GetInfo");
  ASSERT_NE(get_info, nullptr);
  EXPECT_EQ(get_info->input_type()->full_name(), "clusterprof.v1alpha1.GetInfoRequest");
  EXPECT_EQ(get_info->output_type()->full_name(), "clusterprof.v1alpha1.GetInfoResponse");
  const google::protobuf::MethodDescriptor* get_session = service->FindMethodByName("GetSession");
  ASSERT_NE(get_session, nullptr);
  EXPECT_EQ(get_session->input_type()->full_name(), "clusterprof.v1alpha1.GetSessionRequest");
  EXPECT_EQ(get_session->output_type()->full_name(), "clusterprof.v1alpha1.GetSessionResponse");
}

// The paths an upstream client dials, spelled out, reach the generated service's handlers.
class RecordingProfilerService final : public tensorflow::ProfilerService::Service {
 public:
  grpc::Status Profile(grpc::ServerContext*, const ProfileRequest* request,
                       ProfileResponse* response) override {
    response->set_empty_trace(request->session_id() == "empty");
    return grpc::Status::OK;
  }
  grpc::Status Terminate(grpc::ServerContext*, const TerminateRequest* request,
                         TerminateResponse*) override {
    return request->session_id() == "s1" ? grpc::Status::OK
                                         : grpc::Status(grpc::StatusCode::NOT_FOUND, "no session");
  }
  grpc::Status Monitor(grpc::ServerContext*, const MonitorRequest* request,
                       MonitorResponse* response) override {
    response->set_data(std::to_string(request->duration_ms()));
    return grpc::Status::OK;
  }
};

template <typename Request, typename Response>
grpc::Status CallByPath(const std::shared_ptr<grpc::Channel>& channel, const std::string& path,
                        const Request& request, Response* response) {
  grpc::TemplatedGenericStub<Request, Response> stub(channel);
  grpc::ClientContext context;
  // A mutex-based notification rather than std::promise: TSan sees pthread mutexes, not
  // libstdc++'s futex-based futures, so this keeps the sanitizer build precise.
  Notification done;
  grpc::Status result;
  stub.UnaryCall(&context, path, grpc::StubOptions(), &request, response, [&](grpc::Status status) {
    result = std::move(status);
    done.Notify();
  });
  done.WaitForNotification();
  return result;
}

TEST(ProtocolNamesTest, UpstreamPathsReachTheGeneratedService) {
  RecordingProfilerService service;
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  std::shared_ptr<grpc::Channel> channel = server->InProcessChannel(grpc::ChannelArguments());

  ProfileRequest profile_request;
  profile_request.set_session_id("empty");
  ProfileResponse profile_response;
  ASSERT_TRUE(
      CallByPath(channel, "/tensorflow.ProfilerService/Profile", profile_request, &profile_response)
          .ok());
  EXPECT_TRUE(profile_response.empty_trace());

  TerminateRequest terminate_request;
  terminate_request.set_session_id("s1");
  TerminateResponse terminate_response;
  EXPECT_TRUE(CallByPath(channel, "/tensorflow.ProfilerService/Terminate", terminate_request,
                         &terminate_response)
                  .ok());

  MonitorRequest monitor_request;
  monitor_request.set_duration_ms(123);
  MonitorResponse monitor_response;
  ASSERT_TRUE(
      CallByPath(channel, "/tensorflow.ProfilerService/Monitor", monitor_request, &monitor_response)
          .ok());
  EXPECT_EQ(monitor_response.data(), "123");

  // A path in another package is not ours.
  EXPECT_EQ(CallByPath(channel, "/tensorflow.profiler.ProfilerService/Profile", profile_request,
                       &profile_response)
                .error_code(),
            grpc::StatusCode::UNIMPLEMENTED);
  server->Shutdown();
}

}  // namespace
}  // namespace clusterprof
