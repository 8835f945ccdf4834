#include "tests/helm/promql_check.h"

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "common/base/strings.h"

namespace clusterprof::testing::promql {
namespace {

using Kind = Result::Kind;

// --- Errors --------------------------------------------------------------------------------------

// Thrown inside the checker and turned into a Status by Check (nothing escapes it).
struct CheckError {
  size_t pos;
  std::string message;
};

[[noreturn]] void Fail(size_t pos, std::string message) {
  throw CheckError{pos, std::move(message)};
}

std::string_view KindName(Kind kind) {
  switch (kind) {
    case Kind::kScalar:
      return "a scalar";
    case Kind::kString:
      return "a string";
    case Kind::kVector:
      return "an instant vector";
    case Kind::kRange:
      return "a range vector";
  }
  return "?";
}

std::string JoinSet(const std::set<std::string>& names) {
  std::string joined;
  for (const std::string& name : names) StrAppend(&joined, joined.empty() ? "" : ", ", name);
  return joined.empty() ? "none" : joined;
}

// --- Tokens --------------------------------------------------------------------------------------

enum class Tok {
  kEnd,
  kIdent,
  kNumber,
  kDuration,  // 5m, 1h30m, or a Grafana variable ($__rate_interval, ${range})
  kString,
  kLParen,
  kRParen,
  kLBrace,
  kRBrace,
  kLBracket,
  kRBracket,
  kComma,
  kColon,
  kOp,  // + - * / % ^ == != <= >= < > = =~ !~
};

struct Token {
  Tok type = Tok::kEnd;
  std::string text;  // strings: the unquoted value
  size_t pos = 0;
};

bool IsIdentStart(char c) {
  return std::isalpha(static_cast<unsigned char>(c)) != 0 || c == '_' || c == ':';
}
bool IsIdentChar(char c) {
  return IsIdentStart(c) || std::isdigit(static_cast<unsigned char>(c)) != 0;
}
bool IsDigit(char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; }

std::vector<Token> Lex(std::string_view s) {
  std::vector<Token> tokens;
  size_t i = 0;
  const auto variable = [&](size_t start) {
    // $name, ${name}
    size_t j = start + 1;
    if (j < s.size() && s[j] == '{') {
      const size_t close = s.find('}', j);
      if (close == std::string_view::npos) Fail(start, "unterminated ${...} variable");
      j = close + 1;
    } else {
      while (j < s.size() && IsIdentChar(s[j]) && s[j] != ':') ++j;
    }
    if (j == start + 1) Fail(start, "a lone '$'");
    return j;
  };
  while (i < s.size()) {
    const char c = s[i];
    const size_t start = i;
    if (std::isspace(static_cast<unsigned char>(c)) != 0) {
      ++i;
      continue;
    }
    if (c == '#') {  // a comment, to the end of the line
      while (i < s.size() && s[i] != '\n') ++i;
      continue;
    }
    if (c == '"' || c == '\'' || c == '`') {
      std::string value;
      ++i;
      bool closed = false;
      while (i < s.size()) {
        if (s[i] == c) {
          closed = true;
          ++i;
          break;
        }
        if (s[i] == '\\' && c != '`') {
          if (i + 1 >= s.size()) break;
          value.push_back(s[i + 1]);
          i += 2;
          continue;
        }
        value.push_back(s[i++]);
      }
      if (!closed) Fail(start, "unterminated string");
      tokens.push_back({Tok::kString, std::move(value), start});
      continue;
    }
    if (c == '$') {
      i = variable(start);
      tokens.push_back({Tok::kDuration, std::string(s.substr(start, i - start)), start});
      continue;
    }
    if (IsDigit(c) || (c == '.' && i + 1 < s.size() && IsDigit(s[i + 1]))) {
      // A duration (5m, 1h30m, 500ms) or a number (1, 0.95, 1e-3, 0x1f).
      size_t j = i;
      while (j < s.size() && IsDigit(s[j])) ++j;
      if (j < s.size() && j > i &&
          std::string_view("smhdwy").find(s[j]) != std::string_view::npos) {
        size_t k = i;
        bool ok = true;
        while (k < s.size() && IsDigit(s[k])) {
          while (k < s.size() && IsDigit(s[k])) ++k;
          if (s.substr(k, 2) == "ms") {
            k += 2;
          } else if (k < s.size() &&
                     std::string_view("smhdwy").find(s[k]) != std::string_view::npos) {
            ++k;
          } else {
            ok = false;
            break;
          }
        }
        if (ok && (k >= s.size() || !IsIdentChar(s[k]) || s[k] == ':')) {
          tokens.push_back({Tok::kDuration, std::string(s.substr(i, k - i)), start});
          i = k;
          continue;
        }
      }
      if (s.substr(i, 2) == "0x" || s.substr(i, 2) == "0X") {
        j = i + 2;
        while (j < s.size() && std::isxdigit(static_cast<unsigned char>(s[j])) != 0) ++j;
      } else {
        j = i;
        while (j < s.size() && IsDigit(s[j])) ++j;
        if (j < s.size() && s[j] == '.') {
          ++j;
          while (j < s.size() && IsDigit(s[j])) ++j;
        }
        if (j < s.size() && (s[j] == 'e' || s[j] == 'E')) {
          size_t k = j + 1;
          if (k < s.size() && (s[k] == '+' || s[k] == '-')) ++k;
          if (k < s.size() && IsDigit(s[k])) {
            j = k;
            while (j < s.size() && IsDigit(s[j])) ++j;
          }
        }
      }
      if (j < s.size() && IsIdentChar(s[j])) {
        Fail(start, StrCat("bad number or duration \"", s.substr(i, j + 1 - i), "\""));
      }
      tokens.push_back({Tok::kNumber, std::string(s.substr(i, j - i)), start});
      i = j;
      continue;
    }
    if (c == ':' && !tokens.empty() && tokens.back().type == Tok::kDuration) {
      // [5m:1m], a subquery's step.
      tokens.push_back({Tok::kColon, ":", start});
      ++i;
      continue;
    }
    if (IsIdentStart(c)) {
      size_t j = i;
      while (j < s.size() && IsIdentChar(s[j])) ++j;
      tokens.push_back({Tok::kIdent, std::string(s.substr(i, j - i)), start});
      i = j;
      continue;
    }
    static constexpr std::string_view kTwo[] = {"==", "!=", "<=", ">=", "=~", "!~"};
    bool two = false;
    for (std::string_view op : kTwo) {
      if (s.substr(i, 2) == op) {
        tokens.push_back({Tok::kOp, std::string(op), start});
        i += 2;
        two = true;
        break;
      }
    }
    if (two) continue;
    Tok type = Tok::kEnd;
    switch (c) {
      case '(':
        type = Tok::kLParen;
        break;
      case ')':
        type = Tok::kRParen;
        break;
      case '{':
        type = Tok::kLBrace;
        break;
      case '}':
        type = Tok::kRBrace;
        break;
      case '[':
        type = Tok::kLBracket;
        break;
      case ']':
        type = Tok::kRBracket;
        break;
      case ',':
        type = Tok::kComma;
        break;
      case ':':
        type = Tok::kColon;
        break;
      case '+':
      case '-':
      case '*':
      case '/':
      case '%':
      case '^':
      case '<':
      case '>':
      case '=':
        type = Tok::kOp;
        break;
      case '@':
        Fail(start, "the @ modifier is not supported");
      default:
        Fail(start, StrCat("unexpected character '", std::string(1, c), "'"));
    }
    tokens.push_back({type, std::string(1, c), start});
    ++i;
  }
  tokens.push_back({Tok::kEnd, "", s.size()});
  return tokens;
}

// Brackets pair up before anything else is looked at, so an unbalanced one is reported as such
// (and where it is), not as whatever the parser would have expected next.
void CheckBalanced(const std::vector<Token>& tokens) {
  std::vector<const Token*> open;
  for (const Token& token : tokens) {
    if (token.type == Tok::kLParen || token.type == Tok::kLBrace || token.type == Tok::kLBracket) {
      open.push_back(&token);
      continue;
    }
    const char* want = token.type == Tok::kRParen     ? "("
                       : token.type == Tok::kRBrace   ? "{"
                       : token.type == Tok::kRBracket ? "["
                                                      : nullptr;
    if (want == nullptr) continue;
    if (open.empty()) Fail(token.pos, StrCat("unbalanced '", token.text, "': nothing to close"));
    if (open.back()->text != want) {
      Fail(token.pos, StrCat("unbalanced '", token.text, "': the open bracket at ",
                             open.back()->pos, " is '", open.back()->text, "'"));
    }
    open.pop_back();
  }
  if (!open.empty()) {
    Fail(open.back()->pos, StrCat("unbalanced '", open.back()->text, "': never closed"));
  }
}

// --- The language ----------------------------------------------------------------------------

enum class Arg { kScalar, kVector, kRange, kString };

struct Function {
  std::vector<Arg> args;
  size_t optional = 0;    // how many of the trailing args may be left out
  bool variadic = false;  // the last arg repeats
  Kind returns = Kind::kVector;
};

const std::map<std::string, Function, std::less<>>& Functions() {
  static const auto* functions = [] {
    auto* f = new std::map<std::string, Function, std::less<>>;
    for (const char* name : {"abs", "absent", "ceil", "exp", "floor", "ln", "log10", "log2", "sgn",
                             "sort", "sort_desc", "sqrt", "timestamp"}) {
      (*f)[name] = {{Arg::kVector}};
    }
    for (const char* name :
         {"rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets",
          "absent_over_time", "avg_over_time", "count_over_time", "last_over_time", "max_over_time",
          "min_over_time", "present_over_time", "stddev_over_time", "stdvar_over_time",
          "sum_over_time"}) {
      (*f)[name] = {{Arg::kRange}};
    }
    for (const char* name : {"day_of_month", "day_of_week", "day_of_year", "days_in_month", "hour",
                             "minute", "month", "year"}) {
      (*f)[name] = {{Arg::kVector}, 1};
    }
    (*f)["round"] = {{Arg::kVector, Arg::kScalar}, 1};
    (*f)["clamp"] = {{Arg::kVector, Arg::kScalar, Arg::kScalar}};
    (*f)["clamp_min"] = {{Arg::kVector, Arg::kScalar}};
    (*f)["clamp_max"] = {{Arg::kVector, Arg::kScalar}};
    (*f)["histogram_quantile"] = {{Arg::kScalar, Arg::kVector}};
    (*f)["quantile_over_time"] = {{Arg::kScalar, Arg::kRange}};
    (*f)["predict_linear"] = {{Arg::kRange, Arg::kScalar}};
    (*f)["holt_winters"] = {{Arg::kRange, Arg::kScalar, Arg::kScalar}};
    (*f)["label_replace"] = {
        {Arg::kVector, Arg::kString, Arg::kString, Arg::kString, Arg::kString}};
    (*f)["label_join"] = {{Arg::kVector, Arg::kString, Arg::kString, Arg::kString}, 1, true};
    (*f)["scalar"] = {{Arg::kVector}, 0, false, Kind::kScalar};
    (*f)["time"] = {{}, 0, false, Kind::kScalar};
    (*f)["vector"] = {{Arg::kScalar}};
    return f;
  }();
  return *functions;
}

// Aggregation operators; the value says what parameter comes before the vector, if any.
const std::map<std::string, Arg, std::less<>>& Aggregations() {
  static const auto* aggregations = [] {
    auto* a = new std::map<std::string, Arg, std::less<>>;
    for (const char* name : {"sum", "avg", "min", "max", "count", "stddev", "stdvar", "group"}) {
      (*a)[name] = Arg::kVector;  // no parameter
    }
    (*a)["topk"] = Arg::kScalar;
    (*a)["bottomk"] = Arg::kScalar;
    (*a)["quantile"] = Arg::kScalar;
    (*a)["count_values"] = Arg::kString;
    return a;
  }();
  return *aggregations;
}

// Binary operators by precedence (higher binds tighter); 0: not a binary operator.
int Precedence(const Token& token) {
  if (token.type == Tok::kIdent) {
    if (token.text == "or") return 1;
    if (token.text == "and" || token.text == "unless") return 2;
    if (token.text == "atan2") return 5;
    return 0;
  }
  if (token.type != Tok::kOp) return 0;
  const std::string& op = token.text;
  if (op == "==" || op == "!=" || op == "<=" || op == ">=" || op == "<" || op == ">") return 3;
  if (op == "+" || op == "-") return 4;
  if (op == "*" || op == "/" || op == "%") return 5;
  if (op == "^") return 6;
  return 0;
}

bool IsComparison(const std::string& op) {
  return op == "==" || op == "!=" || op == "<=" || op == ">=" || op == "<" || op == ">";
}
bool IsSetOperator(const std::string& op) { return op == "and" || op == "or" || op == "unless"; }

// What the checker knows of a subexpression.
struct Value {
  Kind kind = Kind::kVector;
  std::set<std::string> labels;
  // The exported series its selectors name (rate's and histogram_quantile's checks).
  std::set<std::string> series;
  size_t pos = 0;
};

class Checker {
 public:
  Checker(std::string_view expr, const Exposition& exported,
          const std::set<std::string>& target_labels)
      : tokens_(Lex(expr)), exported_(exported), target_labels_(target_labels) {
    CheckBalanced(tokens_);
  }

