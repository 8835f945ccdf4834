// A temporary directory for a test, removed with everything in it when the object dies.
#ifndef CLUSTERPROF_TESTS_SUPPORT_TEMP_DIR_H_
#define CLUSTERPROF_TESTS_SUPPORT_TEMP_DIR_H_

#include <string>
#include <string_view>
#include <vector>

namespace clusterprof::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Join(std::string_view relative) const;

 private:
  std::string path_;
};

// Whole-file helpers that fail the current test (ADD_FAILURE) on error.
std::string ReadFileOrDie(const std::string& path);
void WriteFileOrDie(const std::string& path, std::string_view data);
bool FileExists(const std::string& path);
// Every regular file under `dir`, as paths relative to it, sorted.
std::vector<std::string> ListFilesRecursively(const std::string& dir);

}  // namespace clusterprof::testing

#endif  // CLUSTERPROF_TESTS_SUPPORT_TEMP_DIR_H_
