// The GCS test server on the wire: raw HTTP/1.1 over a socket, so that every status code, header
// and JSON field a client depends on is checked as sent, edge cases included.
#include "tests/support/gcs_test_server.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <openssl/evp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/escaping.h"
#include "common/base/strings.h"
#include "common/io/crc32c.h"
#include "cpprest/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace clusterprof::testing {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kQuantum = GcsTestServer::kUploadQuantum;

struct HttpResponse {
  int code = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;

  std::optional<std::string> Header(std::string_view name) const {
    for (const auto& [key, value] : headers) {
      if (key.size() == name.size() &&
          std::equal(key.begin(), key.end(), name.begin(),
                     [](char a, char b) { return std::tolower(a) == std::tolower(b); })) {
        return value;
      }
    }
    return std::nullopt;
  }
  web::json::value Json() const {
    std::error_code error;
    web::json::value json = web::json::value::parse(body, error);
    EXPECT_FALSE(error) << "not JSON: " << body;
    return json;
  }
};

// A blocking HTTP/1.1 client on one connection, writing requests byte for byte as given.
class RawClient {
 public:
  explicit RawClient(int port) : port_(port) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<uint16_t>(port));
    connected_ = connect(fd_, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) == 0;
    // A broken server fails the test instead of hanging it.
    const timeval timeout{30, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  }
  ~RawClient() { close(fd_); }
  RawClient(const RawClient&) = delete;
  RawClient& operator=(const RawClient&) = delete;

  bool connected() const { return connected_; }
  // The errno of the last failed read or write.
  int last_error() const { return last_error_; }

  bool Send(std::string_view data) {
    while (!data.empty()) {
      const ssize_t sent = send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (sent < 0 && errno == EINTR) continue;
      if (sent <= 0) {
        last_error_ = errno;
        return false;
      }
      data.remove_prefix(static_cast<size_t>(sent));
    }
    return true;
  }

  // "METHOD target HTTP/1.1" with Host, `headers` ("Name: value" lines) and, unless `headers`
  // frame the body themselves, Content-Length.
  std::string Head(std::string_view method, std::string_view target,
                   const std::vector<std::string>& headers, std::optional<size_t> length) {
    std::string head = StrCat(method, " ", target, " HTTP/1.1\r\nHost: 127.0.0.1:", port_, "\r\n");
    for (const std::string& header : headers) StrAppend(&head, header, "\r\n");
    if (length.has_value()) StrAppend(&head, "Content-Length: ", *length, "\r\n");
    head.append("\r\n");
    return head;
  }

  std::optional<HttpResponse> Request(std::string_view method, std::string_view target,
                                      const std::vector<std::string>& headers = {},
                                      std::string_view body = "") {
    const bool send_length = body.size() > 0 || method == "POST" || method == "PUT";
    if (!Send(Head(method, target, headers,
                   send_length ? std::optional<size_t>(body.size()) : std::nullopt)) ||
        !Send(body)) {
      // The server may have answered and closed already; read what it sent.
    }
    return ReadResponse(method == "HEAD");
  }

  // One response (interim 1xx ones skipped unless `keep_interim`); nullopt when the connection
  // ended or broke first.
  std::optional<HttpResponse> ReadResponse(bool head_request = false, bool keep_interim = false) {
    while (true) {
      std::optional<HttpResponse> response = ReadOne(head_request);
      if (!response.has_value() || response->code >= 200 || keep_interim) return response;
    }
  }

  // Reads until the peer closes; true when it closed cleanly (FIN), false on reset or timeout.
  bool ReadsEndOfStream() {
    char scratch[4096];
    while (true) {
      const ssize_t n = recv(fd_, scratch, sizeof(scratch), 0);
      if (n == 0) return true;
      if (n < 0) {
        last_error_ = errno;
        return false;
      }
    }
  }

 private:
  bool Fill() {
    char scratch[65536];
    const ssize_t n = recv(fd_, scratch, sizeof(scratch), 0);
    if (n <= 0) {
      last_error_ = n < 0 ? errno : 0;
      return false;
    }
    buffer_.append(scratch, static_cast<size_t>(n));
    return true;
  }

  std::optional<HttpResponse> ReadOne(bool head_request) {
    size_t end;
    while ((end = buffer_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    HttpResponse response;
    const std::string head = buffer_.substr(0, end);
    buffer_.erase(0, end + 4);
    std::vector<std::string_view> lines;
    size_t start = 0;
    while (start <= head.size()) {
      const size_t eol = head.find("\r\n", start);
      lines.push_back(std::string_view(head).substr(
          start, eol == std::string::npos ? std::string::npos : eol - start));
      if (eol == std::string::npos) break;
      start = eol + 2;
    }
    const std::string_view status = lines[0];
    EXPECT_TRUE(StartsWith(status, "HTTP/1.1 ")) << status;
    response.code = std::atoi(std::string(status.substr(9, 3)).c_str());
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == std::string_view::npos) continue;
      response.headers.emplace_back(std::string(lines[i].substr(0, colon)),
                                    std::string(StripAsciiWhitespace(lines[i].substr(colon + 1))));
    }
    if (response.code < 200 || response.code == 204 || response.code == 304 || head_request) {
      return response;
    }
    const std::optional<std::string> length = response.Header("Content-Length");
    EXPECT_TRUE(length.has_value()) << "no Content-Length in " << head;
    const size_t size = length.has_value() ? std::stoull(*length) : 0;
    while (buffer_.size() < size) {
      if (!Fill()) return std::nullopt;
    }
    response.body = buffer_.substr(0, size);
    buffer_.erase(0, size);
    return response;
  }

  const int port_;
  int fd_ = -1;
  bool connected_ = false;
  int last_error_ = 0;
  std::string buffer_;
};

// Deterministic bytes, different at every offset of a 256 KiB quantum.
std::string Pattern(size_t size, uint32_t seed = 1) {
  std::string data(size, '\0');
  uint32_t state = seed * 2654435761u + 1;
  for (size_t i = 0; i < size; ++i) {
    state = state * 1664525u + 1013904223u;
    data[i] = static_cast<char>(state >> 24);
  }
  return data;
}

std::string Md5Base64(std::string_view data) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_Digest(data.data(), data.size(), digest, &size, EVP_md5(), nullptr);
  return absl::Base64Escape(absl::string_view(reinterpret_cast<const char*>(digest), size));
}

