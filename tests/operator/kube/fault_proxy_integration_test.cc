// KubeFaultProxy (tests/support/kube_fault_proxy.h) in front of the real control plane: requests
// pass through unchanged, and the faults it injects (429 with Retry-After, 5xx, latency, broken
// watch streams) look to a client the way the operator's Kubernetes client will meet them.
// Skipped, with a message, where scripts/install-kube-control-plane has not installed the
// binaries.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/strings.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/kube_control_plane.h"
#include "tests/support/kube_fault_proxy.h"

// cpprestsdk's U() macro collides with gtest's templates unless turned off.
#define _TURN_OFF_PLATFORM_STRING
#include <cpprest/containerstream.h>
#include <cpprest/http_client.h>
#include <cpprest/json.h>

namespace clusterprof {
namespace {

using ::testing::HasSubstr;
using testing::HttpResponse;
using testing::KubeControlPlane;
using testing::KubeFaultProxy;
using ::testing::Not;

// A safety net for reads that the test expects to end: a hang fails the test instead of
// blocking until ctest's timeout. Nothing is asserted about how long they take.
constexpr auto kReadTimeout = std::chrono::seconds(60);

bool Eventually(const std::function<bool()>& condition) {
  const auto deadline = std::chrono::steady_clock::now() + kReadTimeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

web::json::value ParseJson(const std::string& text) {
  try {
    return web::json::value::parse(text);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not JSON (" << e.what() << "): " << text;
    return web::json::value::null();
  }
}

std::string StringField(const web::json::value& object, const char* key) {
  if (!object.is_object() || !object.has_string_field(key)) return "";
  return object.at(key).as_string();
}

// metadata.name of each item of a list.
std::set<std::string> ItemNames(const std::string& list) {
  std::set<std::string> names;
  const web::json::value value = ParseJson(list);
  if (!value.is_object() || !value.has_array_field("items")) return names;
  for (const web::json::value& item : value.at("items").as_array()) {
    if (item.has_object_field("metadata")) names.insert(StringField(item.at("metadata"), "name"));
  }
  return names;
}

std::string ConfigMapJson(const std::string& name) {
  return StrCat(R"({"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":")", name,
                R"("},"data":{"key":"value"}})");
}

std::string NamespaceJson(const std::string& name) {
  return StrCat(R"({"apiVersion":"v1","kind":"Namespace","metadata":{"name":")", name, R"("}})");
}

// A chunk size line's number.
std::string HexSize(size_t size) {
  char text[32];
  std::snprintf(text, sizeof(text), "%zx", size);
  return text;
}

struct ProxiedResponse {
  int status_code = 0;
  // The Retry-After header; empty when there was none.
  std::string retry_after;
  std::string body;
};

// One HTTP/1.1 exchange over a plain socket, for what an HTTP library hides: how the request is
// framed, and whether the terminating chunk of the response came before the connection ended.
class RawConnection {
 public:
  // Connects to 127.0.0.1:`port` and sends GET `target`.
  static std::unique_ptr<RawConnection> Open(int port, const std::string& target,
                                             const std::string& token) {
    return OpenRequest(
        port, StrCat("GET ", target, " HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer ",
                     token, "\r\nAccept: application/json\r\n\r\n"));
  }