  Value Run() {
    if (Peek().type == Tok::kEnd) Fail(0, "an empty expression");
    Value value = Expression(1);
    if (Peek().type != Tok::kEnd) Fail(Peek().pos, StrCat("unexpected \"", Peek().text, "\""));
    if (value.kind == Kind::kRange) {
      Fail(value.pos, "a range vector cannot be graphed: wrap it in rate(), increase(), ...");
    }
    return value;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(next_ + ahead, tokens_.size() - 1)];
  }
  const Token& Take() {
    const Token& token = Peek();
    if (next_ < tokens_.size() - 1) ++next_;
    return token;
  }
  const Token& Expect(Tok type, std::string_view what) {
    if (Peek().type != type) {
      Fail(Peek().pos,
           StrCat("expected ", what, ", found ",
                  Peek().type == Tok::kEnd ? "the end" : StrCat("\"", Peek().text, "\"")));
    }
    return Take();
  }
  bool TakeIdent(std::string_view word) {
    if (Peek().type == Tok::kIdent && Peek().text == word) {
      Take();
      return true;
    }
    return false;
  }

  // ( label, label, ... )
  std::vector<Token> LabelList() {
    Expect(Tok::kLParen, "'(' and a list of labels");
    std::vector<Token> labels;
    while (Peek().type != Tok::kRParen) {
      labels.push_back(Expect(Tok::kIdent, "a label name"));
      if (Peek().type != Tok::kComma) break;
      Take();
    }
    Expect(Tok::kRParen, "')' after the labels");
    return labels;
  }

