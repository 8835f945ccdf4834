#include "common/storage/gcs_client.h"

#include <algorithm>
#include <cctype>
#include <random>
#include <utility>

#include "absl/strings/numbers.h"
#include "common/base/json_escape.h"
#include "common/base/mutex.h"
#include "common/base/status.h"
#include "common/base/strings.h"
#include "common/http/status.h"
#include "common/http/transport.h"
#include "common/io/crc32c.h"
#include "common/storage/gcs_credentials.h"
#include "cpprest/base_uri.h"
#include "cpprest/json.h"

namespace clusterprof::storage::gcs {
namespace {

// Unreserved characters (RFC 3986) stay; everything else, '/' included, is %XX.
std::string PercentEncode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size() * 3);
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

// The message of a JSON API error body ({"error": {"message": ...}}), else the body itself,
// shortened.
std::string ErrorMessage(const std::string& body) {
  try {
    const web::json::value json = web::json::value::parse(body);
    if (json.has_object_field("error")) {
      const web::json::value& error = json.at("error");
      if (error.has_string_field("message")) {
        std::string message = error.at("message").as_string();
        while (EndsWith(message, ".")) message.pop_back();
        return message;
      }
    }
  } catch (const std::exception&) {
  }
  std::string text(StripAsciiWhitespace(body));
  while (EndsWith(text, ".")) text.pop_back();
  if (text.size() > 300) text = StrCat(text.substr(0, 300), "...");
  return text;
}

std::optional<uint64_t> ParseUint(std::string_view text) {
  uint64_t value = 0;
  if (!absl::SimpleAtoi(AbslView(text), &value)) return std::nullopt;
  return value;
}

absl::StatusOr<ObjectMetadata> ParseObject(const std::string& body, std::string_view what) {
  try {
    const web::json::value json = web::json::value::parse(body);
    ObjectMetadata out;
    auto text = [&](const char* key) -> std::string {
      return json.has_string_field(key) ? json.at(key).as_string() : std::string();
    };
    out.bucket = text("bucket");
    out.name = text("name");
    if (std::optional<uint64_t> g = ParseUint(text("generation"))) {
      out.generation = static_cast<int64_t>(*g);
    }
    if (std::optional<uint64_t> size = ParseUint(text("size"))) out.size = *size;
    if (json.has_string_field("crc32c")) {
      out.crc32c = Crc32cFromBase64(json.at("crc32c").as_string());
      if (!out.crc32c.has_value()) {
        return absl::DataLossError(StrCat(what, ": the server reported a malformed crc32c '",
                                          json.at("crc32c").as_string(), "'"));
      }
    }
    out.md5_hash = text("md5Hash");
    out.content_type = text("contentType");
    if (json.has_object_field("metadata")) {
      for (const auto& [key, value] : json.at("metadata").as_object()) {
        if (value.is_string()) out.metadata[key] = value.as_string();
      }
    }
    return out;
  } catch (const std::exception& e) {
    return absl::InternalError(
        StrCat(what, ": the server's object resource is not valid JSON: ", e.what()));
  }
}

std::string MetadataJson(const UploadRequest& request) {
  std::string json = "{\"name\":\"";
  AppendJsonEscaped(request.name, &json);
  json += "\",\"contentType\":\"";
  AppendJsonEscaped(request.content_type, &json);
  StrAppend(&json, "\",\"crc32c\":\"", Crc32cToBase64(request.crc32c), "\"");
  if (!request.metadata.empty()) {
    json += ",\"metadata\":{";
    bool first = true;
    for (const auto& [key, value] : request.metadata) {
      if (!first) json.push_back(',');
      first = false;
      json.push_back('"');
      AppendJsonEscaped(key, &json);
      json += "\":\"";
      AppendJsonEscaped(value, &json);
      json.push_back('"');
    }
    json.push_back('}');
  }
  json.push_back('}');
  return json;
}

// "bytes=0-1048575" -> 1048576 committed bytes; no header -> 0.
absl::StatusOr<uint64_t> CommittedFromRange(std::string_view range, std::string_view what) {
  if (range.empty()) return 0;
  std::string_view rest = range;
  if (!ConsumePrefix(&rest, "bytes=")) ConsumePrefix(&rest, "bytes ");
  const size_t dash = rest.find('-');
  std::optional<uint64_t> last =
      dash == std::string_view::npos ? std::nullopt : ParseUint(rest.substr(dash + 1));
  if (!last.has_value() || ParseUint(rest.substr(0, dash)) != uint64_t{0}) {
    return absl::InternalError(
        StrCat(what, ": the server answered 308 with a malformed Range header '", range, "'"));
  }
  return *last + 1;
}

struct Response {
  int code = 0;
  std::string body;
  std::string location;
  std::string range;
};

}  // namespace

