#include <arpa/inet.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "clusterprof/v1alpha1/sidecar.grpc.pb.h"
#include "common/base/grpc_status.h"
#include "common/base/mutex.h"
#include "common/base/strings.h"
#include "coordinator/connector.h"
#include "grpcpp/alarm.h"
#include "grpcpp/grpcpp.h"
#include "proto/profile_options.h"
#include "spdlog/spdlog.h"
#include "tsl/profiler/protos/profiler_service.grpc.pb.h"

namespace clusterprof::coordinator {
namespace {

// The largest answer taken from a clusterprof sidecar (GetInfo, GetSession, ...).
constexpr int64_t kMaxSidecarResponseBytes = 64 << 20;
// Pooled channels ping their server this often while idle (the sidecar permits pings this far
// apart: sidecar/server.cc).
constexpr int kPoolKeepaliveMs = 120'000;

// An IP literal (a pod IP) goes straight to gRPC's ipv4:/ipv6: resolver, with no DNS resolver
// and its machinery per channel; a name keeps the default (DNS).
std::string ChannelTarget(const std::string& address) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos) return address;
  const std::string host = address.substr(0, colon);
  unsigned char buffer[sizeof(in6_addr)];
  if (inet_pton(AF_INET, host.c_str(), buffer) == 1) return "ipv4:" + address;
  if (host.size() > 2 && host.front() == '[' && host.back() == ']' &&
      inet_pton(AF_INET6, host.substr(1, host.size() - 2).c_str(), buffer) == 1) {
    return "ipv6:" + address;
  }
  return address;
}

// A channel to `address` as captures use it; `pooled`: kept while idle, with keepalive pings.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const tls::ChannelSecurity& security, bool pooled) {
  grpc::ChannelArguments args;
  // A TF/JAX server answers Profile with the whole XSpace: no bound but gRPC's own. A
  // clusterprof sidecar's answers are small (a session's digest is at most 8 MiB,
  // analysis/digest_proto.h): one over kMaxSidecarResponseBytes is refused before it is held,
  // and the target's session is named as unread, its capture kept.
  args.SetMaxReceiveMessageSize(INT32_MAX);
  args.SetServiceConfigJSON(
      StrCat(R"({"methodConfig": [{"name": [{"service": "clusterprof.v1alpha1.Sidecar"}], )",
             R"("maxResponseMessageBytes": )", kMaxSidecarResponseBytes, "}]}"));
  if (pooled) {
    // Kept between captures, hours apart: never idle, and a connection that died on the way is
    // found by its pings (at most every kPoolKeepaliveMs; the sidecar permits that) instead of
    // by the next capture's calls.
    args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, INT32_MAX);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, kPoolKeepaliveMs);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20'000);
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  security.ConfigureArgs(&args);
  return grpc::CreateCustomChannel(ChannelTarget(address), security.credentials(), args);
}

class GrpcConnection final : public ProfilerConnection {
 public:
  GrpcConnection(std::shared_ptr<grpc::Channel> channel, std::vector<std::string> auth_tokens)
      : auth_tokens_(std::move(auth_tokens)), channel_(std::move(channel)) {
    profiler_ = tensorflow::ProfilerService::NewStub(channel_);
    sidecar_ = v1alpha1::Sidecar::NewStub(channel_);
  }

  ~GrpcConnection() override {
    // Waits until every call's state, its ClientContext with it, is gone: a context holds the
    // channel, and the channel must go here, on the owner's thread. The last reference to a
    // gRPC 1.51 channel dropped on one of its callback threads, as a call's callback ends, frees
    // the callback queue twice (a crash seen under ASan).
    MutexLock lock(&mu_);
    mu_.Await([this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return calls_ == 0; });
  }

  void GetInfo(int64_t timeout_ns, Done<v1alpha1::GetInfoResponse> done) override {
    Call<v1alpha1::GetInfoRequest, v1alpha1::GetInfoResponse>(
        v1alpha1::GetInfoRequest(), timeout_ns, std::move(done), nullptr,
        [this](grpc::ClientContext* context, const v1alpha1::GetInfoRequest* request,
               v1alpha1::GetInfoResponse* response, grpc::ClientUnaryReactor* reactor) {
          sidecar_->async()->GetInfo(context, request, response, reactor);
        });
  }