std::string PercentEncodeForTest(std::string_view text) {
  std::string out;
  for (const char c : text) {
    if (std::isalnum(static_cast<unsigned char>(c))) {
      out.push_back(c);
    } else {
      char escaped[4];
      std::snprintf(escaped, sizeof(escaped), "%%%02X", static_cast<unsigned char>(c));
      out.append(escaped);
    }
  }
  return out;
}

std::string JsonField(const web::json::value& json, const std::string& name) {
  if (!json.has_field(name) || !json.at(name).is_string()) return "<missing>";
  return json.at(name).as_string();
}

class GcsTestServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = GcsTestServer::Start();
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    server_->CreateBucket("bucket");
  }

  std::optional<HttpResponse> Call(std::string_view method, std::string_view target,
                                   const std::vector<std::string>& headers = {},
                                   std::string_view body = "") {
    RawClient client(server_->port());
    EXPECT_TRUE(client.connected());
    return client.Request(method, target, headers, body);
  }

  // Starts a resumable upload; returns the session URI's path and query.
  std::string StartResumable(std::string_view name, std::string_view metadata = "",
                             const std::vector<std::string>& headers = {},
                             std::string_view extra_query = "") {
    std::vector<std::string> all = headers;
    all.push_back("Content-Type: application/json; charset=UTF-8");
    std::optional<HttpResponse> response =
        Call("POST",
             StrCat("/upload/storage/v1/b/bucket/o?uploadType=resumable&name=", name, extra_query),
             all, metadata);
    EXPECT_TRUE(response.has_value());
    if (!response.has_value()) return "";
    EXPECT_EQ(response->code, 200) << response->body;
    const std::string location = response->Header("Location").value_or("");
    std::string_view target = location;
    EXPECT_TRUE(ConsumePrefix(&target, server_->endpoint())) << location;
    return std::string(target);
  }

  std::optional<HttpResponse> PutChunk(std::string_view session, std::string_view range,
                                       std::string_view body,
                                       const std::vector<std::string>& extra = {}) {
    std::vector<std::string> headers = extra;
    headers.push_back(StrCat("Content-Range: ", range));
    return Call("PUT", session, headers, body);
  }

  std::unique_ptr<GcsTestServer> server_;
};

TEST_F(GcsTestServerTest, MediaUploadStoresBytesWithCrc32cAndMd5) {
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=dir%2Fhello.txt",
           {"Content-Type: text/plain"}, "hello");
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  EXPECT_THAT(response->Header("Content-Type").value_or(""), HasSubstr("application/json"));
  const web::json::value json = response->Json();
  EXPECT_EQ(JsonField(json, "kind"), "storage#object");
  EXPECT_EQ(JsonField(json, "name"), "dir/hello.txt");
  EXPECT_EQ(JsonField(json, "bucket"), "bucket");
  EXPECT_EQ(JsonField(json, "contentType"), "text/plain");
  EXPECT_EQ(JsonField(json, "size"), "5");
  // Known values: CRC32C("hello") = 0x9a71bb4c, MD5("hello") = 5d41402abc4b2a76b9719d911017c592.
  EXPECT_EQ(JsonField(json, "crc32c"), "mnG7TA==");
  EXPECT_EQ(JsonField(json, "md5Hash"), "XUFAKrxLKna5cZ2REBfFkg==");
  EXPECT_EQ(JsonField(json, "metageneration"), "1");
  // Generation is a decimal string.
  const std::string generation = JsonField(json, "generation");
  ASSERT_FALSE(generation.empty());
  EXPECT_EQ(generation.find_first_not_of("0123456789"), std::string::npos) << generation;
  EXPECT_EQ(JsonField(json, "id"), StrCat("bucket/dir/hello.txt/", generation));
  EXPECT_EQ(JsonField(json, "selfLink"),
            StrCat(server_->endpoint(), "/storage/v1/b/bucket/o/dir%2Fhello.txt"));
  EXPECT_THAT(JsonField(json, "mediaLink"),
              HasSubstr("/download/storage/v1/b/bucket/o/dir%2Fhello.txt?generation="));
  EXPECT_THAT(JsonField(json, "timeCreated"),
              ::testing::MatchesRegex("[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z"));
  EXPECT_NE(JsonField(json, "etag"), "<missing>");
  EXPECT_NE(JsonField(json, "updated"), "<missing>");

  const std::optional<GcsObjectSnapshot> stored = server_->GetObject("bucket", "dir/hello.txt");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->data, "hello");
  EXPECT_EQ(stored->size, 5u);
  EXPECT_EQ(stored->crc32c, "mnG7TA==");
  EXPECT_EQ(stored->md5_hash, "XUFAKrxLKna5cZ2REBfFkg==");
  EXPECT_EQ(std::to_string(stored->generation), generation);
  EXPECT_EQ(server_->ListObjectNames("bucket"), std::vector<std::string>{"dir/hello.txt"});
}

TEST_F(GcsTestServerTest, Crc32cOfTheCheckValue) {
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=check", {}, "123456789");
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200);
  // The CRC32C check value 0xE3069283, big-endian, base64.
  EXPECT_EQ(JsonField(response->Json(), "crc32c"), "4waSgw==");
  EXPECT_EQ(Crc32cFromBase64("4waSgw=="), 0xE3069283u);
  // No Content-Type: application/octet-stream.
  EXPECT_EQ(JsonField(response->Json(), "contentType"), "application/octet-stream");
}

TEST_F(GcsTestServerTest, EachWriteGetsAHigherGeneration) {
  server_->PutObject("bucket", "o", "1");
  const int64_t first = server_->GetObject("bucket", "o")->generation;
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=o", {}, "2");
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200);
  EXPECT_GT(std::stoll(JsonField(response->Json(), "generation")), first);
  EXPECT_EQ(server_->GetObject("bucket", "o")->data, "2");
}

TEST_F(GcsTestServerTest, WritesCountsEveryCreationAndReplacementOfAName) {
  EXPECT_EQ(server_->Writes("bucket", "o"), 0);
  server_->PutObject("bucket", "o", "1");
  EXPECT_EQ(server_->Writes("bucket", "o"), 1);
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=o", {}, "2");
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200);
  EXPECT_EQ(server_->Writes("bucket", "o"), 2);
  EXPECT_EQ(server_->DistinctContents("bucket", "o"), 2);
  server_->PutObject("bucket", "o", "2");
  EXPECT_EQ(server_->Writes("bucket", "o"), 3);
  EXPECT_EQ(server_->DistinctContents("bucket", "o"), 2) << "the same bytes again";
  // A refused write is not one.
  response = Call(
      "POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=o&ifGenerationMatch=0", {}, "3");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 412);
  EXPECT_EQ(server_->Writes("bucket", "o"), 3);
  EXPECT_EQ(server_->Writes("bucket", "other"), 0);
}