  void RequireLabels(const std::vector<Token>& labels, const std::set<std::string>& have,
                     std::string_view clause) {
    for (const Token& label : labels) {
      if (have.count(label.text) == 0) {
        Fail(label.pos, StrCat("label \"", label.text, "\" in ", clause,
                               " is not carried by the expression it applies to (it carries: ",
                               JoinSet(have), ")"));
      }
    }
  }

  Value Expression(int min_precedence) {
    Value lhs = Unary();
    while (true) {
      const Token op = Peek();
      const int precedence = Precedence(op);
      if (precedence == 0 || precedence < min_precedence) return lhs;
      Take();
      bool return_bool = false;
      if (TakeIdent("bool")) {
        if (!IsComparison(op.text)) Fail(op.pos, "bool after a non-comparison operator");
        return_bool = true;
      }
      std::optional<std::pair<bool, std::vector<Token>>> matching;  // (on?, labels)
      if (Peek().type == Tok::kIdent && (Peek().text == "on" || Peek().text == "ignoring")) {
        const bool on = Take().text == "on";
        matching.emplace(on, LabelList());
      }
      std::optional<std::pair<bool, std::vector<Token>>> group;  // (left?, labels)
      if (Peek().type == Tok::kIdent &&
          (Peek().text == "group_left" || Peek().text == "group_right")) {
        const Token& which = Take();
        if (!matching.has_value())
          Fail(which.pos, StrCat(which.text, " without on() or ignoring()"));
        std::vector<Token> extra;
        if (Peek().type == Tok::kLParen) extra = LabelList();
        group.emplace(which.text == "group_left", std::move(extra));
      }
      // ^ is right-associative, the others left-associative.
      Value rhs = Expression(op.text == "^" ? precedence : precedence + 1);
      lhs = Binary(op, return_bool, matching, group, std::move(lhs), std::move(rhs));
    }
  }