  // Connects to 127.0.0.1:`port` and sends `request` as it is.
  static std::unique_ptr<RawConnection> OpenRequest(int port, const std::string& request) {
    auto watch = std::unique_ptr<RawConnection>(new RawConnection());
    watch->fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval timeout{};
    timeout.tv_sec = kReadTimeout.count();
    setsockopt(watch->fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    if (connect(watch->fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
      ADD_FAILURE() << "cannot connect to the proxy on port " << port;
      return nullptr;
    }
    if (send(watch->fd_, request.data(), request.size(), MSG_NOSIGNAL) !=
        static_cast<ssize_t>(request.size())) {
      ADD_FAILURE() << "cannot send the request";
      return nullptr;
    }
    return watch;
  }

  ~RawConnection() {
    if (fd_ >= 0) close(fd_);
  }

  void Close() {
    close(fd_);
    fd_ = -1;
  }

  // Reads until the response head is complete; its text.
  std::string ReadHead() {
    while (raw_.find("\r\n\r\n") == std::string::npos && Receive()) {
    }
    const size_t end = raw_.find("\r\n\r\n");
    if (end == std::string::npos) return "";
    std::string head = raw_.substr(0, end + 4);
    raw_.erase(0, end + 4);
    return head;
  }

  // Reads until the decoded body contains `text`; false when the stream ended first.
  bool ReadUntil(const std::string& text) {
    while (Decode(), body_.find(text) == std::string::npos) {
      if (terminated_ || !Receive()) return false;
    }
    return true;
  }

  // Reads until the stream ends, cleanly (terminating chunk) or not.
  void ReadToEnd() {
    while (Decode(), !terminated_ && Receive()) {
    }
  }

  const std::string& body() const { return body_; }
  // Whether the terminating chunk arrived: a clean end of the body.
  bool terminated() const { return terminated_; }
  // Whether the connection ended (EOF or an error other than the read timeout).
  bool ended() const { return ended_; }
  bool timed_out() const { return timed_out_; }

 private:
  RawConnection() = default;

  bool Receive() {
    char data[4096];
    const ssize_t received = recv(fd_, data, sizeof(data), 0);
    if (received > 0) {
      raw_.append(data, static_cast<size_t>(received));
      return true;
    }
    if (received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      timed_out_ = true;
    } else {
      ended_ = true;
    }
    return false;
  }

  // Moves the complete chunks of raw_ into body_.
  void Decode() {
    while (!terminated_) {
      const size_t line_end = raw_.find("\r\n");
      if (line_end == std::string::npos) return;
      const size_t size = std::stoul(raw_.substr(0, line_end), nullptr, 16);
      if (raw_.size() < line_end + 2 + size + 2) return;
      body_.append(raw_, line_end + 2, size);
      raw_.erase(0, line_end + 2 + size + 2);
      if (size == 0) terminated_ = true;
    }
  }

  int fd_ = -1;
  std::string raw_;
  std::string body_;
  bool terminated_ = false;
  bool ended_ = false;
  bool timed_out_ = false;
};

// One control plane for every test of the suite (ONE_PROCESS in tests/CMakeLists.txt); a proxy
// of its own for each test.
class FaultProxyTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<KubeControlPlane>> plane = KubeControlPlane::Start();
    start_status_ = new absl::Status(plane.status());
    if (!plane.ok()) return;
    plane_ = plane->release();
    // The tests create objects in "default", which the server makes shortly after it is ready.
    if (!Eventually([] {
          absl::StatusOr<HttpResponse> response =
              plane_->Get("/api/v1/namespaces/default", plane_->admin_token());
          return response.ok() && response->status_code == 200;
        })) {
      *start_status_ = absl::DeadlineExceededError("namespace default did not appear");
    }
  }

  static void TearDownTestSuite() {
    delete plane_;
    plane_ = nullptr;
    delete start_status_;
    start_status_ = nullptr;
  }

  void SetUp() override {
    if (absl::IsNotFound(*start_status_)) {
      GTEST_SKIP() << "no Kubernetes control plane to test against: " << *start_status_;
    }
    ASSERT_TRUE(start_status_->ok()) << *start_status_;
    absl::StatusOr<std::unique_ptr<KubeFaultProxy>> proxy =
        KubeFaultProxy::Start(plane_->url(), plane_->ca_file());
    ASSERT_TRUE(proxy.ok()) << proxy.status();
    proxy_ = *std::move(proxy);
  }

  // METHOD `path` through the proxy with the admin token.
  ProxiedResponse Send(const web::http::method& method, const std::string& path,
                       const std::string& body = "") {
    ProxiedResponse result;
    try {
      web::http::client::http_client_config config;
      config.set_timeout(kReadTimeout);
      web::http::client::http_client client(proxy_->url(), config);
      web::http::http_request request(method);
      request.set_request_uri(path);
      request.headers().add("Authorization", "Bearer " + plane_->admin_token());
      request.headers().add("Accept", "application/json");
      if (!body.empty()) {
        // Bytes, not a string: cpprestsdk's string bodies read a char buffer as an unsigned char
        // one, which UBSan reports.
        request.headers().set_content_type("application/json");
        request.set_body(std::vector<unsigned char>(body.begin(), body.end()));
      }
      web::http::http_response response = client.request(request).get();
      result.status_code = response.status_code();
      if (response.headers().has("Retry-After")) {
        result.retry_after = response.headers().find("Retry-After")->second;
      }
      result.body = response.extract_string(/*ignore_content_type=*/true).get();
    } catch (const std::exception& e) {
      ADD_FAILURE() << method << " " << path << " through the proxy: " << e.what();
    }
    return result;
  }

