#include "tests/support/local_http.h"

#include <fstream>
#include <sstream>

#include "common/base/strings.h"
#include "cpprest/http_client.h"

namespace clusterprof::testing {

std::map<std::string, int> ReadPortFile(const std::string& path) {
  std::map<std::string, int> ports;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq == std::string::npos) continue;
    try {
      ports[line.substr(0, eq)] = std::stoi(line.substr(eq + 1));
    } catch (const std::exception&) {
      // A line being written: read again later.
    }
  }
  return ports;
}

std::string HttpGet(int port, const std::string& path) {
  try {
    web::http::client::http_client client(StrCat("http://127.0.0.1:", port));
    web::http::http_response response = client.request(web::http::methods::GET, path).get();
    return response.extract_string().get();
  } catch (const std::exception&) {
    return "";
  }
}

double MetricSum(const std::string& text, const std::string& name, const std::string& labels) {
  double sum = 0;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (!StartsWith(line, name) || line.size() <= name.size()) continue;
    const char next = line[name.size()];
    if ((next != '{' && next != ' ') || line.find(labels) == std::string::npos) continue;
    sum += std::stod(line.substr(line.rfind(' ') + 1));
  }
  return sum;
}

}  // namespace clusterprof::testing