  Value Binary(const Token& op, bool return_bool,
               const std::optional<std::pair<bool, std::vector<Token>>>& matching,
               const std::optional<std::pair<bool, std::vector<Token>>>& group, Value lhs,
               Value rhs) {
    for (const Value* side : {&lhs, &rhs}) {
      if (side->kind == Kind::kRange || side->kind == Kind::kString) {
        Fail(side->pos, StrCat("operator ", op.text, " cannot take ", KindName(side->kind)));
      }
    }
    const bool set_operator = IsSetOperator(op.text);
    if (lhs.kind == Kind::kScalar && rhs.kind == Kind::kScalar) {
      if (set_operator) Fail(op.pos, StrCat("operator ", op.text, " needs vectors"));
      if (IsComparison(op.text) && !return_bool) {
        Fail(op.pos, "a comparison of two scalars needs bool");
      }
      if (matching.has_value()) Fail(op.pos, "on()/ignoring() between scalars");
      return {Kind::kScalar, {}, {}, lhs.pos};
    }
    if (lhs.kind == Kind::kScalar || rhs.kind == Kind::kScalar) {
      if (set_operator) Fail(op.pos, StrCat("operator ", op.text, " needs vectors on both sides"));
      if (matching.has_value()) Fail(op.pos, "on()/ignoring() between a vector and a scalar");
      Value& vector = lhs.kind == Kind::kVector ? lhs : rhs;
      Value result = std::move(vector);
      result.pos = lhs.pos;
      return result;
    }
    Value result{Kind::kVector, {}, lhs.series, lhs.pos};
    result.series.insert(rhs.series.begin(), rhs.series.end());
    if (!matching.has_value()) {
      if (op.text == "or") {
        result.labels = lhs.labels;
        result.labels.insert(rhs.labels.begin(), rhs.labels.end());
        return result;
      }
      if (lhs.labels != rhs.labels) {
        Fail(op.pos, StrCat("operator ", op.text,
                            " matches series by all their labels, but the two sides carry "
                            "different ones (",
                            JoinSet(lhs.labels), " / ", JoinSet(rhs.labels),
                            "): aggregate both to the same labels, or use on()/ignoring()"));
      }
      result.labels = lhs.labels;
      return result;
    }
    const auto& [on, labels] = *matching;
    if (on) {
      RequireLabels(labels, lhs.labels, "on() (left side)");
      RequireLabels(labels, rhs.labels, "on() (right side)");
    } else {
      std::set<std::string> either = lhs.labels;
      either.insert(rhs.labels.begin(), rhs.labels.end());
      RequireLabels(labels, either, "ignoring()");
    }
    if (group.has_value()) {
      const auto& [left, extra] = *group;
      const Value& many = left ? lhs : rhs;
      const Value& one = left ? rhs : lhs;
      RequireLabels(extra, one.labels, left ? "group_left()" : "group_right()");
      result.labels = many.labels;
      for (const Token& label : extra) result.labels.insert(label.text);
      return result;
    }
    if (set_operator) {
      result.labels = lhs.labels;
      if (op.text == "or") result.labels.insert(rhs.labels.begin(), rhs.labels.end());
      return result;
    }
    if (on) {
      for (const Token& label : labels) result.labels.insert(label.text);
    } else {
      result.labels = lhs.labels;
      for (const Token& label : labels) result.labels.erase(label.text);
    }
    return result;
  }