struct Client::Impl {
  explicit Impl(ClientOptions opts)
      : options(std::move(opts)),
        owned_transport(options.transport != nullptr ? nullptr : NewTransport(options)),
        transport(options.transport != nullptr ? options.transport : owned_transport.get()) {}

  static std::unique_ptr<http::Transport> NewTransport(const ClientOptions& options) {
    http::CppRestTransportOptions transport;
    transport.timeout_ns = options.request_timeout_ns;
    // The size of the pieces a request body is copied and sent in. Small enough that a piece
    // is still in the CPU's cache when the kernel copies it out: 128 KiB uploaded 1 GiB in
    // 0.43-0.8 s, 1 MiB in 1.0 s, 4 MiB in 1.05 s (bench/RESULTS.md).
    transport.chunk_size = 128 << 10;
    return http::NewCppRestTransport(std::move(transport));
  }

  const ClientOptions options;
  const std::unique_ptr<http::Transport> owned_transport;
  http::Transport* const transport;

  // Sends one request to `url` (absolute) and reads the whole response. A transport failure
  // is Unavailable. A 401 refreshes the token and sends once more.
  absl::StatusOr<Response> Send(std::string_view what, const std::string& method,
                                const std::string& url,
                                const std::vector<std::pair<std::string, std::string>>& headers,
                                std::optional<std::string_view> body,
                                std::string_view content_type) {
    for (int attempt = 0;; ++attempt) {
      absl::StatusOr<std::string> authorization = options.credentials->AuthorizationHeader();
      if (!authorization.ok()) {
        return absl::Status(authorization.status().code(),
                            StrCat(what, ": no access token: ", authorization.status().message()));
      }
      http::Request request;
      request.method = method;
      request.url = url;
      request.headers.emplace_back("User-Agent", options.user_agent);
      if (!authorization->empty()) request.headers.emplace_back("Authorization", *authorization);
      // User credentials name the project their requests are billed to.
      if (std::string project = options.credentials->QuotaProject(); !project.empty()) {
        request.headers.emplace_back("x-goog-user-project", std::move(project));
      }
      for (const auto& header : headers) request.headers.push_back(header);
      // Straight from the caller's buffer (valid until this returns): no copy of a chunk.
      request.body = body;
      request.content_type = std::string(content_type);
      absl::StatusOr<http::Response> response = transport->Send(request);
      if (!response.ok()) {
        return absl::UnavailableError(
            StrCat(what, ": ", ServerOf(url), " did not answer: ", response.status().message()));
      }
      if (response->status == 401 && attempt == 0) {
        options.credentials->Invalidate();
        continue;
      }
      Response out;
      out.code = response->status;
      out.location = response->Header("Location");
      out.range = response->Header("Range");
      out.body = std::move(response->body);
      return out;
    }
  }

  // "scheme://authority" of `url`.
  static std::string ServerOf(const std::string& url) {
    const size_t scheme_end = url.find("://");
    const size_t path_start =
        scheme_end == std::string::npos ? std::string::npos : url.find('/', scheme_end + 3);
    return path_start == std::string::npos ? url : url.substr(0, path_start);
  }

  absl::Status HttpError(std::string_view what, const Response& response) {
    std::string message = StrCat(what, ": HTTP ", response.code);
    StrAppend(&message, " ", http::ReasonPhrase(response.code));
    if (std::string detail = ErrorMessage(response.body); !detail.empty()) {
      StrAppend(&message, ": ", detail);
    }
    if (response.code == 401 || response.code == 403) {
      StrAppend(&message, " (as ", options.credentials->Identity(),
                "; it needs a role with storage.objects.create, get and list on the bucket, "
                "such as roles/storage.objectAdmin)");
    }
    return absl::Status(http::StatusCodeFor(response.code, http::Api::kGcs), message);
  }