  // Checks that `response` is a Kubernetes Status for `code` with `reason`.
  static void ExpectStatus(const ProxiedResponse& response, int code, const std::string& reason) {
    EXPECT_EQ(response.status_code, code) << response.body;
    const web::json::value status = ParseJson(response.body);
    EXPECT_EQ(StringField(status, "kind"), "Status") << response.body;
    EXPECT_EQ(StringField(status, "status"), "Failure") << response.body;
    EXPECT_EQ(StringField(status, "reason"), reason) << response.body;
    ASSERT_TRUE(status.has_number_field("code")) << response.body;
    EXPECT_EQ(status.at("code").as_integer(), code);
  }

  static inline KubeControlPlane* plane_ = nullptr;
  static inline absl::Status* start_status_ = nullptr;
  std::unique_ptr<KubeFaultProxy> proxy_;
};

TEST_F(FaultProxyTest, GetPassesThroughAndMatchesADirectGet) {
  // The server creates its own namespaces shortly after it is ready: wait for them, so that
  // the list stays the same between the two GETs.
  const std::set<std::string> built_in = {"default", "kube-node-lease", "kube-public",
                                          "kube-system"};
  absl::StatusOr<HttpResponse> direct;
  ASSERT_TRUE(Eventually([&] {
    direct = plane_->Get("/api/v1/namespaces", plane_->admin_token());
    if (!direct.ok() || direct->status_code != 200) return false;
    const std::set<std::string> names = ItemNames(direct->body);
    return std::includes(names.begin(), names.end(), built_in.begin(), built_in.end());
  })) << (direct.ok() ? direct->body : direct.status().ToString());

  const ProxiedResponse proxied = Send(web::http::methods::GET, "/api/v1/namespaces");
  ASSERT_EQ(proxied.status_code, 200) << proxied.body;
  EXPECT_EQ(StringField(ParseJson(proxied.body), "kind"), "NamespaceList");
  EXPECT_EQ(ItemNames(proxied.body), ItemNames(direct->body)) << proxied.body;
  EXPECT_EQ(proxy_->requests_seen(), 1);
  EXPECT_EQ(proxy_->RequestsSeen("/api/v1/namespaces", "GET"), 1);
  EXPECT_EQ(proxy_->RequestsSeen("/api/v1/namespaces", "POST"), 0);
}

TEST_F(FaultProxyTest, TheAuthorizationHeaderReachesTheServer) {
  // The server knows the caller by the token: the unprivileged user is forbidden by name.
  web::http::client::http_client client(proxy_->url());
  web::http::http_request request(web::http::methods::GET);
  request.set_request_uri("/api/v1/namespaces");
  request.headers().add("Authorization", "Bearer " + plane_->user_token());
  web::http::http_response response = client.request(request).get();
  EXPECT_EQ(response.status_code(), 403);
  EXPECT_THAT(StringField(ParseJson(response.extract_string(true).get()), "message"),
              HasSubstr(StrCat("User \"", KubeControlPlane::kUser, "\"")));
  EXPECT_EQ(Send(web::http::methods::GET, "/api/v1/namespaces").status_code, 200);
}

TEST_F(FaultProxyTest, TooManyRequestsWithRetryAfterThenSuccess) {
  proxy_->FailNext(2, 429, "/api/v1/namespaces", "", 3);

  // A request that does not match passes and leaves the rule alone.
  const ProxiedResponse other = Send(web::http::methods::GET, "/version");
  EXPECT_EQ(other.status_code, 200) << other.body;

  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(StrCat("request ", i + 1));
    const ProxiedResponse throttled = Send(web::http::methods::GET, "/api/v1/namespaces");
    ExpectStatus(throttled, 429, "TooManyRequests");
    EXPECT_EQ(throttled.retry_after, "3");
    const web::json::value status = ParseJson(throttled.body);
    ASSERT_TRUE(status.has_object_field("details")) << throttled.body;
    EXPECT_EQ(status.at("details").at("retryAfterSeconds").as_integer(), 3);
  }
  const ProxiedResponse passed = Send(web::http::methods::GET, "/api/v1/namespaces");
  EXPECT_EQ(passed.status_code, 200) << passed.body;
  EXPECT_EQ(StringField(ParseJson(passed.body), "kind"), "NamespaceList");
  EXPECT_EQ(proxy_->faults_injected(), 2);
  EXPECT_EQ(proxy_->RequestsSeen("/api/v1/namespaces"), 3);

  // Rules not used up are forgotten on request.
  proxy_->FailNext(1, 429, "/version");
  proxy_->ClearFailures();
  EXPECT_EQ(Send(web::http::methods::GET, "/version").status_code, 200);
  EXPECT_EQ(proxy_->faults_injected(), 2);
}