TEST_F(GcsTestServerTest, MediaUploadWithChunkedBody) {
  RawClient client(server_->port());
  ASSERT_TRUE(
      client.Send(client.Head("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=c",
                              {"Transfer-Encoding: chunked"}, std::nullopt)));
  ASSERT_TRUE(client.Send("5;ext=1\r\nhello\r\n7\r\n, world\r\n0\r\nX-Trailer: t\r\n\r\n"));
  std::optional<HttpResponse> response = client.ReadResponse();
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  EXPECT_EQ(server_->GetObject("bucket", "c")->data, "hello, world");
  // The connection stays usable.
  std::optional<HttpResponse> again = client.Request("GET", "/storage/v1/b/bucket/o/c?alt=media");
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->body, "hello, world");
}

TEST_F(GcsTestServerTest, MediaUploadNeedsAName) {
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media", {}, "x");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  EXPECT_TRUE(server_->ListObjectNames("bucket").empty());
  response = Call("POST", "/upload/storage/v1/b/bucket/o?name=x", {}, "x");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
}

std::string MultipartBody(std::string_view boundary, std::string_view metadata,
                          std::string_view media_type, std::string_view media) {
  return StrCat("--", boundary, "\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n",
                metadata, "\r\n--", boundary, "\r\nContent-Type: ", media_type, "\r\n\r\n", media,
                "\r\n--", boundary, "--\r\n");
}

TEST_F(GcsTestServerTest, MultipartUploadTakesMetadataFromTheFirstPart) {
  // Media bytes that contain a near-delimiter and CRLFs.
  const std::string media = StrCat("line1\r\n--b0undary\r\n--b", Pattern(3000), "\r\n");
  const std::string body = MultipartBody(
      "b0undary_x",
      R"({"name":"folder/multi.bin","contentType":"application/x-test","metadata":{"k":"v","run":"7"}})",
      "text/plain", media);
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=multipart",
           {"Content-Type: multipart/related; boundary=\"b0undary_x\""}, body);
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  const web::json::value json = response->Json();
  EXPECT_EQ(JsonField(json, "name"), "folder/multi.bin");
  EXPECT_EQ(JsonField(json, "contentType"), "application/x-test");
  EXPECT_EQ(JsonField(json, "size"), std::to_string(media.size()));
  ASSERT_TRUE(json.has_field("metadata"));
  EXPECT_EQ(json.at("metadata").at("run").as_string(), "7");
  const std::optional<GcsObjectSnapshot> stored = server_->GetObject("bucket", "folder/multi.bin");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->data, media);
  EXPECT_EQ(stored->crc32c, Crc32cToBase64(Crc32c(media)));
  EXPECT_EQ((std::map<std::string, std::string>{{"k", "v"}, {"run", "7"}}), stored->metadata);
}

TEST_F(GcsTestServerTest, MultipartUploadChecksDeclaredHashes) {
  const std::string good =
      MultipartBody("sep",
                    StrCat(R"({"name":"h","crc32c":")", Crc32cToBase64(Crc32c("abc")),
                           R"(","md5Hash":")", Md5Base64("abc"), R"("})"),
                    "text/plain", "abc");
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=multipart",
           {"Content-Type: multipart/related; boundary=sep"}, good);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200) << response->body;

  const std::string bad = MultipartBody(
      "sep", StrCat(R"({"name":"bad","crc32c":")", Crc32cToBase64(Crc32c("abd")), R"("})"),
      "text/plain", "abc");
  response = Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=multipart",
                  {"Content-Type: multipart/related; boundary=sep"}, bad);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  EXPECT_THAT(response->body, HasSubstr("doesn't match calculated CRC32C"));
  EXPECT_FALSE(server_->GetObject("bucket", "bad").has_value());
}

TEST_F(GcsTestServerTest, MalformedMultipartIsRejected) {
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=multipart",
           {"Content-Type: multipart/related; boundary=sep"},
           "--sep\r\nContent-Type: application/json\r\n\r\n{\"name\":\"m\"}\r\n--sep--\r\n");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  response = Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=multipart",
                  {"Content-Type: application/json"}, "{}");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  EXPECT_TRUE(server_->ListObjectNames("bucket").empty());
}