  Value Unary() {
    if (Peek().type == Tok::kOp && (Peek().text == "-" || Peek().text == "+")) {
      const Token& sign = Take();
      // Binds looser than ^ (as in Prometheus: -2^2 is -4).
      Value value = Expression(6);
      if (value.kind != Kind::kScalar && value.kind != Kind::kVector) {
        Fail(sign.pos, StrCat("unary ", sign.text, " cannot take ", KindName(value.kind)));
      }
      return value;
    }
    return Postfix(Primary());
  }

  // [range], offset.
  Value Postfix(Value value) {
    if (Peek().type == Tok::kLBracket) {
      const Token& bracket = Take();
      if (value.kind != Kind::kVector || !selector_) {
        Fail(bracket.pos,
             "a range ([...]) only follows a metric selector (subqueries are not "
             "supported)");
      }
      Expect(Tok::kDuration, "a duration such as 5m or $__rate_interval");
      if (Peek().type == Tok::kColon) Fail(Peek().pos, "subqueries are not supported");
      Expect(Tok::kRBracket, "']' after the range");
      value.kind = Kind::kRange;
    }
    selector_ = false;
    if (TakeIdent("offset")) {
      if (value.kind != Kind::kVector && value.kind != Kind::kRange) {
        Fail(value.pos, "offset only follows a selector");
      }
      if (Peek().type == Tok::kOp && Peek().text == "-") Take();
      Expect(Tok::kDuration, "a duration after offset");
    }
    return value;
  }

  Value Primary() {
    selector_ = false;
    const Token& token = Peek();
    switch (token.type) {
      case Tok::kNumber:
        Take();
        return {Kind::kScalar, {}, {}, token.pos};
      case Tok::kString:
        Take();
        return {Kind::kString, {}, {}, token.pos};
      case Tok::kLParen: {
        Take();
        Value inner = Expression(1);
        Expect(Tok::kRParen, "')'");
        inner.pos = token.pos;
        return inner;
      }
      case Tok::kLBrace:
        Fail(token.pos, "a selector without a metric name cannot be checked: name the metric");
      case Tok::kIdent:
        break;
      default:
        Fail(token.pos,
             StrCat("unexpected ", token.type == Tok::kEnd ? "end of the expression"
                                                           : StrCat("\"", token.text, "\"")));
    }
    if (token.text == "Inf" || token.text == "NaN" || token.text == "inf" || token.text == "nan") {
      Take();
      return {Kind::kScalar, {}, {}, token.pos};
    }
    if (Aggregations().count(token.text) > 0 &&
        (Peek(1).type == Tok::kLParen ||
         (Peek(1).type == Tok::kIdent && (Peek(1).text == "by" || Peek(1).text == "without")))) {
      return Aggregation();
    }
    if (Peek(1).type == Tok::kLParen) return Call();
    return Selector();
  }