TEST_F(FaultProxyTest, ServiceUnavailableAndInternalErrorMatchTheMethod) {
  proxy_->FailNext(1, 503, "/api/v1/namespaces/default/configmaps", "POST");
  proxy_->FailNext(1, 500, "/api/v1/namespaces/default/configmaps", "POST");

  // A GET of the same path is not a POST.
  EXPECT_EQ(Send(web::http::methods::GET, "/api/v1/namespaces/default/configmaps").status_code,
            200);
  const std::string config_map = ConfigMapJson("faulted");
  const ProxiedResponse unavailable =
      Send(web::http::methods::POST, "/api/v1/namespaces/default/configmaps", config_map);
  ExpectStatus(unavailable, 503, "ServiceUnavailable");
  EXPECT_EQ(unavailable.retry_after, "");
  ExpectStatus(Send(web::http::methods::POST, "/api/v1/namespaces/default/configmaps", config_map),
               500, "InternalError");

  // Neither reached the server.
  absl::StatusOr<HttpResponse> direct =
      plane_->Get("/api/v1/namespaces/default/configmaps/faulted", plane_->admin_token());
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->status_code, 404) << direct->body;

  const ProxiedResponse created =
      Send(web::http::methods::POST, "/api/v1/namespaces/default/configmaps", config_map);
  EXPECT_EQ(created.status_code, 201) << created.body;
}

TEST_F(FaultProxyTest, PostBodiesPassThrough) {
  const ProxiedResponse created =
      Send(web::http::methods::POST, "/api/v1/namespaces/default/configmaps",
           ConfigMapJson("posted-through-the-proxy"));
  ASSERT_EQ(created.status_code, 201) << created.body;

  absl::StatusOr<HttpResponse> direct = plane_->Get(
      "/api/v1/namespaces/default/configmaps/posted-through-the-proxy", plane_->admin_token());
  ASSERT_TRUE(direct.ok()) << direct.status();
  ASSERT_EQ(direct->status_code, 200) << direct->body;
  const web::json::value config_map = ParseJson(direct->body);
  ASSERT_TRUE(config_map.has_object_field("data")) << direct->body;
  EXPECT_EQ(StringField(config_map.at("data"), "key"), "value");

  // The server's own errors come back unchanged: the name is taken now.
  const ProxiedResponse conflict =
      Send(web::http::methods::POST, "/api/v1/namespaces/default/configmaps",
           ConfigMapJson("posted-through-the-proxy"));
  ExpectStatus(conflict, 409, "AlreadyExists");
}

TEST_F(FaultProxyTest, ChunkedRequestBodiesPassThrough) {
  const std::string config_map = ConfigMapJson("sent-in-chunks");
  const size_t half = config_map.size() / 2;
  std::unique_ptr<RawConnection> post = RawConnection::OpenRequest(
      proxy_->port(),
      StrCat("POST /api/v1/namespaces/default/configmaps HTTP/1.1\r\nHost: 127.0.0.1\r\n"
             "Authorization: Bearer ",
             plane_->admin_token(),
             "\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
             HexSize(half), "\r\n", config_map.substr(0, half), "\r\n",
             HexSize(config_map.size() - half), "\r\n", config_map.substr(half), "\r\n0\r\n\r\n"));
  ASSERT_NE(post, nullptr);
  EXPECT_THAT(post->ReadHead(), HasSubstr("HTTP/1.1 201 Created"));

  absl::StatusOr<HttpResponse> direct =
      plane_->Get("/api/v1/namespaces/default/configmaps/sent-in-chunks", plane_->admin_token());
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(direct->status_code, 200) << direct->body;
}

TEST_F(FaultProxyTest, LatencyDelaysEachRequest) {
  constexpr int kLatencyMs = 300;
  proxy_->SetLatencyMs(kLatencyMs);
  for (int i = 0; i < 2; ++i) {
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(Send(web::http::methods::GET, "/version").status_code, 200);
    EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(kLatencyMs));
  }
}