  // Calls `call` until it succeeds, fails for good, or the deadline passes; sleeps a jittered,
  // growing pause between attempts.
  template <typename T>
  absl::StatusOr<T> Retry(std::string_view what, const std::function<absl::StatusOr<T>()>& call) {
    Backoff backoff(options.retry.backoff);
    const int64_t deadline = options.clock->MonotonicNs() + options.retry.deadline_ns;
    for (int attempt = 1;; ++attempt) {
      absl::StatusOr<T> result = call();
      if (result.ok() || !IsTransient(result.status())) return result;
      const int64_t delay = backoff.NextDelayNs();
      if (options.clock->MonotonicNs() + delay > deadline) {
        return absl::Status(result.status().code(),
                            StrCat(result.status().message(), " (gave up after ", attempt,
                                   attempt == 1 ? " attempt)" : " attempts)"));
      }
      if (options.on_retry) options.on_retry(what, result.status());
      if (!Pause(delay)) {
        return absl::CancelledError(
            StrCat(what, ": stopped while retrying after: ", result.status().message()));
      }
    }
  }

  // Sleeps `delay_ns`; false when the stop flag ended the pause.
  bool Pause(int64_t delay_ns) {
    const int64_t deadline = options.clock->MonotonicNs() + delay_ns;
    if (options.stop == nullptr) {
      options.clock->SleepUntilMonotonicNs(deadline);
      return true;
    }
    options.clock->SleepUntilMonotonicNsUnless(deadline, *options.stop);
    return !options.stop->load(std::memory_order_acquire);
  }

  std::string ObjectPath(std::string_view bucket, std::string_view name) {
    return StrCat(options.endpoint, "/storage/v1/b/", PercentEncode(bucket), "/o/",
                  PercentEncode(name));
  }

  absl::StatusOr<std::string> StartSession(const UploadRequest& request) {
    const std::string what = StrCat("start upload of ", ObjectUri(request.bucket, request.name));
    const std::string url =
        StrCat(options.endpoint, "/upload/storage/v1/b/", PercentEncode(request.bucket),
               "/o?uploadType=resumable&name=", PercentEncode(request.name),
               request.if_generation_match >= 0
                   ? StrCat("&ifGenerationMatch=", request.if_generation_match)
                   : std::string());
    return Retry<std::string>(what, [&]() -> absl::StatusOr<std::string> {
      const std::string json = MetadataJson(request);
      CLUSTERPROF_ASSIGN_OR_RETURN(Response response,
                                   Send(what, "POST", url,
                                        {{"X-Upload-Content-Type", request.content_type},
                                         {"X-Upload-Content-Length", StrCat(request.size)}},
                                        json, "application/json; charset=UTF-8"));
      if (response.code != 200 && response.code != 201) return HttpError(what, response);
      if (response.location.empty()) {
        return absl::InternalError(StrCat(what, ": the server gave no session URI (Location)"));
      }
      return response.location;
    });
  }

  // One PUT to the session: a chunk, or (with no data) a status query. Returns the object when
  // the upload is complete, else the committed offset.
  struct PutResult {
    uint64_t committed = 0;
    std::optional<ObjectMetadata> object;
  };
  absl::StatusOr<PutResult> Put(std::string_view what, const std::string& session_uri,
                                std::string content_range, std::optional<std::string_view> body) {
    CLUSTERPROF_ASSIGN_OR_RETURN(
        Response response, Send(what, "PUT", session_uri, {{"Content-Range", content_range}}, body,
                                "application/octet-stream"));
    PutResult result;
    if (response.code == 200 || response.code == 201) {
      CLUSTERPROF_ASSIGN_OR_RETURN(ObjectMetadata object, ParseObject(response.body, what));
      result.committed = object.size;
      result.object = std::move(object);
      return result;
    }
    if (response.code == 308) {
      CLUSTERPROF_ASSIGN_OR_RETURN(result.committed, CommittedFromRange(response.range, what));
      return result;
    }
    return HttpError(what, response);
  }

  class ResumableUpload;
};

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

