// JSON text helpers for the trace writers and the JSON log formatter.
#ifndef CLUSTERPROF_COMMON_BASE_JSON_ESCAPE_H_
#define CLUSTERPROF_COMMON_BASE_JSON_ESCAPE_H_

#include <string>
#include <string_view>

namespace clusterprof {

// Appends `text` escaped for the inside of a JSON string: quotes, backslashes and control
// characters are escaped, and bytes that are not valid UTF-8 become U+FFFD, so the output is
// always valid JSON whatever a workload put in its annotation names or a log message holds.
void AppendJsonEscaped(std::string_view text, std::string* out);

// Appends the shortest decimal text that reads back as `value`; "NaN", "Infinity" and
// "-Infinity" for non-finite values (callers quote them: JSON numbers cannot hold them).
void AppendJsonDouble(double value, std::string* out);

}  // namespace clusterprof

#endif  // CLUSTERPROF_COMMON_BASE_JSON_ESCAPE_H_