  void GetSession(const std::string& session_id, int64_t timeout_ns,
                  Done<v1alpha1::GetSessionResponse> done) override {
    v1alpha1::GetSessionRequest request;
    request.set_session_id(session_id);
    Call<v1alpha1::GetSessionRequest, v1alpha1::GetSessionResponse>(
        request, timeout_ns, std::move(done), nullptr,
        [this](grpc::ClientContext* context, const v1alpha1::GetSessionRequest* request,
               v1alpha1::GetSessionResponse* response, grpc::ClientUnaryReactor* reactor) {
          sidecar_->async()->GetSession(context, request, response, reactor);
        });
  }

  void Profile(const tensorflow::ProfileRequest& request, int64_t timeout_ns,
               Done<tensorflow::ProfileResponse> done, std::function<void()> accepted) override {
    Call<tensorflow::ProfileRequest, tensorflow::ProfileResponse>(
        request, timeout_ns, std::move(done), std::move(accepted),
        [this](grpc::ClientContext* context, const tensorflow::ProfileRequest* request,
               tensorflow::ProfileResponse* response, grpc::ClientUnaryReactor* reactor) {
          profiler_->async()->Profile(context, request, response, reactor);
        });
  }

  void Terminate(const std::string& session_id, int64_t timeout_ns,
                 Done<tensorflow::TerminateResponse> done) override {
    tensorflow::TerminateRequest request;
    request.set_session_id(session_id);
    Call<tensorflow::TerminateRequest, tensorflow::TerminateResponse>(
        request, timeout_ns, std::move(done), nullptr,
        [this](grpc::ClientContext* context, const tensorflow::TerminateRequest* request,
               tensorflow::TerminateResponse* response, grpc::ClientUnaryReactor* reactor) {
          profiler_->async()->Terminate(context, request, response, reactor);
        });
  }

  void Warm() override { channel_->GetState(/*try_to_connect=*/true); }

  void CancelCalls() override {
    // TryCancel outside the mutex (a call's callback takes it), on contexts kept alive by the
    // copies taken under it.
    std::vector<std::shared_ptr<grpc::ClientContext>> live;
    {
      MutexLock lock(&mu_);
      cancelled_ = true;
      for (const auto& [raw, context] : live_) live.push_back(context);
    }
    for (const std::shared_ptr<grpc::ClientContext>& context : live) context->TryCancel();
  }

 private:
  // Counts a call's state from its making to its end.
  class CallTracker {
   public:
    explicit CallTracker(GrpcConnection* connection) : connection_(connection) {
      MutexLock lock(&connection_->mu_);
      ++connection_->calls_;
    }
    ~CallTracker() {
      MutexLock lock(&connection_->mu_);
      --connection_->calls_;
    }
    CallTracker(const CallTracker&) = delete;
    CallTracker& operator=(const CallTracker&) = delete;

   private:
    GrpcConnection* const connection_;
  };

  // One call: its context, messages and reactions, alive from the call's start until OnDone.
  template <typename Request, typename Response>
  class UnaryCall final : public grpc::ClientUnaryReactor {
   public:
    UnaryCall(GrpcConnection* connection, Done<Response> on_done, std::function<void()> accepted)
        : tracker_(connection),
          connection_(connection),
          done(std::move(on_done)),
          accepted_(std::move(accepted)) {}

    // First, so that it is destroyed last, after the context.
    CallTracker tracker_;
    GrpcConnection* const connection_;
    grpc::ClientContext context;
    Request request;
    Response response;
    Done<Response> done;
    // Held by the call itself until OnDone, and by CancelCalls' copies of its context.
    std::shared_ptr<UnaryCall> self;

   private:
    void OnReadInitialMetadataDone(bool ok) override {
      if (!ok || !accepted_) return;
      const auto& metadata = context.GetServerInitialMetadata();
      if (metadata.find(proto::kAcceptedHeader) != metadata.end()) accepted_();
    }

    void OnDone(const grpc::Status& status) override {
      if (status.ok()) {
        done(std::move(response));
      } else {
        done(FromGrpcStatus(status));
      }
      {
        MutexLock lock(&connection_->mu_);
        connection_->live_.erase(&context);
      }
      // The last use of this call: it goes here, or with CancelCalls' copy of its context.
      std::shared_ptr<UnaryCall> keep = std::move(self);
    }