absl::StatusOr<std::unique_ptr<Client>> Client::Create(ClientOptions options) {
  if (options.credentials == nullptr || options.clock == nullptr) {
    return absl::InvalidArgumentError("GCS client: credentials and clock are required");
  }
  std::string endpoint = options.endpoint;
  while (EndsWith(endpoint, "/")) endpoint.pop_back();
  if (endpoint.find("://") == std::string::npos) endpoint = StrCat("http://", endpoint);
  if (!StartsWith(endpoint, "http://") && !StartsWith(endpoint, "https://")) {
    return absl::InvalidArgumentError(
        StrCat("GCS endpoint '", options.endpoint, "' is not an http:// or https:// URL"));
  }
  try {
    web::uri parsed(endpoint);
    if (parsed.host().empty()) throw std::invalid_argument("no host");
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        StrCat("GCS endpoint '", options.endpoint, "' is not a valid URL: ", e.what()));
  }
  options.endpoint = std::move(endpoint);
  return std::unique_ptr<Client>(new Client(std::make_unique<Impl>(std::move(options))));
}

const ClientOptions& Client::options() const { return impl_->options; }

std::string Client::Identity() const { return impl_->options.credentials->Identity(); }

absl::StatusOr<ObjectMetadata> Client::GetObjectMetadata(std::string_view bucket,
                                                         std::string_view name) {
  const std::string what = StrCat("stat ", ObjectUri(bucket, name));
  const std::string url = impl_->ObjectPath(bucket, name);
  return impl_->Retry<ObjectMetadata>(what, [&]() -> absl::StatusOr<ObjectMetadata> {
    CLUSTERPROF_ASSIGN_OR_RETURN(Response response,
                                 impl_->Send(what, "GET", url, {}, std::nullopt, ""));
    if (response.code != 200) return impl_->HttpError(what, response);
    return ParseObject(response.body, what);
  });
}

absl::StatusOr<ListResult> Client::ListObjects(std::string_view bucket, std::string_view prefix,
                                               std::string_view delimiter, int page_size) {
  const std::string what = StrCat("list ", ObjectUri(bucket, prefix));
  ListResult result;
  std::string page_token;
  do {
    std::string url = StrCat(impl_->options.endpoint, "/storage/v1/b/", PercentEncode(bucket),
                             "/o?prefix=", PercentEncode(prefix));
    if (!delimiter.empty()) StrAppend(&url, "&delimiter=", PercentEncode(delimiter));
    if (page_size > 0) StrAppend(&url, "&maxResults=", page_size);
    if (!page_token.empty()) StrAppend(&url, "&pageToken=", PercentEncode(page_token));
    CLUSTERPROF_ASSIGN_OR_RETURN(
        std::string body, impl_->Retry<std::string>(what, [&]() -> absl::StatusOr<std::string> {
          CLUSTERPROF_ASSIGN_OR_RETURN(Response response,
                                       impl_->Send(what, "GET", url, {}, std::nullopt, ""));
          if (response.code != 200) return impl_->HttpError(what, response);
          return std::move(response.body);
        }));
    page_token.clear();
    try {
      const web::json::value json = web::json::value::parse(body);
      if (json.has_array_field("items")) {
        for (const web::json::value& item : json.at("items").as_array()) {
          CLUSTERPROF_ASSIGN_OR_RETURN(ObjectMetadata object, ParseObject(item.serialize(), what));
          result.objects.push_back(std::move(object));
        }
      }
      if (json.has_array_field("prefixes")) {
        for (const web::json::value& p : json.at("prefixes").as_array()) {
          if (p.is_string()) result.prefixes.push_back(p.as_string());
        }
      }
      if (json.has_string_field("nextPageToken")) {
        page_token = json.at("nextPageToken").as_string();
      }
    } catch (const std::exception& e) {
      return absl::InternalError(StrCat(what, ": the listing is not valid JSON: ", e.what()));
    }
  } while (page_size == 0 && !page_token.empty());
  return result;
}

absl::StatusOr<std::string> Client::ReadRange(std::string_view bucket, std::string_view name,
                                              uint64_t offset, uint64_t length,
                                              int64_t generation) {
  const std::string what = StrCat("read ", ObjectUri(bucket, name));
  if (length == 0) return std::string();
  std::string url = StrCat(impl_->ObjectPath(bucket, name), "?alt=media");
  if (generation > 0) StrAppend(&url, "&ifGenerationMatch=", generation);
  const std::string range = StrCat("bytes=", offset, "-", offset + length - 1);
  return impl_->Retry<std::string>(what, [&]() -> absl::StatusOr<std::string> {
    CLUSTERPROF_ASSIGN_OR_RETURN(
        Response response, impl_->Send(what, "GET", url, {{"Range", range}}, std::nullopt, ""));
    if (response.code == 416) return std::string();  // at or past the end
    if (response.code == 200) {
      // The whole object (a server that ignores Range): cut out the part asked for.
      if (offset >= response.body.size()) return std::string();
      return response.body.substr(offset, length);
    }
    if (response.code != 206) return impl_->HttpError(what, response);
    return std::move(response.body);
  });
}

