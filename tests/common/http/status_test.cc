#include "common/http/status.h"

#include "gtest/gtest.h"

namespace clusterprof::http {
namespace {

TEST(ReasonPhraseTest, KnownCodesHaveTheirNames) {
  EXPECT_EQ(ReasonPhrase(200), "OK");
  EXPECT_EQ(ReasonPhrase(308), "Resume Incomplete");
  EXPECT_EQ(ReasonPhrase(404), "Not Found");
  EXPECT_EQ(ReasonPhrase(429), "Too Many Requests");
  EXPECT_EQ(ReasonPhrase(503), "Service Unavailable");
}

TEST(ReasonPhraseTest, UnknownCodesGetTheirClass) {
  EXPECT_EQ(ReasonPhrase(599), "Server Error");
  EXPECT_EQ(ReasonPhrase(418), "Client Error");
  EXPECT_EQ(ReasonPhrase(399), "Redirection");
  EXPECT_EQ(ReasonPhrase(299), "Success");
  EXPECT_EQ(ReasonPhrase(199), "Informational");
}

struct Case {
  int http_code;
  Api api;
  absl::StatusCode want;
};

TEST(StatusCodeForTest, OneTableWithPerApiOverrides) {
  using absl::StatusCode;
  const Case cases[] = {
      // The common mapping.
      {400, Api::kGeneric, StatusCode::kInvalidArgument},
      {401, Api::kGeneric, StatusCode::kUnauthenticated},
      {403, Api::kGeneric, StatusCode::kPermissionDenied},
      {404, Api::kGeneric, StatusCode::kNotFound},
      {408, Api::kGeneric, StatusCode::kDeadlineExceeded},
      {409, Api::kGeneric, StatusCode::kAborted},
      {412, Api::kGeneric, StatusCode::kFailedPrecondition},
      {416, Api::kGeneric, StatusCode::kOutOfRange},
      {429, Api::kGeneric, StatusCode::kResourceExhausted},
      {500, Api::kGeneric, StatusCode::kUnavailable},
      {503, Api::kGeneric, StatusCode::kUnavailable},
      {599, Api::kGeneric, StatusCode::kUnavailable},
      {418, Api::kGeneric, StatusCode::kUnknown},
      // Kubernetes: 410 is an expired resourceVersion (relist), 500 is not retried.
      {410, Api::kKubernetes, StatusCode::kOutOfRange},
      {500, Api::kKubernetes, StatusCode::kInternal},
      {502, Api::kKubernetes, StatusCode::kUnavailable},
      {409, Api::kKubernetes, StatusCode::kAborted},
      {422, Api::kKubernetes, StatusCode::kInvalidArgument},
      // GCS: 410 is a lost upload session, 409 an existing object, 5xx retried.
      {410, Api::kGcs, StatusCode::kNotFound},
      {409, Api::kGcs, StatusCode::kAlreadyExists},
      {500, Api::kGcs, StatusCode::kUnavailable},
      {501, Api::kGcs, StatusCode::kUnavailable},
      // OAuth token endpoints: a refused grant is Unauthenticated, anything unlisted is final.
      {400, Api::kOAuth, StatusCode::kUnauthenticated},
      {401, Api::kOAuth, StatusCode::kUnauthenticated},
      {404, Api::kOAuth, StatusCode::kNotFound},
      {418, Api::kOAuth, StatusCode::kFailedPrecondition},
      {302, Api::kOAuth, StatusCode::kFailedPrecondition},
      {503, Api::kOAuth, StatusCode::kUnavailable},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(StatusCodeFor(c.http_code, c.api), c.want)
        << "HTTP " << c.http_code << " for api " << static_cast<int>(c.api);
  }
}

}  // namespace
}  // namespace clusterprof::http