    std::function<void()> accepted_;
  };

  template <typename Request, typename Response, typename Start>
  void Call(const Request& request, int64_t timeout_ns, Done<Response> done,
            std::function<void()> accepted, Start start) {
    CallWithToken(request, timeout_ns, std::move(done), std::move(accepted), std::move(start),
                  token_index_.load(std::memory_order_relaxed));
  }

  // One call with auth_tokens_[index] (none when there are none); refused UNAUTHENTICATED, it is
  // made again with the next token, if any.
  template <typename Request, typename Response, typename Start>
  void CallWithToken(const Request& request, int64_t timeout_ns, Done<Response> done,
                     std::function<void()> accepted, Start start, size_t index) {
    Done<Response> next = [this, request, timeout_ns, done = std::move(done), accepted, start,
                           index](absl::StatusOr<Response> response) mutable {
      if (!response.ok() && response.status().code() == absl::StatusCode::kUnauthenticated &&
          index + 1 < auth_tokens_.size()) {
        CallWithToken(request, timeout_ns, std::move(done), std::move(accepted), std::move(start),
                      index + 1);
        return;
      }
      if (response.ok()) token_index_.store(index, std::memory_order_relaxed);
      done(std::move(response));
    };
    auto call =
        std::make_shared<UnaryCall<Request, Response>>(this, std::move(next), std::move(accepted));
    call->request = request;
    if (index < auth_tokens_.size()) {
      call->context.AddMetadata("authorization", "Bearer " + auth_tokens_[index]);
    }
    call->context.set_deadline(GrpcTimeout(timeout_ns));
    bool refused;
    {
      MutexLock lock(&mu_);
      refused = cancelled_;
      if (!refused) {
        live_.emplace(&call->context, std::shared_ptr<grpc::ClientContext>(call, &call->context));
      }
    }
    if (refused) {
      // Never started: nothing else holds the call, which goes with this scope.
      call->done(absl::CancelledError("the capture was cancelled"));
      return;
    }
    call->self = call;
    UnaryCall<Request, Response>* raw = call.get();
    start(&raw->context, &raw->request, &raw->response, raw);
    raw->StartCall();
  }

  // The tokens to try, in order (none: no authorization metadata), and the one that worked last.
  const std::vector<std::string> auth_tokens_;
  std::atomic<size_t> token_index_{0};
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<tensorflow::ProfilerService::Stub> profiler_;
  std::unique_ptr<v1alpha1::Sidecar::Stub> sidecar_;
  Mutex mu_;
  // The calls in flight, each context kept alive by its call's state.
  std::map<grpc::ClientContext*, std::shared_ptr<grpc::ClientContext>> live_ ABSL_GUARDED_BY(mu_);
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  // Call states alive (CallTracker).
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

struct ChannelPool::Entry {
  std::shared_ptr<grpc::Channel> channel;
  std::list<std::string>::iterator position;
};

// A thread that waits on a completion queue of its own, whose only event is an alarm that never
// fires (the destructor cancels it), and so polls gRPC's sockets (all of them: the Linux poller,
// epoll1, keeps every socket in one set) until it is stopped.
class ChannelPool::Poller {
 public:
  Poller() : thread_([this] { Run(); }) {}
  ~Poller() {
    {
      MutexLock lock(&mu_);
      stopping_ = true;
      alarm_.Cancel();
    }
    thread_.join();
  }