absl::Status Client::DeleteObject(std::string_view bucket, std::string_view name) {
  const std::string what = StrCat("delete ", ObjectUri(bucket, name));
  const std::string url = impl_->ObjectPath(bucket, name);
  return impl_
      ->Retry<bool>(what,
                    [&]() -> absl::StatusOr<bool> {
                      CLUSTERPROF_ASSIGN_OR_RETURN(
                          Response response,
                          impl_->Send(what, "DELETE", url, {}, std::nullopt, ""));
                      if (response.code != 204 && response.code != 200) {
                        return impl_->HttpError(what, response);
                      }
                      return true;
                    })
      .status();
}

absl::StatusOr<ObjectMetadata> Client::InsertObject(const UploadRequest& request,
                                                    std::string_view content) {
  const std::string what = StrCat("upload ", ObjectUri(request.bucket, request.name));
  const std::string url = StrCat(impl_->options.endpoint, "/upload/storage/v1/b/",
                                 PercentEncode(request.bucket), "/o?uploadType=multipart");
  // A boundary that does not occur in the content.
  std::mt19937_64 random(std::random_device{}());
  std::string boundary;
  do {
    boundary = StrCat("clusterprof_", random(), random());
  } while (content.find(boundary) != std::string_view::npos);
  const std::string head =
      StrCat("--", boundary, "\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n",
             MetadataJson(request), "\r\n--", boundary, "\r\nContent-Type: ", request.content_type,
             "\r\n\r\n");
  const std::string tail = StrCat("\r\n--", boundary, "--\r\n");
  std::string body;
  body.reserve(head.size() + content.size() + tail.size());
  body.append(head).append(content).append(tail);
  CLUSTERPROF_ASSIGN_OR_RETURN(
      ObjectMetadata object,
      impl_->Retry<ObjectMetadata>(what, [&]() -> absl::StatusOr<ObjectMetadata> {
        CLUSTERPROF_ASSIGN_OR_RETURN(Response response,
                                     impl_->Send(what, "POST", url, {}, body,
                                                 StrCat("multipart/related; boundary=", boundary)));
        if (response.code != 200 && response.code != 201) {
          return impl_->HttpError(what, response);
        }
        return ParseObject(response.body, what);
      }));
  if (object.size != content.size() ||
      (object.crc32c.has_value() && *object.crc32c != request.crc32c)) {
    return absl::DataLossError(StrCat(what, ": the stored object (", object.size, " bytes, crc32c ",
                                      object.crc32c ? Crc32cToBase64(*object.crc32c) : "none",
                                      ") does not match what was sent (", content.size(),
                                      " bytes, crc32c ", Crc32cToBase64(request.crc32c), ")"));
  }
  return object;
}

absl::StatusOr<ObjectMetadata> Client::UploadResumable(
    const UploadRequest& request, const ChunkFn& chunk, ResumableState state, size_t chunk_bytes,
    const std::function<void(const UploadProgress&)>& progress, const std::atomic<bool>* cancel) {
  // A server that finalized a short or corrupt object (a status query answered by finalizing
  // what it held) is not the end: the upload goes again from the source, in a fresh session
  // written over that generation only, so that nothing newer is overwritten. Twice at most.
  UploadRequest current = request;
  for (int reuploads = 0;; ++reuploads) {
    absl::StatusOr<ObjectMetadata> object =
        UploadResumableOnce(current, chunk, state, chunk_bytes, progress, cancel);
    if (object.ok() || !absl::IsDataLoss(object.status()) || reuploads == 2) return object;
    const auto generation = object.status().GetPayload(kGenerationPayload);
    if (!generation.has_value()) return object;
    int64_t bad = 0;
    if (!absl::SimpleAtoi(std::string(*generation), &bad)) return object;
    if (impl_->options.on_retry) {
      impl_->options.on_retry(
          StrCat("upload ", ObjectUri(request.bucket, request.name)),
          absl::DataLossError(
              StrCat(object.status().message(), "; uploading it again over generation ", bad)));
    }
    current.if_generation_match = bad;
    state = ResumableState();
  }
}