  Value Aggregation() {
    const Token name = Take();
    const Arg parameter = Aggregations().find(name.text)->second;
    std::optional<std::pair<bool, std::vector<Token>>> grouping;  // (by?, labels)
    const auto take_grouping = [&] {
      if (Peek().type == Tok::kIdent && (Peek().text == "by" || Peek().text == "without")) {
        const Token& which = Take();
        if (grouping.has_value()) Fail(which.pos, "a second by/without clause");
        grouping.emplace(which.text == "by", LabelList());
      }
    };
    take_grouping();
    Expect(Tok::kLParen, StrCat("'(' after ", name.text));
    std::string added_label;
    if (parameter != Arg::kVector) {
      Value param = Expression(1);
      const Kind want = parameter == Arg::kScalar ? Kind::kScalar : Kind::kString;
      if (param.kind != want) {
        Fail(param.pos, StrCat(name.text, "'s parameter must be ", KindName(want), ", not ",
                               KindName(param.kind)));
      }
      if (parameter == Arg::kString) added_label = tokens_[next_ - 1].text;
      Expect(Tok::kComma, StrCat("',' after ", name.text, "'s parameter"));
    }
    Value inner = Expression(1);
    if (inner.kind != Kind::kVector) {
      Fail(inner.pos,
           StrCat(name.text, " aggregates an instant vector, not ", KindName(inner.kind)));
    }
    Expect(Tok::kRParen, StrCat("')' closing ", name.text));
    take_grouping();
    Value result{Kind::kVector, {}, inner.series, name.pos};
    if (grouping.has_value()) {
      const auto& [by, labels] = *grouping;
      RequireLabels(labels, inner.labels, by ? "by()" : "without()");
      if (by) {
        for (const Token& label : labels) result.labels.insert(label.text);
      } else {
        result.labels = inner.labels;
        for (const Token& label : labels) result.labels.erase(label.text);
      }
    }
    if (name.text == "topk" || name.text == "bottomk") result.labels = inner.labels;
    if (!added_label.empty()) result.labels.insert(added_label);
    return result;
  }