TEST_F(GcsTestServerTest, ResumableUploadInSeveralChunks) {
  const std::string data = Pattern(2 * kQuantum + 1000);
  const std::string session =
      StartResumable("runs%2Fr1.xplane.pb", R"({"metadata":{"host":"h1"}})",
                     {"X-Upload-Content-Type: application/octet-stream+test"});
  EXPECT_THAT(session, HasSubstr("/upload/storage/v1/b/bucket/o?uploadType=resumable"));
  EXPECT_THAT(session, HasSubstr("upload_id="));
  EXPECT_EQ(server_->active_resumable_sessions(), 1);

  // Nothing persisted yet: 308 without a Range header.
  std::optional<HttpResponse> response = PutChunk(session, "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  EXPECT_FALSE(response->Header("Range").has_value());

  response = PutChunk(session, StrCat("bytes 0-", kQuantum - 1, "/*"),
                      std::string_view(data).substr(0, kQuantum));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  EXPECT_EQ(response->Header("Range"), StrCat("bytes=0-", kQuantum - 1));

  // Status queries, with the total unknown and known.
  response = PutChunk(session, "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  EXPECT_EQ(response->Header("Range"), StrCat("bytes=0-", kQuantum - 1));
  response = PutChunk(session, StrCat("bytes */", data.size()), "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  EXPECT_EQ(response->Header("Range"), StrCat("bytes=0-", kQuantum - 1));

  response = PutChunk(session, StrCat("bytes ", kQuantum, "-", 2 * kQuantum - 1, "/*"),
                      std::string_view(data).substr(kQuantum, kQuantum));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  EXPECT_EQ(response->Header("Range"), StrCat("bytes=0-", 2 * kQuantum - 1));
  EXPECT_FALSE(server_->GetObject("bucket", "runs/r1.xplane.pb").has_value());

  response =
      PutChunk(session, StrCat("bytes ", 2 * kQuantum, "-", data.size() - 1, "/", data.size()),
               std::string_view(data).substr(2 * kQuantum));
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  const web::json::value json = response->Json();
  EXPECT_EQ(JsonField(json, "name"), "runs/r1.xplane.pb");
  EXPECT_EQ(JsonField(json, "size"), std::to_string(data.size()));
  EXPECT_EQ(JsonField(json, "contentType"), "application/octet-stream+test");
  EXPECT_EQ(JsonField(json, "crc32c"), Crc32cToBase64(Crc32c(data)));
  EXPECT_EQ(JsonField(json, "md5Hash"), Md5Base64(data));
  const std::optional<GcsObjectSnapshot> stored = server_->GetObject("bucket", "runs/r1.xplane.pb");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->data, data);
  EXPECT_EQ(stored->metadata.at("host"), "h1");
  EXPECT_EQ(server_->active_resumable_sessions(), 0);

  // A finalized session answers later requests with the object.
  response = PutChunk(session, "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_EQ(JsonField(response->Json(), "generation"), JsonField(json, "generation"));
}

TEST_F(GcsTestServerTest, ResumableSingleRequestWithoutContentRange) {
  const std::string data = Pattern(1000);
  const std::string session = StartResumable("whole");
  std::optional<HttpResponse> response = Call("PUT", session, {}, data);
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  EXPECT_EQ(server_->GetObject("bucket", "whole")->data, data);
}

TEST_F(GcsTestServerTest, ResumableFinalizesByStatusQueryWithTheTotal) {
  const std::string data = Pattern(kQuantum);
  const std::string session = StartResumable("exact");
  std::optional<HttpResponse> response =
      PutChunk(session, StrCat("bytes 0-", kQuantum - 1, "/*"), data);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  response = PutChunk(session, StrCat("bytes */", kQuantum), "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200) << response->body;
  EXPECT_EQ(server_->GetObject("bucket", "exact")->data, data);
}

TEST_F(GcsTestServerTest, ResumableZeroByteObject) {
  const std::string session = StartResumable("empty");
  std::optional<HttpResponse> response = PutChunk(session, "bytes */0", "");
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  EXPECT_EQ(JsonField(response->Json(), "size"), "0");
  EXPECT_EQ(JsonField(response->Json(), "crc32c"), "AAAAAA==");
  EXPECT_EQ(JsonField(response->Json(), "md5Hash"), "1B2M2Y8AsgTpgAmY7PhCfg==");
  const std::optional<GcsObjectSnapshot> stored = server_->GetObject("bucket", "empty");
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->size, 0u);
}

TEST_F(GcsTestServerTest, ResumableRejectsUnalignedIntermediateChunk) {
  const std::string session = StartResumable("unaligned");
  std::optional<HttpResponse> response =
      PutChunk(session, StrCat("bytes 0-", kQuantum, "/*"), Pattern(kQuantum + 1));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  EXPECT_THAT(response->body, HasSubstr("262144"));
  // A known total that the chunk does not reach is the same.
  response = PutChunk(session, "bytes 0-99/1000", Pattern(100));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  // Nothing was kept.
  response = PutChunk(session, "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  EXPECT_FALSE(response->Header("Range").has_value());
}

TEST_F(GcsTestServerTest, ResumableIgnoresTheAlreadyPersistedPartOfAChunk) {
  const std::string data = Pattern(2 * kQuantum + 10, 3);
  const std::string session = StartResumable("overlap");
  std::optional<HttpResponse> response = PutChunk(session, StrCat("bytes 0-", kQuantum - 1, "/*"),
                                                  std::string_view(data).substr(0, kQuantum));
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 308);
  // The first chunk again (its answer "lost"), then both chunks at once.
  response = PutChunk(session, StrCat("bytes 0-", kQuantum - 1, "/*"),
                      std::string_view(data).substr(0, kQuantum));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  EXPECT_EQ(response->Header("Range"), StrCat("bytes=0-", kQuantum - 1));
  response = PutChunk(session, StrCat("bytes 0-", 2 * kQuantum - 1, "/*"),
                      std::string_view(data).substr(0, 2 * kQuantum));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  EXPECT_EQ(response->Header("Range"), StrCat("bytes=0-", 2 * kQuantum - 1));
  response =
      PutChunk(session, StrCat("bytes ", 2 * kQuantum, "-", data.size() - 1, "/", data.size()),
               std::string_view(data).substr(2 * kQuantum));
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  EXPECT_EQ(server_->GetObject("bucket", "overlap")->data, data);
  EXPECT_EQ(server_->GetObject("bucket", "overlap")->crc32c, Crc32cToBase64(Crc32c(data)));
}

TEST_F(GcsTestServerTest, ResumableRejectsAChunkBeyondThePersistedBytes) {
  const std::string session = StartResumable("gap");
  std::optional<HttpResponse> response =
      PutChunk(session, StrCat("bytes ", kQuantum, "-", 2 * kQuantum - 1, "/*"), Pattern(kQuantum));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  EXPECT_THAT(response->body, HasSubstr("resume from byte 0"));
}

TEST_F(GcsTestServerTest, ResumableRejectsBadContentRange) {
  const std::string session = StartResumable("badrange");
  for (const char* range : {"bytes 5-1/10", "bytes x-y/*", "items 0-1/2", "bytes 0-9/5"}) {
    std::optional<HttpResponse> response = PutChunk(session, range, "0123456789");
    ASSERT_TRUE(response.has_value());
    EXPECT_EQ(response->code, 400) << range;
  }
  // Content-Range and the body disagree.
  std::optional<HttpResponse> response = PutChunk(session, "bytes 0-9/10", "01234");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
}

TEST_F(GcsTestServerTest, ResumableFinalizationChecksTheDeclaredCrc32c) {
  const std::string data = Pattern(5000);
  const std::string session = StartResumable(
      "checked", StrCat(R"({"crc32c":")", Crc32cToBase64(Crc32c("something else")), R"("})"));
  std::optional<HttpResponse> response =
      PutChunk(session, StrCat("bytes 0-", data.size() - 1, "/", data.size()), data);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  EXPECT_THAT(response->body, HasSubstr("doesn't match calculated CRC32C"));
  EXPECT_FALSE(server_->GetObject("bucket", "checked").has_value());
  // The session failed for good.
  response = PutChunk(session, "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 410);
  EXPECT_EQ(server_->active_resumable_sessions(), 0);

  const std::string ok_session =
      StartResumable("checked", StrCat(R"({"crc32c":")", Crc32cToBase64(Crc32c(data)),
                                       R"(","md5Hash":")", Md5Base64(data), R"("})"));
  response = PutChunk(ok_session, StrCat("bytes 0-", data.size() - 1, "/", data.size()), data);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200) << response->body;

  // X-Goog-Hash on the final request is checked too.
  const std::string header_session = StartResumable("by-header");
  response = PutChunk(header_session, StrCat("bytes 0-", data.size() - 1, "/", data.size()), data,
                      {"X-Goog-Hash: crc32c=AAAAAA=="});
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
}

TEST_F(GcsTestServerTest, ResumableMetadataNameMustAgreeWithTheQuery) {
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=resumable&name=a",
           {"Content-Type: application/json"}, R"({"name":"b"})");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  response = Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=resumable",
                  {"Content-Type: application/json"}, R"({"name":"from-body"})");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_THAT(response->Header("Location").value_or(""), HasSubstr("name=from-body"));
  response = Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=resumable",
                  {"Content-Type: application/json"}, R"({"name": 5})");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
  response = Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=resumable",
                  {"Content-Type: application/json"}, "{not json");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
}