 private:
  void Run() {
    bool armed = false;
    {
      MutexLock lock(&mu_);
      if (!stopping_) {
        alarm_.Set(&cq_, gpr_inf_future(GPR_CLOCK_REALTIME), &alarm_);
        armed = true;
      }
    }
    void* tag = nullptr;
    bool ok = false;
    if (armed) cq_.Next(&tag, &ok);  // returns when the destructor cancels the alarm
    cq_.Shutdown();
    while (cq_.Next(&tag, &ok)) {
    }
  }

  Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  grpc::CompletionQueue cq_;
  grpc::Alarm alarm_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: started once the rest is made
};

ChannelPool::ChannelPool(Options options)
    : security_(options.security != nullptr ? std::move(options.security)
                                            : tls::ChannelSecurity::Insecure()),
      max_channels_(std::max<size_t>(1, options.max_channels)),
      poller_(std::make_unique<Poller>()) {}

ChannelPool::~ChannelPool() = default;

std::shared_ptr<grpc::Channel> ChannelPool::EraseLocked(std::map<std::string, Entry>::iterator it) {
  std::shared_ptr<grpc::Channel> channel = std::move(it->second.channel);
  order_.erase(it->second.position);
  channels_.erase(it);
  return channel;
}

std::shared_ptr<grpc::Channel> ChannelPool::GetLocked(const std::string& address,
                                                      std::shared_ptr<grpc::Channel>* dropped) {
  auto it = channels_.find(address);
  if (it != channels_.end()) {
    const grpc_connectivity_state state = it->second.channel->GetState(/*try_to_connect=*/false);
    if (state != GRPC_CHANNEL_TRANSIENT_FAILURE && state != GRPC_CHANNEL_SHUTDOWN) {
      order_.splice(order_.begin(), order_, it->second.position);
      return it->second.channel;
    }
    // A server that was down (a sidecar restarting): a new channel connects at once, where this
    // one would wait out its reconnect backoff and fail the capture's calls meanwhile.
    *dropped = EraseLocked(it);
  }
  spdlog::debug("ChannelPool: new channel to {}", address);
  order_.push_front(address);
  Entry& entry = channels_[address];
  entry.channel = MakeChannel(address, *security_, /*pooled=*/true);
  entry.position = order_.begin();
  return entry.channel;
}

std::shared_ptr<grpc::Channel> ChannelPool::Get(const std::string& address) {
  // Channels let go are destroyed outside the mutex, on this (the caller's) thread.
  std::shared_ptr<grpc::Channel> replaced;
  std::shared_ptr<grpc::Channel> evicted;
  MutexLock lock(&mu_);
  std::shared_ptr<grpc::Channel> channel = GetLocked(address, &replaced);
  if (channels_.size() > max_channels_) evicted = EraseLocked(channels_.find(order_.back()));
  return channel;
}

bool ChannelPool::Warm(const std::string& address) {
  std::shared_ptr<grpc::Channel> replaced;  // destroyed outside the mutex
  std::shared_ptr<grpc::Channel> channel;
  {
    MutexLock lock(&mu_);
    if (channels_.count(address) == 0 && channels_.size() >= max_channels_) return false;
    channel = GetLocked(address, &replaced);
  }
  channel->GetState(/*try_to_connect=*/true);
  return true;
}

void ChannelPool::Forget(const std::string& address) {
  std::shared_ptr<grpc::Channel> dropped;  // destroyed outside the mutex
  MutexLock lock(&mu_);
  if (auto it = channels_.find(address); it != channels_.end()) dropped = EraseLocked(it);
}

size_t ChannelPool::size() const {
  MutexLock lock(&mu_);
  return channels_.size();
}

std::shared_ptr<const tls::ChannelSecurity> ConnectionSecurity(
    const ChannelPool* pool, std::shared_ptr<const tls::ChannelSecurity> security) {
  if (pool != nullptr) return pool->security();
  return security != nullptr ? std::move(security) : tls::ChannelSecurity::Insecure();
}

GrpcConnector::GrpcConnector(std::string auth_token,
                             std::shared_ptr<const tls::ChannelSecurity> security,
                             std::string previous_auth_token, ChannelPool* pool)
    : auth_token_(std::move(auth_token)),
      security_(ConnectionSecurity(pool, std::move(security))),
      previous_auth_token_(std::move(previous_auth_token)),
      pool_(pool) {}

std::unique_ptr<ProfilerConnection> GrpcConnector::Connect(const std::string& address) {
  std::vector<std::string> tokens;
  if (!auth_token_.empty()) tokens.push_back(auth_token_);
  if (!previous_auth_token_.empty() && previous_auth_token_ != auth_token_) {
    tokens.push_back(previous_auth_token_);
  }
  return std::make_unique<GrpcConnection>(
      pool_ != nullptr ? pool_->Get(address) : MakeChannel(address, *security_, /*pooled=*/false),
      std::move(tokens));
}

std::string GrpcConnector::ExplainConnectFailure(const std::string& address) {
  return security_->Diagnose(address);
}

}  // namespace clusterprof::coordinator