  Value Call() {
    const Token name = Take();
    auto it = Functions().find(name.text);
    if (it == Functions().end()) Fail(name.pos, StrCat("unknown function ", name.text, "()"));
    const Function& function = it->second;
    Take();  // (
    std::vector<Value> args;
    std::vector<std::string> strings;  // string args, by position ("" for others)
    while (Peek().type != Tok::kRParen) {
      const size_t at = next_;
      args.push_back(Expression(1));
      strings.push_back(args.back().kind == Kind::kString && next_ == at + 1 ? tokens_[at].text
                                                                             : "");
      if (Peek().type != Tok::kComma) break;
      Take();
    }
    Expect(Tok::kRParen, StrCat("')' closing ", name.text, "()"));
    const size_t most = function.variadic ? SIZE_MAX : function.args.size();
    const size_t least = function.args.size() - function.optional;
    if (args.size() < least || args.size() > most) {
      Fail(name.pos,
           StrCat(name.text, "() takes ",
                  least == function.args.size() && !function.variadic ? StrCat(least)
                                                                      : StrCat(least, " or more"),
                  " argument(s), not ", args.size()));
    }
    for (size_t i = 0; i < args.size(); ++i) {
      const Arg want = function.args[std::min(i, function.args.size() - 1)];
      const Kind kind = want == Arg::kScalar   ? Kind::kScalar
                        : want == Arg::kVector ? Kind::kVector
                        : want == Arg::kRange  ? Kind::kRange
                                               : Kind::kString;
      if (args[i].kind != kind) {
        Fail(args[i].pos, StrCat(name.text, "() argument ", i + 1, " must be ", KindName(kind),
                                 ", not ", KindName(args[i].kind),
                                 kind == Kind::kRange ? " (add a range such as [5m])" : ""));
      }
    }
    Value result{function.returns, {}, {}, name.pos};
    for (const Value& arg : args) {
      if (arg.kind == Kind::kVector || arg.kind == Kind::kRange) {
        result.labels = arg.labels;
        result.series = arg.series;
      }
    }
    if (function.returns == Kind::kScalar || name.text == "vector" || name.text == "time") {
      result.labels.clear();
    }
    if (name.text == "rate" || name.text == "irate" || name.text == "increase") {
      for (const std::string& series : args[0].series) {
        const Exposition::Series& exported = exported_.series.at(series);
        const bool counter = exported.type == "counter" || exported.type == "histogram" ||
                             exported.type == "summary";
        if (!counter || (exported.type == "summary" && series == exported.family)) {
          Fail(args[0].pos, StrCat(name.text, "() of ", series, ", a ", exported.type,
                                   ": it takes counters (and a histogram's series) only"));
        }
      }
    }
    if (name.text == "histogram_quantile") {
      const Value& buckets = args[1];
      for (const std::string& series : buckets.series) {
        const Exposition::Series& exported = exported_.series.at(series);
        if (exported.type != "histogram" || !EndsWith(series, "_bucket")) {
          Fail(buckets.pos, StrCat("histogram_quantile() of ", series,
                                   ", which is not a histogram's _bucket series"));
        }
      }
      if (buckets.labels.count("le") == 0) {
        Fail(buckets.pos,
             "histogram_quantile() needs the buckets' le label: keep it (by (le, ...))");
      }
      result.labels.erase("le");
    }
    if (name.text == "label_replace" || name.text == "label_join") {
      const std::string& destination = strings[1];
      if (name.text == "label_replace" && !strings[3].empty() &&
          args[0].labels.count(strings[3]) == 0) {
        Fail(args[3].pos, StrCat("label_replace() source label \"", strings[3],
                                 "\" is not carried (it carries: ", JoinSet(args[0].labels), ")"));
      }
      if (name.text == "label_join") {
        for (size_t i = 3; i < strings.size(); ++i) {
          if (args[0].labels.count(strings[i]) == 0) {
            Fail(args[i].pos,
                 StrCat("label_join() source label \"", strings[i],
                        "\" is not carried (it carries: ", JoinSet(args[0].labels), ")"));
          }
        }
      }
      result.labels.insert(destination);
    }
    return result;
  }

  Value Selector() {
    const Token name = Take();
    auto it = exported_.series.find(name.text);
    if (it == exported_.series.end()) {
      Fail(name.pos, StrCat("unknown metric \"", name.text, "\": nothing exports it"));
    }
    std::set<std::string> labels = it->second.labels;
    labels.insert(target_labels_.begin(), target_labels_.end());
    if (Peek().type == Tok::kLBrace) {
      Take();
      while (Peek().type != Tok::kRBrace) {
        const Token& label = Expect(Tok::kIdent, "a label name");
        if (label.text != "__name__" && labels.count(label.text) == 0) {
          Fail(label.pos, StrCat("label \"", label.text, "\" is not carried by ", name.text,
                                 " (it carries: ", JoinSet(labels), ")"));
        }
        const Token& op = Expect(Tok::kOp, "a matcher (=, !=, =~, !~)");
        if (op.text != "=" && op.text != "!=" && op.text != "=~" && op.text != "!~") {
          Fail(op.pos, StrCat("\"", op.text, "\" is not a label matcher (=, !=, =~, !~)"));
        }
        Expect(Tok::kString, "a quoted label value");
        if (Peek().type != Tok::kComma) break;
        Take();
      }
      Expect(Tok::kRBrace, "'}' closing the matchers");
    }
    selector_ = true;
    return {Kind::kVector, std::move(labels), {name.text}, name.pos};
  }

  std::vector<Token> tokens_;
  size_t next_ = 0;
  // The value just parsed is a bare selector (a range may follow it).
  bool selector_ = false;
  const Exposition& exported_;
  const std::set<std::string>& target_labels_;
};

}  // namespace