TEST_F(GcsTestServerTest, CancelledAndUnknownSessions) {
  const std::string session = StartResumable("cancelled");
  ASSERT_EQ(server_->active_resumable_sessions(), 1);
  std::optional<HttpResponse> response = Call("DELETE", session);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 499);
  EXPECT_TRUE(response->body.empty());
  EXPECT_EQ(server_->active_resumable_sessions(), 0);
  response = PutChunk(session, "bytes 0-9/10", "0123456789");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 410);
  response = PutChunk(session, "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 410);
  EXPECT_FALSE(server_->GetObject("bucket", "cancelled").has_value());

  response = PutChunk("/upload/storage/v1/b/bucket/o?uploadType=resumable&upload_id=nope",
                      "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 404);
  EXPECT_EQ(response->Json().at("error").at("errors").at(0).at("reason").as_string(), "notFound");
}

TEST_F(GcsTestServerTest, InsertPreconditions) {
  // ifGenerationMatch=0: only when the object does not exist.
  const std::string target =
      "/upload/storage/v1/b/bucket/o?uploadType=media&name=p&ifGenerationMatch=0";
  std::optional<HttpResponse> response = Call("POST", target, {}, "v1");
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200);
  const std::string generation = JsonField(response->Json(), "generation");
  response = Call("POST", target, {}, "v2");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 412);
  const web::json::value error = response->Json().at("error");
  EXPECT_EQ(error.at("code").as_integer(), 412);
  EXPECT_EQ(error.at("errors").at(0).at("reason").as_string(), "conditionNotMet");
  EXPECT_EQ(server_->GetObject("bucket", "p")->data, "v1");

  response = Call("POST",
                  StrCat("/upload/storage/v1/b/bucket/o?uploadType=media&name=p&ifGenerationMatch=",
                         generation),
                  {}, "v2");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_EQ(server_->GetObject("bucket", "p")->data, "v2");
  response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=p&ifMetagenerationMatch=2",
           {}, "v3");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 412);
  response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=p&ifGenerationMatch=abc",
           {}, "v3");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 400);
}

TEST_F(GcsTestServerTest, ResumablePreconditionsAreCheckedAtFinalization) {
  const std::string session = StartResumable("race", "", {}, "&ifGenerationMatch=0");
  // Another writer creates the object meanwhile.
  server_->PutObject("bucket", "race", "other");
  std::optional<HttpResponse> response = PutChunk(session, "bytes 0-4/5", "mine!");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 412);
  EXPECT_EQ(server_->GetObject("bucket", "race")->data, "other");
  response = PutChunk(session, "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 410);
}

TEST_F(GcsTestServerTest, GetAndDeletePreconditions) {
  server_->PutObject("bucket", "g", "data");
  const std::string generation = std::to_string(server_->GetObject("bucket", "g")->generation);
  std::optional<HttpResponse> response =
      Call("GET", StrCat("/storage/v1/b/bucket/o/g?ifGenerationMatch=", generation));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  response = Call("GET", "/storage/v1/b/bucket/o/g?alt=media&ifGenerationMatch=1");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 412);
  response =
      Call("GET", StrCat("/storage/v1/b/bucket/o/g?alt=media&ifGenerationNotMatch=", generation));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 304);
  EXPECT_TRUE(response->body.empty());
  response = Call("GET", "/storage/v1/b/bucket/o/g?ifMetagenerationMatch=1");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);

  response = Call("DELETE", "/storage/v1/b/bucket/o/g?ifGenerationMatch=1");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 412);
  EXPECT_TRUE(server_->GetObject("bucket", "g").has_value());
  response = Call("DELETE", StrCat("/storage/v1/b/bucket/o/g?ifGenerationMatch=", generation));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 204);
  EXPECT_TRUE(response->body.empty());
  EXPECT_FALSE(server_->GetObject("bucket", "g").has_value());
  response = Call("DELETE", "/storage/v1/b/bucket/o/g");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 404);
}

std::vector<std::string> Names(const web::json::value& json, const char* field) {
  std::vector<std::string> names;
  if (!json.has_field(field)) return names;
  for (const web::json::value& item : json.at(field).as_array()) {
    names.push_back(item.is_string() ? item.as_string() : item.at("name").as_string());
  }
  return names;
}

TEST_F(GcsTestServerTest, ListWithPrefixDelimiterAndPages) {
  for (const char* name :
       {"runs/a/1", "runs/a/2", "runs/b/1", "runs/c", "runs/d", "runs/e/x/y", "runs0", "other/1"}) {
    server_->PutObject("bucket", name, name);
  }
  // Everything under runs/, one level deep, two entries a page.
  std::vector<std::string> items;
  std::vector<std::string> prefixes;
  std::vector<std::vector<std::string>> pages;
  std::string token;
  for (int page = 0; page < 10; ++page) {
    std::optional<HttpResponse> response =
        Call("GET", StrCat("/storage/v1/b/bucket/o?prefix=runs%2F&delimiter=%2F&maxResults=2",
                           token.empty() ? "" : StrCat("&pageToken=", token)));
    ASSERT_TRUE(response.has_value());
    ASSERT_EQ(response->code, 200) << response->body;
    const web::json::value json = response->Json();
    EXPECT_EQ(JsonField(json, "kind"), "storage#objects");
    std::vector<std::string> page_items = Names(json, "items");
    std::vector<std::string> page_prefixes = Names(json, "prefixes");
    EXPECT_LE(page_items.size() + page_prefixes.size(), 2u);
    items.insert(items.end(), page_items.begin(), page_items.end());
    prefixes.insert(prefixes.end(), page_prefixes.begin(), page_prefixes.end());
    if (!json.has_field("nextPageToken")) break;
    token = PercentEncodeForTest(json.at("nextPageToken").as_string());
  }
  EXPECT_EQ(items, (std::vector<std::string>{"runs/c", "runs/d"}));
  EXPECT_EQ(prefixes, (std::vector<std::string>{"runs/a/", "runs/b/", "runs/e/"}));

  // Without a delimiter: every name under the prefix, in order, items carrying resources.
  std::optional<HttpResponse> response = Call("GET", "/storage/v1/b/bucket/o?prefix=runs");
  ASSERT_TRUE(response.has_value());
  const web::json::value json = response->Json();
  EXPECT_EQ(Names(json, "items"),
            (std::vector<std::string>{"runs/a/1", "runs/a/2", "runs/b/1", "runs/c", "runs/d",
                                      "runs/e/x/y", "runs0"}));
  EXPECT_FALSE(json.has_field("nextPageToken"));
  EXPECT_FALSE(json.has_field("prefixes"));
  EXPECT_EQ(JsonField(json.at("items").at(0), "size"), "8");

  response = Call("GET", "/storage/v1/b/bucket/o?startOffset=runs%2Fb&endOffset=runs%2Fe");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(Names(response->Json(), "items"),
            (std::vector<std::string>{"runs/b/1", "runs/c", "runs/d"}));

  // An empty listing has no items field.
  response = Call("GET", "/storage/v1/b/bucket/o?prefix=zzz");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_FALSE(response->Json().has_field("items"));
}