// One resumable upload to its finished object: the session's requests in turn, each from what
// the server holds, transient failures retried after a pause until no progress was made for the
// retry deadline.
class Client::Impl::ResumableUpload {
 public:
  ResumableUpload(Impl& impl, const UploadRequest& request, const ChunkFn& chunk,
                  ResumableState state, size_t chunk_bytes,
                  const std::function<void(const UploadProgress&)>& progress,
                  const std::atomic<bool>* cancel)
      : impl_(impl),
        request_(request),
        chunk_(chunk),
        state_(std::move(state)),
        chunk_bytes_(chunk_bytes),
        progress_(progress),
        cancel_(cancel),
        what_(StrCat("upload ", ObjectUri(request.bucket, request.name))),
        backoff_(impl.options.retry.backoff),
        deadline_ns_(impl.options.clock->MonotonicNs() + impl.options.retry.deadline_ns),
        ask_first_(!state_.session_uri.empty()) {}

  absl::StatusOr<ObjectMetadata> Run() {
    if (chunk_bytes_ == 0 || chunk_bytes_ % kChunkQuantum != 0) {
      return absl::InvalidArgumentError(
          StrCat(what_, ": the chunk size ", chunk_bytes_, " is not a multiple of 256 KiB"));
    }
    while (!object_.has_value()) {
      if (cancel_ != nullptr && cancel_->load(std::memory_order_acquire)) {
        return absl::CancelledError(StrCat(what_, ": cancelled at byte ", state_.committed));
      }
      if (state_.session_uri.empty()) {
        // StartSession retries by itself.
        CLUSTERPROF_ASSIGN_OR_RETURN(state_.session_uri, impl_.StartSession(request_));
        state_.committed = 0;
        ask_first_ = false;
        Report();
        continue;
      }
      absl::Status failed;
      CLUSTERPROF_RETURN_IF_ERROR(ask_first_ ? AskCommitted(&failed) : SendChunk(&failed));
      if (!failed.ok()) CLUSTERPROF_RETURN_IF_ERROR(WaitToRetry(failed));
    }
    CLUSTERPROF_RETURN_IF_ERROR(CheckFinished(*object_));
    return *std::move(object_);
  }

 private:
  void Report() {
    if (progress_) progress_(UploadProgress{state_.committed, request_.size, state_});
  }

  // The server's answer to a PUT: what it holds, and the object once complete.
  absl::Status Take(PutResult put) {
    if (put.committed > request_.size) {
      return absl::InternalError(StrCat(what_, ": the server holds ", put.committed, " bytes of a ",
                                        request_.size, "-byte object"));
    }
    state_.committed = put.committed;
    object_ = std::move(put.object);
    return absl::OkStatus();
  }

  // A PUT that failed: the session gone (expired or cancelled) starts over at once; any other
  // failure goes to `failed`, to be retried if transient.
  void Failed(absl::Status status, absl::Status* failed) {
    if (absl::IsNotFound(status)) {
      state_ = ResumableState();
      Report();
      return;
    }
    *failed = std::move(status);
  }

  // How much the server holds (after a failure, or when resuming a session). The returned
  // status is fatal; a failed request goes to `failed`.
  absl::Status AskCommitted(absl::Status* failed) {
    absl::StatusOr<PutResult> put = impl_.Put(StrCat(what_, " (status query)"), state_.session_uri,
                                              StrCat("bytes */", request_.size), std::nullopt);
    if (!put.ok()) {
      Failed(put.status(), failed);
      return absl::OkStatus();
    }
    ask_first_ = false;
    CLUSTERPROF_RETURN_IF_ERROR(Take(*std::move(put)));
    if (!object_.has_value()) Report();
    return absl::OkStatus();
  }