absl::Status ParseExposition(std::string_view text, Exposition& exposition) {
  std::map<std::string, std::string> types;
  std::string family;  // the family the samples that follow belong to
  for (std::string_view line : SplitSkipEmpty(text, '\n')) {
    const auto error = [&](std::string_view what) {
      return absl::InvalidArgumentError(StrCat(what, ": ", line));
    };
    if (line[0] == '#') {
      const std::vector<std::string_view> words = SplitSkipEmpty(line, ' ');
      if (words.size() >= 4 && words[1] == "TYPE") {
        types[std::string(words[2])] = std::string(words[3]);
        family = std::string(words[2]);
      }
      continue;
    }
    size_t i = 0;
    while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
    const std::string name(line.substr(0, i));
    if (name.empty()) return error("a sample without a name");
    std::set<std::string> labels;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (i < line.size() && line[i] != '}') {
        const size_t equals = line.find('=', i);
        if (equals == std::string_view::npos || equals + 1 >= line.size() ||
            line[equals + 1] != '"') {
          return error("a label without =\"value\"");
        }
        labels.insert(std::string(line.substr(i, equals - i)));
        i = equals + 2;
        while (i < line.size() && line[i] != '"') i += line[i] == '\\' ? 2 : 1;
        if (i >= line.size()) return error("an unterminated label value");
        ++i;
        if (i < line.size() && line[i] == ',') ++i;
      }
      if (i >= line.size()) return error("unterminated labels");
    }
    std::string owner = name;
    std::string type = "untyped";
    if (!family.empty()) {
      for (std::string_view suffix : {"", "_bucket", "_sum", "_count"}) {
        if (name == StrCat(family, suffix)) {
          owner = family;
          type = types[family];
        }
      }
    }
    Exposition::Series& series = exposition.series[name];
    series.family = owner;
    series.type = type;
    series.labels.insert(labels.begin(), labels.end());
  }
  return absl::OkStatus();
}

absl::StatusOr<Result> Check(std::string_view expr, const Exposition& exported,
                             const std::set<std::string>& target_labels) {
  try {
    Checker checker(expr, exported, target_labels);
    Value value = checker.Run();
    return Result{value.kind, std::move(value.labels)};
  } catch (const CheckError& error) {
    return absl::InvalidArgumentError(StrCat("at ", error.pos, ": ", error.message));
  }
}

absl::Status CheckLegend(std::string_view legend, const Result& result) {
  size_t at = 0;
  while ((at = legend.find("{{", at)) != std::string_view::npos) {
    const size_t close = legend.find("}}", at);
    if (close == std::string_view::npos) {
      return absl::InvalidArgumentError(StrCat("legend \"", legend, "\": unclosed {{"));
    }
    const std::string_view label = StripAsciiWhitespace(legend.substr(at + 2, close - at - 2));
    if (result.labels.count(std::string(label)) == 0) {
      return absl::InvalidArgumentError(StrCat("legend \"", legend, "\" names label \"", label,
                                               "\", which the query's series do not carry (",
                                               JoinSet(result.labels), ")"));
    }
    at = close + 2;
  }
  return absl::OkStatus();
}

absl::Status CheckLabelValues(std::string_view query, const Exposition& exported,
                              const std::set<std::string>& target_labels) {
  constexpr std::string_view kPrefix = "label_values(";
  if (query.substr(0, kPrefix.size()) != kPrefix || query.empty() || query.back() != ')') {
    return absl::InvalidArgumentError(
        StrCat("\"", query, "\" is not label_values(LABEL) or label_values(SELECTOR, LABEL)"));
  }
  const std::string_view inside = query.substr(kPrefix.size(), query.size() - kPrefix.size() - 1);
  // The last comma outside braces and quotes separates the selector from the label.
  size_t comma = std::string_view::npos;
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < inside.size(); ++i) {
    const char c = inside[i];
    if (quote != 0) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '{' || c == '(') {
      ++depth;
    } else if (c == '}' || c == ')') {
      --depth;
    } else if (c == ',' && depth == 0) {
      comma = i;
    }
  }
  const std::string_view label =
      StripAsciiWhitespace(comma == std::string_view::npos ? inside : inside.substr(comma + 1));
  if (comma == std::string_view::npos) {
    if (target_labels.count(std::string(label)) > 0) return absl::OkStatus();
    for (const auto& [name, series] : exported.series) {
      if (series.labels.count(std::string(label)) > 0) return absl::OkStatus();
    }
    return absl::InvalidArgumentError(StrCat("no exported series carries label \"", label, "\""));
  }
  absl::StatusOr<Result> selector = Check(inside.substr(0, comma), exported, target_labels);
  if (!selector.ok()) return selector.status();
  if (selector->labels.count(std::string(label)) == 0) {
    return absl::InvalidArgumentError(StrCat("label \"", label, "\" is not carried by ",
                                             inside.substr(0, comma),
                                             " (it carries: ", JoinSet(selector->labels), ")"));
  }
  return absl::OkStatus();
}

}  // namespace clusterprof::testing::promql