TEST_F(GcsTestServerTest, RangedDownloads) {
  const std::string data = "0123456789";
  server_->PutObject("bucket", "r", data);
  const GcsObjectSnapshot stored = *server_->GetObject("bucket", "r");
  std::optional<HttpResponse> response = Call("GET", "/download/storage/v1/b/bucket/o/r?alt=media");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_EQ(response->body, data);
  EXPECT_EQ(response->Header("x-goog-hash"),
            StrCat("crc32c=", stored.crc32c, ",md5=", stored.md5_hash));
  EXPECT_EQ(response->Header("x-goog-generation"), std::to_string(stored.generation));
  EXPECT_EQ(response->Header("Content-Length"), "10");
  EXPECT_EQ(response->Header("Content-Type"), "application/octet-stream");

  struct Case {
    const char* range;
    int code;
    const char* body;
    const char* content_range;
  };
  for (const Case& c :
       {Case{"bytes=2-4", 206, "234", "bytes 2-4/10"}, Case{"bytes=7-", 206, "789", "bytes 7-9/10"},
        Case{"bytes=-3", 206, "789", "bytes 7-9/10"},
        Case{"bytes=8-100", 206, "89", "bytes 8-9/10"},
        Case{"bytes=-100", 206, "0123456789", "bytes 0-9/10"},
        Case{"bytes=10-", 416, nullptr, "bytes */10"}, Case{"bytes=-0", 416, nullptr, "bytes */10"},
        Case{"bytes=4-2", 200, "0123456789", nullptr}}) {
    response = Call("GET", "/storage/v1/b/bucket/o/r?alt=media", {StrCat("Range: ", c.range)});
    ASSERT_TRUE(response.has_value());
    EXPECT_EQ(response->code, c.code) << c.range;
    if (c.body != nullptr) {
      EXPECT_EQ(response->body, c.body) << c.range;
    }
    if (c.content_range != nullptr) {
      EXPECT_EQ(response->Header("Content-Range"), c.content_range) << c.range;
    }
  }
  // Only the live generation exists.
  response = Call("GET", "/storage/v1/b/bucket/o/r?alt=media&generation=1");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 404);
  response =
      Call("GET", StrCat("/storage/v1/b/bucket/o/r?alt=media&generation=", stored.generation));
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
}

TEST_F(GcsTestServerTest, MissingBucketsAndObjectsAre404WithJsonErrors) {
  for (const auto& [method, target] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/storage/v1/b/nope"},
           {"GET", "/storage/v1/b/nope/o"},
           {"GET", "/storage/v1/b/nope/o/x"},
           {"GET", "/download/storage/v1/b/nope/o/x?alt=media"},
           {"DELETE", "/storage/v1/b/nope/o/x"},
           {"POST", "/upload/storage/v1/b/nope/o?uploadType=media&name=x"},
           {"POST", "/upload/storage/v1/b/nope/o?uploadType=resumable&name=x"}}) {
    std::optional<HttpResponse> response = Call(method, target, {}, "");
    ASSERT_TRUE(response.has_value());
    EXPECT_EQ(response->code, 404) << method << " " << target;
    const web::json::value error = response->Json().at("error");
    EXPECT_EQ(error.at("code").as_integer(), 404);
    EXPECT_EQ(error.at("message").as_string(), "The specified bucket does not exist.");
    EXPECT_EQ(error.at("errors").at(0).at("reason").as_string(), "notFound");
    EXPECT_EQ(error.at("errors").at(0).at("domain").as_string(), "global");
  }
  std::optional<HttpResponse> response = Call("GET", "/storage/v1/b/bucket/o/missing%2Fobj");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 404);
  EXPECT_EQ(response->Json().at("error").at("message").as_string(),
            "No such object: bucket/missing/obj");

  response = Call("GET", "/storage/v1/b/bucket");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_EQ(JsonField(response->Json(), "kind"), "storage#bucket");
  EXPECT_EQ(JsonField(response->Json(), "name"), "bucket");
}

TEST_F(GcsTestServerTest, AuthorizerAnswers401And403) {
  std::vector<std::pair<std::string, std::string>> seen;
  Mutex mu;
  server_->SetAuthorizer([&](std::string_view authorization, std::string_view bucket) {
    MutexLock lock(&mu);
    seen.emplace_back(std::string(authorization), std::string(bucket));
    if (authorization.empty()) return GcsAuthDecision::kUnauthenticated;
    if (authorization == "Bearer expired") return GcsAuthDecision::kUnauthenticated;
    if (bucket == "secret") return GcsAuthDecision::kForbidden;
    return GcsAuthDecision::kAllow;
  });
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=x", {}, "x");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 401);
  web::json::value error = response->Json().at("error");
  EXPECT_EQ(error.at("errors").at(0).at("reason").as_string(), "required");
  EXPECT_THAT(error.at("message").as_string(),
              HasSubstr("Anonymous caller does not have storage.objects.create access"));
  EXPECT_FALSE(server_->GetObject("bucket", "x").has_value());

  response = Call("GET", "/storage/v1/b/bucket/o", {"Authorization: Bearer expired"});
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 401);
  EXPECT_EQ(response->Json().at("error").at("errors").at(0).at("reason").as_string(), "authError");

  response = Call("GET", "/storage/v1/b/secret/o/y?alt=media", {"Authorization: Bearer good"});
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 403);
  error = response->Json().at("error");
  EXPECT_EQ(error.at("errors").at(0).at("reason").as_string(), "forbidden");
  EXPECT_THAT(error.at("message").as_string(),
              HasSubstr("does not have storage.objects.get access to the Google Cloud Storage "
                        "object"));

  response = Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=x",
                  {"Authorization: Bearer good"}, "x");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  MutexLock lock(&mu);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0], (std::pair<std::string, std::string>{"", "bucket"}));
  EXPECT_EQ(seen[2], (std::pair<std::string, std::string>{"Bearer good", "secret"}));
}