TEST_F(FaultProxyTest, WatchStreamsEventsAndDropWatchesBreaksTheStream) {
  ASSERT_EQ(
      Send(web::http::methods::POST, "/api/v1/namespaces", NamespaceJson("watch-drop")).status_code,
      201);
  std::unique_ptr<RawConnection> watch = RawConnection::Open(
      proxy_->port(), "/api/v1/namespaces/watch-drop/configmaps?watch=true", plane_->admin_token());
  ASSERT_NE(watch, nullptr);
  const std::string head = watch->ReadHead();
  ASSERT_THAT(head, HasSubstr("HTTP/1.1 200")) << head;
  ASSERT_THAT(head, HasSubstr("Transfer-Encoding: chunked")) << head;
  EXPECT_EQ(proxy_->watches_opened(), 1);
  EXPECT_EQ(proxy_->watches_active(), 1);

  // Created after the watch began: its event arrives while the stream stays open.
  ASSERT_EQ(Send(web::http::methods::POST, "/api/v1/namespaces/watch-drop/configmaps",
                 ConfigMapJson("first"))
                .status_code,
            201);
  ASSERT_TRUE(watch->ReadUntil(R"("name":"first")")) << watch->body();
  EXPECT_THAT(watch->body(), HasSubstr(R"({"type":"ADDED")"));
  EXPECT_FALSE(watch->ended());
  ASSERT_EQ(Send(web::http::methods::POST, "/api/v1/namespaces/watch-drop/configmaps",
                 ConfigMapJson("second"))
                .status_code,
            201);
  ASSERT_TRUE(watch->ReadUntil(R"("name":"second")")) << watch->body();

  EXPECT_EQ(proxy_->DropWatches(), 1);
  watch->ReadToEnd();
  EXPECT_TRUE(watch->ended()) << "the stream did not end";
  EXPECT_FALSE(watch->timed_out());
  EXPECT_FALSE(watch->terminated()) << "a clean end, not a broken stream";
  EXPECT_TRUE(Eventually([&] { return proxy_->watches_active() == 0; }));
  EXPECT_EQ(proxy_->watches_dropped(), 1);
  EXPECT_EQ(proxy_->DropWatches(), 0);
}

TEST_F(FaultProxyTest, CpprestsdkSeesADroppedWatchAsAnError) {
  ASSERT_EQ(
      Send(web::http::methods::POST, "/api/v1/namespaces", NamespaceJson("watch-sdk")).status_code,
      201);
  web::http::client::http_client_config config;
  config.set_timeout(kReadTimeout);
  web::http::client::http_client client(proxy_->url(), config);
  web::http::http_request request(web::http::methods::GET);
  request.set_request_uri("/api/v1/namespaces/watch-sdk/configmaps?watch=1");
  request.headers().add("Authorization", "Bearer " + plane_->admin_token());
  web::http::http_response response = client.request(request).get();
  ASSERT_EQ(response.status_code(), 200);
  ASSERT_TRUE(proxy_->WaitForActiveWatches(1, kReadTimeout));

  ASSERT_EQ(Send(web::http::methods::POST, "/api/v1/namespaces/watch-sdk/configmaps",
                 ConfigMapJson("seen"))
                .status_code,
            201);
  Concurrency::streams::istream body = response.body();
  // Byte buffers: a char one (stringstreambuf) is read as unsigned char, which UBSan reports.
  Concurrency::streams::container_buffer<std::vector<uint8_t>> line_buffer;
  ASSERT_GT(body.read_line(line_buffer).get(), 0u);
  const std::string line(line_buffer.collection().begin(), line_buffer.collection().end());
  const web::json::value event = ParseJson(line);
  EXPECT_EQ(StringField(event, "type"), "ADDED") << line;
  EXPECT_EQ(StringField(event.at("object").at("metadata"), "name"), "seen") << line;

  EXPECT_EQ(proxy_->DropWatches(), 1);
  EXPECT_ANY_THROW({
    Concurrency::streams::container_buffer<std::vector<uint8_t>> rest;
    body.read_line(rest).get();
    // A clean end would read nothing and report the end of the stream.
    if (body.is_eof()) ADD_FAILURE() << "the dropped watch ended cleanly";
  });
}