  // The next chunk from what the server holds (none for an empty object). The returned status
  // is fatal; a failed request goes to `failed`.
  absl::Status SendChunk(absl::Status* failed) {
    const uint64_t before = state_.committed;
    const uint64_t size = std::min<uint64_t>(chunk_bytes_, request_.size - before);
    const std::string range =
        size == 0 ? StrCat("bytes */", request_.size)
                  : StrCat("bytes ", before, "-", before + size - 1, "/", request_.size);
    std::optional<std::string_view> body;
    if (size > 0) {
      absl::StatusOr<std::string_view> data = chunk_(before, size);
      if (!data.ok()) return Annotate(data.status(), what_);
      if (data->size() != size) {
        return absl::InternalError(StrCat(what_, ": the source gave ", data->size(),
                                          " bytes at offset ", before, ", not ", size));
      }
      body = *data;
    }
    absl::StatusOr<PutResult> put = impl_.Put(what_, state_.session_uri, range, body);
    if (!put.ok()) {
      Failed(put.status(), failed);
      return absl::OkStatus();
    }
    CLUSTERPROF_RETURN_IF_ERROR(Take(*std::move(put)));
    if (!object_.has_value()) {
      Report();
      if (state_.committed <= before && ++failures_ > 3) {
        // Accepted but not persisted, again and again: a server that makes no progress.
        *failed = absl::UnavailableError(
            StrCat(what_, ": the server keeps answering without persisting byte ", before));
        return absl::OkStatus();
      }
    }
    if (state_.committed > before) {
      failures_ = 0;
      backoff_.Reset();
      deadline_ns_ = impl_.options.clock->MonotonicNs() + impl_.options.retry.deadline_ns;
    }
    return absl::OkStatus();
  }

  // After a failed request: a transient one is retried after a pause (asking first what the
  // server holds), unless no progress was made for the retry deadline; any other is returned.
  absl::Status WaitToRetry(const absl::Status& failed) {
    if (!IsTransient(failed)) return failed;
    const int64_t delay = backoff_.NextDelayNs();
    if (impl_.options.clock->MonotonicNs() + delay > deadline_ns_) {
      return absl::Status(failed.code(),
                          StrCat(failed.message(), " (gave up: no progress for ",
                                 impl_.options.retry.deadline_ns / kNanosPerSecond, " s)"));
    }
    if (impl_.options.on_retry) impl_.options.on_retry(what_, failed);
    if (!impl_.Pause(delay)) {
      return absl::CancelledError(StrCat(what_, ": stopped at byte ", state_.committed,
                                         " while retrying after: ", failed.message()));
    }
    ask_first_ = true;
    return absl::OkStatus();
  }

  // The finished object against what was sent: DataLoss, naming the object's generation (for
  // UploadResumable to write over it and nothing newer), when its size or crc32c differ.
  absl::Status CheckFinished(const ObjectMetadata& object) const {
    absl::Status mismatch;
    if (object.size != request_.size) {
      mismatch = absl::DataLossError(StrCat(what_, ": the finished object has ", object.size,
                                            " bytes, not the ", request_.size, " sent"));
    } else if (object.crc32c.has_value() && *object.crc32c != request_.crc32c) {
      mismatch = absl::DataLossError(
          StrCat(what_, ": the finished object's crc32c ", Crc32cToBase64(*object.crc32c),
                 " does not match ", Crc32cToBase64(request_.crc32c), " of the spooled file"));
    }
    if (!mismatch.ok()) {
      mismatch.SetPayload(Client::kGenerationPayload,
                          absl::Cord(std::to_string(object.generation)));
    }
    return mismatch;
  }

  Impl& impl_;
  const UploadRequest& request_;
  const ChunkFn& chunk_;
  ResumableState state_;
  const size_t chunk_bytes_;
  const std::function<void(const UploadProgress&)>& progress_;
  const std::atomic<bool>* const cancel_;
  const std::string what_;
  Backoff backoff_;
  int64_t deadline_ns_;
  bool ask_first_;
  int failures_ = 0;
  std::optional<ObjectMetadata> object_;
};

absl::StatusOr<ObjectMetadata> Client::UploadResumableOnce(
    const UploadRequest& request, const ChunkFn& chunk, ResumableState state, size_t chunk_bytes,
    const std::function<void(const UploadProgress&)>& progress, const std::atomic<bool>* cancel) {
  return Impl::ResumableUpload(*impl_, request, chunk, std::move(state), chunk_bytes, progress,
                               cancel)
      .Run();
}

std::string ObjectUri(std::string_view bucket, std::string_view name) {
  return StrCat("gs://", bucket, "/", name);
}

bool IsTransient(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
      return true;
    default:
      return false;
  }
}

}  // namespace clusterprof::storage::gcs