TEST_F(GcsTestServerTest, FailNextFailsMatchingRequestsOnly) {
  server_->FailNext(2, 503, "uploadType=media");
  server_->FailNext(1, 429, "GET /storage/v1/b/bucket/o/");
  server_->PutObject("bucket", "there", "x");
  const std::string upload = "/upload/storage/v1/b/bucket/o?uploadType=media&name=f";
  RawClient client(server_->port());
  std::optional<HttpResponse> response = client.Request("POST", upload, {}, "body");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 503);
  EXPECT_FALSE(response->Header("Retry-After").has_value());
  EXPECT_EQ(response->Json().at("error").at("errors").at(0).at("reason").as_string(),
            "backendError");
  // The failed request's body was read and dropped: the connection carries on.
  response = client.Request("GET", "/storage/v1/b/bucket/o/there");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 429);
  EXPECT_EQ(response->Json().at("error").at("errors").at(0).at("reason").as_string(),
            "rateLimitExceeded");
  response = client.Request("GET", "/storage/v1/b/bucket/o/there");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  response = client.Request("POST", upload, {}, "body");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 503);
  EXPECT_FALSE(server_->GetObject("bucket", "f").has_value());
  response = client.Request("POST", upload, {}, "body");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_EQ(server_->GetObject("bucket", "f")->data, "body");

  const std::vector<GcsRequestRecord> requests = server_->Requests();
  ASSERT_EQ(requests.size(), 5u);
  EXPECT_EQ(requests[0].method, "POST");
  EXPECT_EQ(requests[0].target, upload);
  EXPECT_EQ(requests[0].code, 503);
  EXPECT_EQ(requests[0].body_bytes, 4u);
  EXPECT_EQ(requests[1].code, 429);
  EXPECT_EQ(requests[4].code, 200);
  server_->ClearRequests();
  EXPECT_TRUE(server_->Requests().empty());
}

TEST_F(GcsTestServerTest, FailNextWithExpectContinueNeverAsksForTheBody) {
  server_->FailNext(1, 503);
  RawClient client(server_->port());
  ASSERT_TRUE(
      client.Send(client.Head("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=e",
                              {"Expect: 100-continue"}, 1000)));
  std::optional<HttpResponse> response = client.ReadResponse(false, true);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 503);
  EXPECT_EQ(response->Header("Connection"), "close");
}

TEST_F(GcsTestServerTest, ExpectContinueGetsAnInterimResponse) {
  RawClient client(server_->port());
  ASSERT_TRUE(
      client.Send(client.Head("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=e",
                              {"Expect: 100-continue"}, 3)));
  std::optional<HttpResponse> interim = client.ReadResponse(false, true);
  ASSERT_TRUE(interim.has_value());
  EXPECT_EQ(interim->code, 100);
  ASSERT_TRUE(client.Send("abc"));
  std::optional<HttpResponse> response = client.ReadResponse();
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_EQ(server_->GetObject("bucket", "e")->data, "abc");
}

TEST_F(GcsTestServerTest, FailureRateIsDeterministicForASeed) {
  constexpr uint64_t kSeed = 42;
  constexpr double kProbability = 0.3;
  constexpr int kRequests = 200;
  server_->PutObject("bucket", "o", "x");
  server_->SetFailureRate(kProbability, 503, kSeed);
  RawClient client(server_->port());
  std::vector<bool> failed;
  for (int i = 0; i < kRequests; ++i) {
    std::optional<HttpResponse> response = client.Request("GET", "/storage/v1/b/bucket/o/o");
    ASSERT_TRUE(response.has_value());
    ASSERT_TRUE(response->code == 200 || response->code == 503) << response->code;
    failed.push_back(response->code == 503);
  }
  // The documented draw, replayed.
  std::mt19937_64 rng(kSeed);
  std::vector<bool> expected;
  for (int i = 0; i < kRequests; ++i) {
    expected.push_back(static_cast<double>(rng() >> 11) * 0x1.0p-53 < kProbability);
  }
  EXPECT_EQ(failed, expected);
  const int count = static_cast<int>(std::count(failed.begin(), failed.end(), true));
  EXPECT_EQ(count, static_cast<int>(std::count(expected.begin(), expected.end(), true)));
  EXPECT_GT(count, kRequests / 5);
  EXPECT_LT(count, kRequests * 2 / 5);

  server_->SetFailureRate(0, 503, kSeed);
  std::optional<HttpResponse> response = client.Request("GET", "/storage/v1/b/bucket/o/o");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
}

TEST_F(GcsTestServerTest, ResetMidChunkKeepsWholeQuantaOnly) {
  const std::string data = Pattern(4 * kQuantum, 9);
  const std::string session = StartResumable("reset");
  constexpr uint64_t kResetAfter = 2 * kQuantum + 1000;
  server_->ResetNextUpload(kResetAfter);
  {
    RawClient client(server_->port());
    client.Send(client.Head(
        "PUT", session, {StrCat("Content-Range: bytes 0-", data.size() - 1, "/*")}, data.size()));
    client.Send(data);
    EXPECT_FALSE(client.ReadResponse().has_value());
    EXPECT_EQ(client.last_error(), ECONNRESET);
  }
  std::optional<HttpResponse> response = PutChunk(session, "bytes */*", "");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 308);
  const std::string range = response->Header("Range").value_or("");
  ASSERT_TRUE(StartsWith(range, "bytes=0-")) << range;
  const uint64_t persisted = std::stoull(range.substr(8)) + 1;
  EXPECT_EQ(persisted % kQuantum, 0u);
  EXPECT_LE(persisted, kResetAfter);
  EXPECT_EQ(persisted, 2 * kQuantum);
  const std::vector<GcsRequestRecord> requests = server_->Requests();
  ASSERT_GE(requests.size(), 2u);
  EXPECT_EQ(requests[requests.size() - 2].code, 0);
  EXPECT_EQ(requests[requests.size() - 2].body_bytes, kResetAfter);

  // The upload resumes from there.
  response = PutChunk(session, StrCat("bytes ", persisted, "-", data.size() - 1, "/", data.size()),
                      std::string_view(data).substr(persisted));
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  EXPECT_EQ(server_->GetObject("bucket", "reset")->data, data);
  EXPECT_EQ(server_->GetObject("bucket", "reset")->md5_hash, Md5Base64(data));
}

