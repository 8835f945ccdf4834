#include "common/base/status.h"

#include <cerrno>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace clusterprof {
namespace {

absl::StatusOr<int> Half(int x) {
  if (x % 2 != 0) return absl::InvalidArgumentError("odd");
  return x / 2;
}

absl::StatusOr<int> Quarter(int x) {
  CLUSTERPROF_ASSIGN_OR_RETURN(int half, Half(x));
  CLUSTERPROF_ASSIGN_OR_RETURN(int quarter, Half(half));
  return quarter;
}

absl::Status CheckEven(int x) {
  CLUSTERPROF_RETURN_IF_ERROR(Half(x).status());
  return absl::OkStatus();
}

TEST(StatusTest, Macros) {
  EXPECT_EQ(*Quarter(8), 2);
  EXPECT_EQ(Quarter(6).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckEven(2).ok());
  EXPECT_FALSE(CheckEven(3).ok());
}

TEST(StatusTest, Annotate) {
  EXPECT_TRUE(Annotate(absl::OkStatus(), "ctx").ok());
  const absl::Status s = Annotate(absl::NotFoundError("gone"), "reading x");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "reading x: gone");
}

TEST(StatusTest, ErrnoToStatus) {
  const absl::Status s = ErrnoToStatus(ENOENT, "cannot open", "/a/b");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "cannot open /a/b: No such file or directory");
  EXPECT_EQ(ErrnoToStatus(EACCES, "op", "p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoToStatus(ENOSPC, "op", "p").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoToStatus(EIO, "op", "p").code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace clusterprof