TEST_F(FaultProxyTest, DropWatchesAfterEventsForwardsExactlyThatMany) {
  ASSERT_EQ(Send(web::http::methods::POST, "/api/v1/namespaces", NamespaceJson("watch-limit"))
                .status_code,
            201);
  proxy_->SetDropWatchesAfterEvents(2);
  std::unique_ptr<RawConnection> watch =
      RawConnection::Open(proxy_->port(), "/api/v1/namespaces/watch-limit/configmaps?watch=true",
                          plane_->admin_token());
  ASSERT_NE(watch, nullptr);
  ASSERT_THAT(watch->ReadHead(), HasSubstr("HTTP/1.1 200"));
  for (const char* name : {"one", "two", "three"}) {
    ASSERT_EQ(Send(web::http::methods::POST, "/api/v1/namespaces/watch-limit/configmaps",
                   ConfigMapJson(name))
                  .status_code,
              201);
  }
  watch->ReadToEnd();
  EXPECT_TRUE(watch->ended());
  EXPECT_FALSE(watch->terminated());
  std::vector<std::string_view> events = SplitSkipEmpty(watch->body(), '\n');
  ASSERT_EQ(events.size(), 2u) << watch->body();
  EXPECT_THAT(std::string(events[0]), HasSubstr(R"("name":"one")"));
  EXPECT_THAT(std::string(events[1]), HasSubstr(R"("name":"two")"));
  EXPECT_EQ(proxy_->watches_dropped(), 1);
}

TEST_F(FaultProxyTest, AClientThatHangsUpEndsTheUpstreamWatch) {
  std::unique_ptr<RawConnection> watch = RawConnection::Open(
      proxy_->port(), "/api/v1/namespaces/default/configmaps?watch=true", plane_->admin_token());
  ASSERT_NE(watch, nullptr);
  ASSERT_THAT(watch->ReadHead(), HasSubstr("HTTP/1.1 200"));
  ASSERT_EQ(proxy_->watches_active(), 1);
  watch->Close();
  EXPECT_TRUE(Eventually([&] { return proxy_->watches_active() == 0; }));
  EXPECT_EQ(proxy_->watches_dropped(), 0);
}

TEST_F(FaultProxyTest, DestructionBreaksOpenWatches) {
  std::unique_ptr<RawConnection> watch = RawConnection::Open(
      proxy_->port(), "/api/v1/namespaces/default/configmaps?watch=true", plane_->admin_token());
  ASSERT_NE(watch, nullptr);
  ASSERT_THAT(watch->ReadHead(), HasSubstr("HTTP/1.1 200"));
  proxy_.reset();
  watch->ReadToEnd();
  EXPECT_TRUE(watch->ended());
  EXPECT_FALSE(watch->terminated());
}

TEST_F(FaultProxyTest, TheServerIsVerifiedAgainstTheCaFile) {
  // Public CAs did not sign the control plane's serving certificate.
  constexpr char kSystemCas[] = "/etc/ssl/certs/ca-certificates.crt";
  if (access(kSystemCas, R_OK) != 0) GTEST_SKIP() << "no " << kSystemCas;
  absl::StatusOr<std::unique_ptr<KubeFaultProxy>> proxy =
      KubeFaultProxy::Start(plane_->url(), kSystemCas);
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  web::http::client::http_client client((*proxy)->url());
  web::http::http_response response = client.request(web::http::methods::GET, "/version").get();
  EXPECT_EQ(response.status_code(), 502);
  EXPECT_THAT(response.extract_string(true).get(), HasSubstr("certificate verify failed"));
}

TEST(KubeFaultProxyStartTest, RejectsABadUpstreamUrlAndAMissingCaFile) {
  EXPECT_EQ(KubeFaultProxy::Start("ftp://127.0.0.1:1", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KubeFaultProxy::Start("https://127.0.0.1", "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(KubeFaultProxy::Start("https://127.0.0.1:1", "/nonexistent/ca.crt").status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(KubeFaultProxyStartTest, AnUnreachableUpstreamIsABadGateway) {
  // A port bound but not listening: connections to it are refused.
  const int bound = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(bind(bound, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(getsockname(bound, reinterpret_cast<sockaddr*>(&address), &length), 0);
  absl::StatusOr<std::unique_ptr<KubeFaultProxy>> proxy =
      KubeFaultProxy::Start(StrCat("http://127.0.0.1:", ntohs(address.sin_port)), "");
  ASSERT_TRUE(proxy.ok()) << proxy.status();
  web::http::client::http_client client((*proxy)->url());
  web::http::http_response response = client.request(web::http::methods::GET, "/version").get();
  EXPECT_EQ(response.status_code(), 502);
  EXPECT_THAT(response.extract_string(true).get(), HasSubstr("cannot connect"));
  close(bound);
}

}  // namespace
}  // namespace clusterprof