TEST_F(GcsTestServerTest, ResetMediaUploadStoresNothing) {
  server_->ResetNextUpload(10, 2);
  for (int i = 0; i < 2; ++i) {
    RawClient client(server_->port());
    EXPECT_FALSE(client
                     .Request("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=m", {},
                              Pattern(100))
                     .has_value());
  }
  EXPECT_FALSE(server_->GetObject("bucket", "m").has_value());
  // Used up: the next upload goes through. A body shorter than the reset point resets too.
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=m", {}, "ok");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  server_->ResetNextUpload(1000);
  RawClient client(server_->port());
  EXPECT_FALSE(
      client.Request("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=m", {}, "short")
          .has_value());
  EXPECT_EQ(server_->GetObject("bucket", "m")->data, "ok");
}

TEST_F(GcsTestServerTest, LatencyDelaysEachResponse) {
  server_->PutObject("bucket", "o", "x");
  server_->SetLatency(absl::Milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  std::optional<HttpResponse> response = Call("GET", "/storage/v1/b/bucket/o/o");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(200));
  server_->ClearFaults();
}

TEST_F(GcsTestServerTest, BodyReadRateThrottlesUploads) {
  server_->SetBodyReadRate(1 << 20);
  const std::string data = Pattern(256 * 1024);
  const auto start = std::chrono::steady_clock::now();
  std::optional<HttpResponse> response =
      Call("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=slow", {}, data);
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  // 256 KiB at 1 MiB/s.
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(240));
  EXPECT_EQ(server_->GetObject("bucket", "slow")->data, data);
}

TEST_F(GcsTestServerTest, KeepAliveAndConnectionClose) {
  server_->PutObject("bucket", "o", "x");
  RawClient client(server_->port());
  for (int i = 0; i < 3; ++i) {
    std::optional<HttpResponse> response = client.Request("GET", "/storage/v1/b/bucket/o/o");
    ASSERT_TRUE(response.has_value());
    EXPECT_EQ(response->code, 200);
    EXPECT_FALSE(response->Header("Connection").has_value());
  }
  std::optional<HttpResponse> response =
      client.Request("GET", "/storage/v1/b/bucket/o/o", {"Connection: close"});
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->Header("Connection"), "close");
  EXPECT_TRUE(client.ReadsEndOfStream());
}

uint64_t LargestFileSize(const std::string& dir) {
  uint64_t largest = 0;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return 0;
  while (dirent* entry = readdir(d)) {
    struct stat st;
    if (stat(StrCat(dir, "/", entry->d_name).c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      largest = std::max<uint64_t>(largest, static_cast<uint64_t>(st.st_size));
    }
  }
  closedir(d);
  return largest;
}

TEST(GcsTestServerDataDirTest, StreamsUploadsToFiles) {
  TempDir dir;
  GcsTestServer::Options options;
  options.data_dir = dir.path();
  auto server = GcsTestServer::Start(options);
  ASSERT_TRUE(server.ok()) << server.status();
  (*server)->CreateBucket("bucket");
  constexpr size_t kSize = size_t{64} << 20;
  const std::string data = Pattern(kSize, 5);

  RawClient client((*server)->port());
  ASSERT_TRUE(client.Send(
      client.Head("POST", "/upload/storage/v1/b/bucket/o?uploadType=media&name=big", {}, kSize)));
  ASSERT_TRUE(client.Send(std::string_view(data).substr(0, kSize / 2)));
  // The first half reaches the disk while the request is still incomplete.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (LargestFileSize(dir.path()) < kSize / 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(LargestFileSize(dir.path()), kSize / 2);
  ASSERT_TRUE(client.Send(std::string_view(data).substr(kSize / 2)));
  std::optional<HttpResponse> response = client.ReadResponse();
  ASSERT_TRUE(response.has_value());
  ASSERT_EQ(response->code, 200) << response->body;
  EXPECT_EQ(JsonField(response->Json(), "crc32c"), Crc32cToBase64(Crc32c(data)));
  EXPECT_EQ(LargestFileSize(dir.path()), kSize);

  response = client.Request("GET", "/storage/v1/b/bucket/o/big?alt=media",
                            {StrCat("Range: bytes=", kSize - 10, "-")});
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 206);
  EXPECT_EQ(response->body, data.substr(kSize - 10));
  response = client.Request("GET", "/storage/v1/b/bucket/o/big?alt=media");
  ASSERT_TRUE(response.has_value());
  EXPECT_TRUE(response->body == data);
  const std::optional<GcsObjectSnapshot> stored = (*server)->GetObject("bucket", "big");
  ASSERT_TRUE(stored.has_value());
  EXPECT_TRUE(stored->data == data);

  // Deleting the object removes its file.
  response = client.Request("DELETE", "/storage/v1/b/bucket/o/big");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 204);
  EXPECT_EQ(LargestFileSize(dir.path()), 0u);
}

TEST(GcsTestServerBinaryTest, StartsAndWritesItsPort) {
  TempDir dir;
  const std::string port_file = dir.Join("port");
  Subprocess process({CLUSTERPROF_GCS_TEST_SERVER_PATH, "--port-file", port_file, "--bucket", "one",
                      "--bucket", "two", "--data-dir", dir.path()},
                     {}, dir.Join("log"));
  ASSERT_TRUE(WaitForFile(port_file)) << ReadFileOrDie(dir.Join("log"));
  const int port = std::stoi(ReadFileOrDie(port_file));
  ASSERT_GT(port, 0);
  RawClient client(port);
  ASSERT_TRUE(client.connected());
  std::optional<HttpResponse> response =
      client.Request("POST", "/upload/storage/v1/b/two/o?uploadType=media&name=x", {}, "hi");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  response = client.Request("GET", "/storage/v1/b/one");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->code, 200);
  response = client.Request("GET", "/storage/v1/b/two/o/x?alt=media");
  ASSERT_TRUE(response.has_value());
  EXPECT_EQ(response->body, "hi");
  process.Signal(SIGTERM);
  const std::optional<int> status = process.Wait();
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
}

}  // namespace
}  // namespace clusterprof::testing
