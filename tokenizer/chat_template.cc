#include "tokenizer/chat_template.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

namespace scd {
namespace {

// Objects keep their keys in insertion order, as Python's dicts do.
using Json = nlohmann::ordered_json;

Json Undefined() { return Json(Json::value_t::discarded); }
bool IsUndefined(const Json& v) { return v.is_discarded(); }

absl::Status Bad(const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("chat template: ", what));
}

// ---- Expressions ----

struct Expr;
using ExprPtr = std::shared_ptr<const Expr>;
struct Expr {
  enum Kind { kLiteral, kName, kList, kDict, kAttr, kItem, kSlice, kCall, kFilter, kTest,
              kUnary, kBinary, kCond };
  Kind kind = kLiteral;
  Json value;                  // kLiteral
  std::string name;            // kName, kAttr, kFilter, kTest, kUnary/kBinary operator
  std::vector<ExprPtr> args;   // operands (see Parser)
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // kCall, kFilter
  bool negated = false;        // kTest
};

ExprPtr Make(Expr e) { return std::make_shared<const Expr>(std::move(e)); }

struct Token {
  enum Kind { kName, kString, kNumber, kOp, kEnd } kind = kEnd;
  std::string text;
  Json number;
};

absl::StatusOr<std::vector<Token>> Lex(std::string_view s) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < s.size() && (absl::ascii_isalnum(static_cast<unsigned char>(s[j])) || s[j] == '_')) ++j;
      out.push_back({Token::kName, std::string(s.substr(i, j - i)), {}});
      i = j;
    } else if (absl::ascii_isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      bool real = false;
      while (j < s.size() && (absl::ascii_isdigit(static_cast<unsigned char>(s[j])) ||
                              (s[j] == '.' && !real && j + 1 < s.size() &&
                               absl::ascii_isdigit(static_cast<unsigned char>(s[j + 1]))))) {
        real |= s[j] == '.';
        ++j;
      }
      const std::string text(s.substr(i, j - i));
      Token t{Token::kNumber, text, {}};
      t.number = real ? Json(std::stod(text)) : Json(std::stoll(text));
      out.push_back(t);
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string value;
      size_t j = i + 1;
      for (; j < s.size() && s[j] != c; ++j) {
        if (s[j] == '\\' && j + 1 < s.size()) {
          const char e = s[++j];
          value += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          value += s[j];
        }
      }
      if (j >= s.size()) return Bad("unterminated string");
      out.push_back({Token::kString, value, {}});
      i = j + 1;
    } else {
      static const char* kOps[] = {"==", "!=", "<=", ">=", "//", "**", "<", ">", "+", "-", "*",
                                   "/", "%", "~", "|", ".", ",", ":", "(", ")", "[", "]", "{",
                                   "}", "="};
      bool matched = false;
      for (const char* op : kOps) {
        if (s.substr(i, std::strlen(op)) == op) {
          out.push_back({Token::kOp, op, {}});
          i += std::strlen(op);
          matched = true;
          break;
        }
      }
      if (!matched) return Bad(absl::StrCat("unexpected character '", std::string(1, c), "'"));
    }
  }
  out.push_back({Token::kEnd, "", {}});
  return out;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : t_(std::move(tokens)) {}

  absl::StatusOr<ExprPtr> Expression() { return Conditional(); }
  bool AtEnd() const { return t_[p_].kind == Token::kEnd; }
  bool IsName(const char* word) const { return t_[p_].kind == Token::kName && t_[p_].text == word; }
  bool IsOp(const char* op) const { return t_[p_].kind == Token::kOp && t_[p_].text == op; }
  const Token& Next() { return t_[p_ < t_.size() - 1 ? p_++ : p_]; }
  absl::StatusOr<std::string> Name() {
    if (t_[p_].kind != Token::kName) return Bad(absl::StrCat("expected a name at '", t_[p_].text, "'"));
    return Next().text;
  }
  absl::Status Expect(const char* op) {
    if (!IsOp(op)) return Bad(absl::StrCat("expected '", op, "' at '", t_[p_].text, "'"));
    Next();
    return absl::OkStatus();
  }

 private:
  using Result = absl::StatusOr<ExprPtr>;
  Result Binary(Result left, const std::string& op, Result (Parser::*next)()) {
    if (!left.ok()) return left;
    Result right = (this->*next)();
    if (!right.ok()) return right;
    Expr e;
    e.kind = Expr::kBinary;
    e.name = op;
    e.args = {*left, *right};
    return Make(std::move(e));
  }
  Result Conditional() {
    Result then = Or();
    if (!then.ok() || !IsName("if")) return then;
    Next();
    Result cond = Or();
    if (!cond.ok()) return cond;
    Expr e;
    e.kind = Expr::kCond;
    e.args = {*then, *cond, nullptr};
    if (IsName("else")) {
      Next();
      Result otherwise = Conditional();
      if (!otherwise.ok()) return otherwise;
      e.args[2] = *otherwise;
    }
    return Make(std::move(e));
  }
  Result Or() {
    Result left = And();
    while (left.ok() && IsName("or")) {
      Next();
      left = Binary(left, "or", &Parser::And);
    }
    return left;
  }
  Result And() {
    Result left = Not();
    while (left.ok() && IsName("and")) {
      Next();
      left = Binary(left, "and", &Parser::Not);
    }
    return left;
  }
  Result Not() {
    if (!IsName("not")) return Compare();
    Next();
    Result operand = Not();
    if (!operand.ok()) return operand;
    Expr e;
    e.kind = Expr::kUnary;
    e.name = "not";
    e.args = {*operand};
    return Make(std::move(e));
  }
  Result Compare() {
    Result left = Concat();
    for (;;) {
      if (!left.ok()) return left;
      if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") || IsOp(">=")) {
        const std::string op = Next().text;
        left = Binary(left, op, &Parser::Concat);
      } else if (IsName("in")) {
        Next();
        left = Binary(left, "in", &Parser::Concat);
      } else if (IsName("not") && t_[p_ + 1].kind == Token::kName && t_[p_ + 1].text == "in") {
        Next();
        Next();
        left = Binary(left, "not in", &Parser::Concat);
      } else if (IsName("is")) {
        Next();
        Expr e;
        e.kind = Expr::kTest;
        if (IsName("not")) {
          Next();
          e.negated = true;
        }
        absl::StatusOr<std::string> test = Name();
        if (!test.ok()) return test.status();
        e.name = *test;
        e.args = {*left};
        left = Make(std::move(e));
      } else {
        return left;
      }
    }
  }
  Result Concat() {
    Result left = Sum();
    while (left.ok() && IsOp("~")) {
      Next();
      left = Binary(left, "~", &Parser::Sum);
    }
    return left;
  }
  Result Sum() {
    Result left = Product();
    while (left.ok() && (IsOp("+") || IsOp("-"))) {
      const std::string op = Next().text;
      left = Binary(left, op, &Parser::Product);
    }
    return left;
  }
  Result Product() {
    Result left = Unary();
    while (left.ok() && (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%"))) {
      const std::string op = Next().text;
      left = Binary(left, op, &Parser::Unary);
    }
    return left;
  }
  Result Unary() {
    if (!IsOp("-") && !IsOp("+")) return Filtered();
    const std::string op = Next().text;
    Result operand = Unary();
    if (!operand.ok()) return operand;
    Expr e;
    e.kind = Expr::kUnary;
    e.name = op;
    e.args = {*operand};
    return Make(std::move(e));
  }
  // Call arguments after '(' up to ')': positional into `args`, name=value into `kwargs`.
  absl::Status Arguments(Expr* e) {
    while (!IsOp(")")) {
      if (t_[p_].kind == Token::kName && t_[p_ + 1].kind == Token::kOp && t_[p_ + 1].text == "=") {
        const std::string name = Next().text;
        Next();
        Result value = Expression();
        if (!value.ok()) return value.status();
        e->kwargs.emplace_back(name, *value);
      } else {
        Result value = Expression();
        if (!value.ok()) return value.status();
        e->args.push_back(*value);
      }
      if (!IsOp(",")) break;
      Next();
    }
    return Expect(")");
  }
  Result Filtered() {
    Result subject = Postfix();
    while (subject.ok() && IsOp("|")) {
      Next();
      Expr e;
      e.kind = Expr::kFilter;
      absl::StatusOr<std::string> name = Name();
      if (!name.ok()) return name.status();
      e.name = *name;
      e.args = {*subject};
      if (IsOp("(")) {
        Next();
        if (absl::Status s = Arguments(&e); !s.ok()) return s;
      }
      subject = Make(std::move(e));
    }
    return subject;
  }
  Result Postfix() {
    Result value = Primary();
    for (;;) {
      if (!value.ok()) return value;
      Expr e;
      if (IsOp(".")) {
        Next();
        absl::StatusOr<std::string> name = Name();
        if (!name.ok()) return name.status();
        e.kind = Expr::kAttr;
        e.name = *name;
        e.args = {*value};
      } else if (IsOp("[")) {
        Next();
        ExprPtr lo, hi;
        if (!IsOp(":")) {
          Result index = Expression();
          if (!index.ok()) return index;
          lo = *index;
        }
        if (IsOp(":")) {
          Next();
          if (!IsOp("]")) {
            Result upper = Expression();
            if (!upper.ok()) return upper;
            hi = *upper;
          }
          e.kind = Expr::kSlice;
          e.args = {*value, lo, hi};
        } else {
          e.kind = Expr::kItem;
          e.args = {*value, lo};
        }
        if (absl::Status s = Expect("]"); !s.ok()) return s;
      } else if (IsOp("(")) {
        Next();
        e.kind = Expr::kCall;
        e.args = {*value};
        if (absl::Status s = Arguments(&e); !s.ok()) return s;
      } else {
        return value;
      }
      value = Make(std::move(e));
    }
  }
  Result Primary() {
    const Token& t = t_[p_];
    Expr e;
    if (t.kind == Token::kString) {
      e.value = Next().text;
      while (t_[p_].kind == Token::kString) e.value = e.value.get<std::string>() + Next().text;
      return Make(std::move(e));
    }
    if (t.kind == Token::kNumber) {
      e.value = Next().number;
      return Make(std::move(e));
    }
    if (t.kind == Token::kName) {
      const std::string name = Next().text;
      if (name == "true" || name == "True") e.value = true;
      else if (name == "false" || name == "False") e.value = false;
      else if (name == "none" || name == "None") e.value = nullptr;
      else {
        e.kind = Expr::kName;
        e.name = name;
      }
      return Make(std::move(e));
    }
    if (IsOp("(")) {
      Next();
      Result inner = Expression();
      if (!inner.ok()) return inner;
      if (absl::Status s = Expect(")"); !s.ok()) return s;
      return inner;
    }
    if (IsOp("[") || IsOp("{")) {
      const bool dict = Next().text == "{";
      e.kind = dict ? Expr::kDict : Expr::kList;
      while (!IsOp(dict ? "}" : "]")) {
        Result item = Expression();
        if (!item.ok()) return item;
        e.args.push_back(*item);
        if (dict) {
          if (absl::Status s = Expect(":"); !s.ok()) return s;
          Result value = Expression();
          if (!value.ok()) return value;
          e.args.push_back(*value);
        }
        if (!IsOp(",")) break;
        Next();
      }
      if (absl::Status s = Expect(dict ? "}" : "]"); !s.ok()) return s;
      return Make(std::move(e));
    }
    return Bad(absl::StrCat("unexpected '", t.text, "' in an expression"));
  }

  std::vector<Token> t_;
  size_t p_ = 0;
};

absl::StatusOr<ExprPtr> ParseExpression(std::string_view text) {
  absl::StatusOr<std::vector<Token>> tokens = Lex(text);
  if (!tokens.ok()) return tokens.status();
  Parser parser(*std::move(tokens));
  absl::StatusOr<ExprPtr> e = parser.Expression();
  if (e.ok() && !parser.AtEnd()) {
    return Bad(absl::StrCat("unexpected '", parser.Next().text, "' in '", std::string(text), "'"));
  }
  return e;
}

// ---- Template text: segments with Jinja's whitespace control ----

struct Segment {
  enum Kind { kText, kExpr, kStmt } kind;
  std::string text;
};

absl::StatusOr<std::vector<Segment>> Split(std::string_view src) {
  std::vector<Segment> out;
  size_t i = 0;
  bool strip_leading = false, trim_newline = false;
  while (i <= src.size()) {
    size_t open = std::string_view::npos;
    for (size_t k = src.find('{', i); k != std::string_view::npos; k = src.find('{', k + 1)) {
      if (k + 1 < src.size() && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) {
        open = k;
        break;
      }
    }
    std::string text(src.substr(i, open == std::string_view::npos ? src.size() - i : open - i));
    if (strip_leading) {
      text.erase(0, text.find_first_not_of(" \t\r\n"));
      if (text.find_first_not_of(" \t\r\n") == std::string::npos) text.clear();
    } else if (trim_newline && absl::StartsWith(text, "\n")) {
      text.erase(0, 1);
    } else if (trim_newline && absl::StartsWith(text, "\r\n")) {
      text.erase(0, 2);
    }
    if (open == std::string_view::npos) {
      if (!text.empty()) out.push_back({Segment::kText, text});
      break;
    }
    const char kind = src[open + 1];
    size_t p = open + 2;
    const bool minus_left = p < src.size() && src[p] == '-';
    const bool plus_left = p < src.size() && src[p] == '+';
    if (minus_left || plus_left) ++p;
    if (minus_left) {
      const size_t keep = text.find_last_not_of(" \t\r\n");
      text.erase(keep == std::string::npos ? 0 : keep + 1);
    } else if (kind != '{' && !plus_left) {
      // lstrip_blocks: a block tag alone at the start of its line takes the line's indent.
      size_t k = open;
      while (k > 0 && (src[k - 1] == ' ' || src[k - 1] == '\t')) --k;
      if (k == 0 || src[k - 1] == '\n') {
        const size_t indent = open - k;
        text.erase(text.size() - std::min(indent, text.size()));
      }
    }
    if (!text.empty()) out.push_back({Segment::kText, text});
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t q = p;
    char quote = 0;
    for (; q + 1 < src.size(); ++q) {
      if (kind != '#' && quote == 0 && (src[q] == '\'' || src[q] == '"')) quote = src[q];
      else if (quote != 0 && src[q] == quote) quote = 0;
      else if (quote == 0 && src.substr(q, 2) == close) break;
    }
    if (q + 1 >= src.size()) return Bad(absl::StrCat("unclosed '", std::string(src.substr(open, 2)), "'"));
    const bool minus_right = q > p && src[q - 1] == '-';
    const bool plus_right = q > p && src[q - 1] == '+';
    const std::string inner(src.substr(p, q - p - (minus_right || plus_right ? 1 : 0)));
    if (kind == '{') out.push_back({Segment::kExpr, inner});
    if (kind == '%') out.push_back({Segment::kStmt, inner});
    strip_leading = minus_right;
    trim_newline = kind != '{' && !plus_right && !minus_right;
    i = q + 2;
  }
  return out;
}

}  // namespace

// ---- Statements ----

struct ChatTemplate::Node {
  enum Kind { kSequence, kText, kOutput, kIf, kFor, kSet } kind = kSequence;
  std::string text;                  // kText
  ExprPtr expr;                      // kOutput, kSet's value, kFor's iterable
  std::vector<std::string> targets;  // kFor's loop variables; kSet: name (and attribute)
  std::vector<std::pair<ExprPtr, std::shared_ptr<const Node>>> branches;  // kIf; else: null
  std::shared_ptr<const Node> body, otherwise;                              // kFor
  std::vector<std::shared_ptr<const Node>> children;                        // kSequence
};

namespace {

using Node = ChatTemplate::Node;
using NodePtr = std::shared_ptr<const Node>;

class StatementParser {
 public:
  explicit StatementParser(std::vector<Segment> segments) : s_(std::move(segments)) {}

  // Nodes up to one of `stops` (its keyword in *stop; "" at the end of the template).
  absl::StatusOr<NodePtr> Body(const std::vector<std::string>& stops, std::string* stop,
                               std::string* rest) {
    auto seq = std::make_shared<Node>();
    while (i_ < s_.size()) {
      const Segment& seg = s_[i_++];
      if (seg.kind == Segment::kText) {
        auto text = std::make_shared<Node>();
        text->kind = Node::kText;
        text->text = seg.text;
        seq->children.push_back(text);
        continue;
      }
      if (seg.kind == Segment::kExpr) {
        absl::StatusOr<ExprPtr> e = ParseExpression(seg.text);
        if (!e.ok()) return e.status();
        auto out = std::make_shared<Node>();
        out->kind = Node::kOutput;
        out->expr = *e;
        seq->children.push_back(out);
        continue;
      }
      const std::string stmt(absl::StripAsciiWhitespace(seg.text));
      const std::string keyword = stmt.substr(0, stmt.find_first_of(" \t\n"));
      const std::string args =
          keyword.size() < stmt.size() ? std::string(absl::StripAsciiWhitespace(stmt.substr(keyword.size()))) : "";
      if (std::find(stops.begin(), stops.end(), keyword) != stops.end()) {
        *stop = keyword;
        *rest = args;
        return NodePtr(seq);
      }
      absl::StatusOr<NodePtr> node = keyword == "if"    ? If(args)
                                     : keyword == "for" ? For(args)
                                     : keyword == "set" ? Set(args)
                                                        : absl::StatusOr<NodePtr>(Bad(absl::StrCat(
                                                              "unsupported tag {% ", keyword, " %}")));
      if (!node.ok()) return node.status();
      seq->children.push_back(*node);
    }
    if (!stops.empty()) return Bad(absl::StrCat("missing {% ", stops.back(), " %}"));
    stop->clear();
    return NodePtr(seq);
  }

 private:
  absl::StatusOr<NodePtr> If(std::string cond_text) {
    auto node = std::make_shared<Node>();
    node->kind = Node::kIf;
    for (;;) {
      absl::StatusOr<ExprPtr> cond = ParseExpression(cond_text);
      if (!cond.ok()) return cond.status();
      std::string stop, rest;
      absl::StatusOr<NodePtr> body = Body({"elif", "else", "endif"}, &stop, &rest);
      if (!body.ok()) return body.status();
      node->branches.emplace_back(*cond, *body);
      if (stop == "elif") {
        cond_text = rest;
        continue;
      }
      if (stop == "else") {
        absl::StatusOr<NodePtr> otherwise = Body({"endif"}, &stop, &rest);
        if (!otherwise.ok()) return otherwise.status();
        node->branches.emplace_back(nullptr, *otherwise);
      }
      return NodePtr(node);
    }
  }
  absl::StatusOr<NodePtr> For(const std::string& args) {
    const size_t in = args.find(" in ");
    if (in == std::string::npos) return Bad(absl::StrCat("{% for ", args, " %}: expected 'x in xs'"));
    auto node = std::make_shared<Node>();
    node->kind = Node::kFor;
    for (absl::string_view name : absl::StrSplit(args.substr(0, in), ',')) {
      node->targets.emplace_back(absl::StripAsciiWhitespace(name));
    }
    const std::string iterable = args.substr(in + 4);
    if (absl::StrContains(iterable, " if ") || absl::StrContains(iterable, " recursive")) {
      return Bad("loop filters and recursive loops are not supported");
    }
    absl::StatusOr<ExprPtr> e = ParseExpression(iterable);
    if (!e.ok()) return e.status();
    node->expr = *e;
    std::string stop, rest;
    absl::StatusOr<NodePtr> body = Body({"else", "endfor"}, &stop, &rest);
    if (!body.ok()) return body.status();
    node->body = *body;
    if (stop == "else") {
      absl::StatusOr<NodePtr> otherwise = Body({"endfor"}, &stop, &rest);
      if (!otherwise.ok()) return otherwise.status();
      node->otherwise = *otherwise;
    }
    return NodePtr(node);
  }
  absl::StatusOr<NodePtr> Set(const std::string& args) {
    const size_t eq = args.find('=');
    if (eq == std::string::npos) return Bad("block {% set %} is not supported");
    auto node = std::make_shared<Node>();
    node->kind = Node::kSet;
    for (absl::string_view part : absl::StrSplit(args.substr(0, eq), '.')) {
      node->targets.emplace_back(absl::StripAsciiWhitespace(part));
    }
    if (node->targets.size() > 2) return Bad(absl::StrCat("{% set ", args, " %}"));
    absl::StatusOr<ExprPtr> e = ParseExpression(args.substr(eq + 1));
    if (!e.ok()) return e.status();
    node->expr = *e;
    return NodePtr(node);
  }

  std::vector<Segment> s_;
  size_t i_ = 0;
};

// ---- Rendering ----

bool Truthy(const Json& v) {
  if (IsUndefined(v) || v.is_null()) return false;
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0;
  if (v.is_string()) return !v.get<std::string>().empty();
  return !v.empty();
}

std::string Repr(const Json& v);

std::string Str(const Json& v) {
  if (IsUndefined(v)) return "";
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "None";
  if (v.is_boolean()) return v.get<bool>() ? "True" : "False";
  if (v.is_number_integer() || v.is_number_unsigned()) return v.dump();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (d == std::floor(d) && std::fabs(d) < 1e16) return absl::StrCat(static_cast<int64_t>(d), ".0");
    return v.dump();
  }
  return Repr(v);
}

// Python's repr of a value inside a list or dict ({{ [1, 'a'] }} prints "[1, 'a']").
std::string Repr(const Json& v) {
  if (v.is_string()) {
    const std::string s = v.get<std::string>();
    const char quote = s.find('\'') != std::string::npos && s.find('"') == std::string::npos ? '"' : '\'';
    std::string out(1, quote);
    for (char c : s) {
      if (c == '\\' || c == quote) out += '\\';
      if (c == '\n') out += "\\n";
      else if (c == '\t') out += "\\t";
      else if (c == '\r') out += "\\r";
      else out += c;
    }
    return out + quote;
  }
  if (v.is_array()) {
    std::vector<std::string> items;
    for (const Json& x : v) items.push_back(Repr(x));
    return "[" + absl::StrJoin(items, ", ") + "]";
  }
  if (v.is_object()) {
    std::vector<std::string> items;
    for (const auto& [k, x] : v.items()) items.push_back(Repr(Json(k)) + ": " + Repr(x));
    return "{" + absl::StrJoin(items, ", ") + "}";
  }
  return Str(v);
}

// json.dumps(x) as transformers' tojson filter writes it: ", " and ": " separators, keys in
// their order, non-ASCII kept.
std::string PyJson(const Json& v) {
  if (v.is_object()) {
    std::vector<std::string> items;
    for (const auto& [k, x] : v.items()) items.push_back(Json(k).dump() + ": " + PyJson(x));
    return "{" + absl::StrJoin(items, ", ") + "}";
  }
  if (v.is_array()) {
    std::vector<std::string> items;
    for (const Json& x : v) items.push_back(PyJson(x));
    return "[" + absl::StrJoin(items, ", ") + "]";
  }
  if (v.is_number_float()) return Str(v);
  if (IsUndefined(v)) return "null";
  return v.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Strip(const std::string& s, const std::string& chars, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) while (b < e && chars.find(s[b]) != std::string::npos) ++b;
  if (right) while (e > b && chars.find(s[e - 1]) != std::string::npos) --e;
  return s.substr(b, e - b);
}

class Renderer {
 public:
  explicit Renderer(Json context) { scopes_.push_back(std::move(context)); }

  absl::Status Run(const Node& node, std::string* out) {
    switch (node.kind) {
      case Node::kSequence:
        for (const NodePtr& child : node.children) {
          if (absl::Status s = Run(*child, out); !s.ok()) return s;
        }
        return absl::OkStatus();
      case Node::kText:
        *out += node.text;
        return absl::OkStatus();
      case Node::kOutput: {
        absl::StatusOr<Json> v = Eval(*node.expr);
        if (!v.ok()) return v.status();
        *out += Str(*v);
        return absl::OkStatus();
      }
      case Node::kIf:
        for (const auto& [cond, body] : node.branches) {
          bool take = cond == nullptr;
          if (!take) {
            absl::StatusOr<Json> v = Eval(*cond);
            if (!v.ok()) return v.status();
            take = Truthy(*v);
          }
          if (take) return Run(*body, out);
        }
        return absl::OkStatus();
      case Node::kFor:
        return Loop(node, out);
      case Node::kSet: {
        absl::StatusOr<Json> v = Eval(*node.expr);
        if (!v.ok()) return v.status();
        if (node.targets.size() == 1) {
          scopes_.back()[node.targets[0]] = *v;
          return absl::OkStatus();
        }
        for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
          if (scope->contains(node.targets[0]) && (*scope)[node.targets[0]].is_object()) {
            (*scope)[node.targets[0]][node.targets[1]] = *v;
            return absl::OkStatus();
          }
        }
        return Bad(absl::StrCat("set ", node.targets[0], ".", node.targets[1], ": no namespace"));
      }
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Loop(const Node& node, std::string* out) {
    absl::StatusOr<Json> seq = Eval(*node.expr);
    if (!seq.ok()) return seq.status();
    Json items = Json::array();
    if (seq->is_array()) items = *seq;
    else if (seq->is_object()) for (const auto& [k, v] : seq->items()) items.push_back(k);
    else if (seq->is_string()) for (char c : seq->get<std::string>()) items.push_back(std::string(1, c));
    else if (!IsUndefined(*seq) && !seq->is_null()) return Bad("for: not iterable");
    if (items.empty()) return node.otherwise ? Run(*node.otherwise, out) : absl::OkStatus();
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      Json scope = Json::object();
      if (node.targets.size() == 1) {
        scope[node.targets[0]] = items[i];
      } else {
        for (size_t t = 0; t < node.targets.size(); ++t) {
          scope[node.targets[t]] = items[i].is_array() && t < items[i].size() ? items[i][t] : Undefined();
        }
      }
      scope["loop"] = {{"index", i + 1}, {"index0", i}, {"first", i == 0}, {"last", i == n - 1},
                       {"length", n}, {"revindex", n - i}, {"revindex0", n - i - 1}};
      scopes_.push_back(std::move(scope));
      absl::Status s = Run(*node.body, out);
      scopes_.pop_back();
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  Json Lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return *it;
    }
    return Undefined();
  }

  absl::StatusOr<std::vector<Json>> Values(const std::vector<ExprPtr>& args, size_t from) {
    std::vector<Json> out;
    for (size_t i = from; i < args.size(); ++i) {
      absl::StatusOr<Json> v = args[i] ? Eval(*args[i]) : absl::StatusOr<Json>(Undefined());
      if (!v.ok()) return v.status();
      out.push_back(*v);
    }
    return out;
  }

  absl::StatusOr<Json> Eval(const Expr& e) {
    switch (e.kind) {
      case Expr::kLiteral: return e.value;
      case Expr::kName: return Lookup(e.name);
      case Expr::kList: {
        absl::StatusOr<std::vector<Json>> items = Values(e.args, 0);
        if (!items.ok()) return items.status();
        return Json(*items);
      }
      case Expr::kDict: {
        absl::StatusOr<std::vector<Json>> items = Values(e.args, 0);
        if (!items.ok()) return items.status();
        Json dict = Json::object();
        for (size_t i = 0; i + 1 < items->size(); i += 2) dict[Str((*items)[i])] = (*items)[i + 1];
        return dict;
      }
      case Expr::kAttr:
      case Expr::kItem:
      case Expr::kSlice: return Access(e);
      case Expr::kCall: return Call(e);
      case Expr::kFilter: return Filter(e);
      case Expr::kTest: return Test(e);
      case Expr::kUnary: {
        absl::StatusOr<Json> v = Eval(*e.args[0]);
        if (!v.ok()) return v;
        if (e.name == "not") return Json(!Truthy(*v));
        if (!v->is_number()) return Bad(absl::StrCat("unary ", e.name, " on a non-number"));
        return e.name == "-" ? (v->is_number_float() ? Json(-v->get<double>()) : Json(-v->get<int64_t>())) : *v;
      }
      case Expr::kBinary: return BinaryOp(e);
      case Expr::kCond: {
        absl::StatusOr<Json> cond = Eval(*e.args[1]);
        if (!cond.ok()) return cond;
        if (Truthy(*cond)) return Eval(*e.args[0]);
        return e.args[2] ? Eval(*e.args[2]) : absl::StatusOr<Json>(Undefined());
      }
    }
    return Undefined();
  }

  absl::StatusOr<Json> Access(const Expr& e) {
    absl::StatusOr<std::vector<Json>> v = Values(e.args, 0);
    if (!v.ok()) return v.status();
    const Json& obj = (*v)[0];
    // As Jinja2's default Undefined: reading an undefined value is fine, looking into it fails.
    if (IsUndefined(obj)) return Bad("looking into an undefined value");
    if (e.kind == Expr::kAttr) {
      if (obj.is_object() && obj.contains(e.name)) return obj[e.name];
      return Undefined();
    }
    if (e.kind == Expr::kItem) {
      const Json& key = (*v)[1];
      if (obj.is_object() && key.is_string()) {
        return obj.contains(key.get<std::string>()) ? obj[key.get<std::string>()] : Undefined();
      }
      if ((obj.is_array() || obj.is_string()) && key.is_number_integer()) {
        const int64_t n = obj.is_array() ? obj.size() : obj.get<std::string>().size();
        int64_t i = key.get<int64_t>();
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Undefined();
        return obj.is_array() ? obj[i] : Json(obj.get<std::string>().substr(i, 1));
      }
      return Undefined();
    }
    // A slice [lo:hi] of a list or a string.
    const int64_t n = obj.is_array() ? obj.size() : obj.is_string() ? obj.get<std::string>().size() : 0;
    auto bound = [n](const Json& b, int64_t fallback) {
      if (!b.is_number_integer()) return fallback;
      int64_t i = b.get<int64_t>();
      if (i < 0) i += n;
      return std::clamp<int64_t>(i, 0, n);
    };
    const int64_t lo = bound((*v)[1], 0), hi = std::max(lo, bound((*v)[2], n));
    if (obj.is_string()) return Json(obj.get<std::string>().substr(lo, hi - lo));
    Json out = Json::array();
    for (int64_t i = lo; i < hi; ++i) out.push_back(obj[i]);
    return out;
  }

  absl::StatusOr<Json> Call(const Expr& e) {
    absl::StatusOr<std::vector<Json>> args = Values(e.args, 1);
    if (!args.ok()) return args.status();
    const Expr& callee = *e.args[0];
    if (callee.kind == Expr::kName) {
      if (callee.name == "raise_exception") {
        return absl::InvalidArgumentError(args->empty() ? "raise_exception" : Str((*args)[0]));
      }
      if (callee.name == "range") {
        int64_t lo = 0, hi = 0;
        if (args->size() == 1 && (*args)[0].is_number_integer()) hi = (*args)[0].get<int64_t>();
        if (args->size() == 2) lo = (*args)[0].get<int64_t>(), hi = (*args)[1].get<int64_t>();
        Json out = Json::array();
        for (int64_t i = lo; i < hi; ++i) out.push_back(i);
        return out;
      }
      if (callee.name == "namespace") {
        Json ns = Json::object();
        for (const auto& [name, value] : e.kwargs) {
          absl::StatusOr<Json> v = Eval(*value);
          if (!v.ok()) return v;
          ns[name] = *v;
        }
        return ns;
      }
      return Bad(absl::StrCat("unknown function ", callee.name, "()"));
    }
    if (callee.kind != Expr::kAttr) return Bad("only functions and methods can be called");
    absl::StatusOr<Json> self = Eval(*callee.args[0]);
    if (!self.ok()) return self;
    return Method(*self, callee.name, *args);
  }

  static absl::StatusOr<Json> Method(const Json& self, const std::string& name,
                                     const std::vector<Json>& args) {
    auto arg = [&args](size_t i) { return i < args.size() ? Str(args[i]) : std::string(); };
    if (self.is_string()) {
      const std::string s = self.get<std::string>();
      const std::string chars = args.empty() ? " \t\r\n\f\v" : arg(0);
      if (name == "strip") return Json(Strip(s, chars, true, true));
      if (name == "lstrip") return Json(Strip(s, chars, true, false));
      if (name == "rstrip") return Json(Strip(s, chars, false, true));
      if (name == "upper") return Json(absl::AsciiStrToUpper(s));
      if (name == "lower") return Json(absl::AsciiStrToLower(s));
      if (name == "startswith") return Json(absl::StartsWith(s, arg(0)));
      if (name == "endswith") return Json(absl::EndsWith(s, arg(0)));
      if (name == "replace") return Json(absl::StrReplaceAll(s, {{arg(0), arg(1)}}));
      if (name == "capitalize" || name == "title") return Filter(self, name, {});
      if (name == "split") {
        Json out = Json::array();
        if (args.empty()) {
          for (absl::string_view w : absl::StrSplit(s, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty())) out.push_back(std::string(w));
        } else {
          for (absl::string_view w : absl::StrSplit(s, arg(0))) out.push_back(std::string(w));
        }
        return out;
      }
    }
    if (self.is_object()) {
      if (name == "get") {
        const std::string key = arg(0);
        return self.contains(key) ? self[key] : (args.size() > 1 ? args[1] : Json(nullptr));
      }
      if (name == "items" || name == "keys" || name == "values") {
        Json out = Json::array();
        for (const auto& [k, v] : self.items()) {
          out.push_back(name == "items" ? Json::array({k, v}) : name == "keys" ? Json(k) : v);
        }
        return out;
      }
    }
    return Bad(absl::StrCat("unsupported method .", name, "()"));
  }

  absl::StatusOr<Json> Filter(const Expr& e) {
    absl::StatusOr<std::vector<Json>> v = Values(e.args, 0);
    if (!v.ok()) return v.status();
    std::vector<Json> args(v->begin() + 1, v->end());
    for (const auto& [name, value] : e.kwargs) {
      absl::StatusOr<Json> kw = Eval(*value);
      if (!kw.ok()) return kw;
      args.push_back(*kw);
    }
    return Filter((*v)[0], e.name, args);
  }

  static absl::StatusOr<Json> Filter(const Json& x, const std::string& name,
                                     const std::vector<Json>& args) {
    const std::string s = Str(x);
    if (name == "trim") return Json(Strip(s, " \t\r\n\f\v", true, true));
    if (name == "upper") return Json(absl::AsciiStrToUpper(s));
    if (name == "lower") return Json(absl::AsciiStrToLower(s));
    if (name == "string") return Json(s);
    if (name == "capitalize") {
      std::string out = absl::AsciiStrToLower(s);
      if (!out.empty()) out[0] = absl::ascii_toupper(out[0]);
      return Json(out);
    }
    if (name == "title") {
      std::string out = s;
      bool start = true;
      for (char& c : out) {
        c = start ? absl::ascii_toupper(c) : absl::ascii_tolower(c);
        start = !absl::ascii_isalnum(static_cast<unsigned char>(c));
      }
      return Json(out);
    }
    if (name == "length" || name == "count") {
      if (x.is_string()) return Json(s.size());
      return Json((x.is_array() || x.is_object()) ? x.size() : 0);
    }
    if (name == "first" || name == "last") {
      if (x.is_array()) return x.empty() ? Undefined() : (name == "first" ? x.front() : x.back());
      if (x.is_string()) return s.empty() ? Undefined() : Json(std::string(1, name == "first" ? s.front() : s.back()));
      return Undefined();
    }
    if (name == "join") {
      std::vector<std::string> parts;
      if (x.is_array()) for (const Json& item : x) parts.push_back(Str(item));
      return Json(absl::StrJoin(parts, args.empty() ? "" : Str(args[0])));
    }
    if (name == "default" || name == "d") {
      const bool boolean = args.size() > 1 && Truthy(args[1]);
      if (IsUndefined(x) || (boolean && !Truthy(x))) return args.empty() ? Json("") : args[0];
      return x;
    }
    if (name == "tojson") return Json(PyJson(x));
    if (name == "replace" && args.size() >= 2) return Json(absl::StrReplaceAll(s, {{Str(args[0]), Str(args[1])}}));
    if (name == "list") {
      if (x.is_array()) return x;
      Json out = Json::array();
      if (x.is_string()) for (char c : s) out.push_back(std::string(1, c));
      return out;
    }
    if (name == "items") return Method(x, "items", {});
    if (name == "reverse") {
      if (x.is_string()) return Json(std::string(s.rbegin(), s.rend()));
      Json out = x.is_array() ? x : Json::array();
      std::reverse(out.begin(), out.end());
      return out;
    }
    if (name == "int") {
      if (x.is_number()) return Json(static_cast<int64_t>(x.get<double>()));
      try {
        return Json(std::stoll(s));
      } catch (...) {
        return Json(0);
      }
    }
    return Bad(absl::StrCat("unsupported filter |", name));
  }

  absl::StatusOr<Json> Test(const Expr& e) {
    absl::StatusOr<Json> v = Eval(*e.args[0]);
    if (!v.ok()) return v;
    const Json& x = *v;
    bool result;
    if (e.name == "defined") result = !IsUndefined(x);
    else if (e.name == "undefined") result = IsUndefined(x);
    else if (e.name == "none") result = x.is_null();
    else if (e.name == "string") result = x.is_string();
    else if (e.name == "number") result = x.is_number();
    else if (e.name == "integer") result = x.is_number_integer() || x.is_number_unsigned();
    else if (e.name == "mapping") result = x.is_object();
    else if (e.name == "iterable") result = x.is_array() || x.is_object() || x.is_string();
    else if (e.name == "sequence") result = x.is_array() || x.is_string();
    else if (e.name == "boolean") result = x.is_boolean();
    else if (e.name == "true") result = x.is_boolean() && x.get<bool>();
    else if (e.name == "false") result = x.is_boolean() && !x.get<bool>();
    else if (e.name == "odd" || e.name == "even") result = x.is_number_integer() && (x.get<int64_t>() % 2 != 0) == (e.name == "odd");
    else return Bad(absl::StrCat("unsupported test 'is ", e.name, "'"));
    return Json(result != e.negated);
  }

  absl::StatusOr<Json> BinaryOp(const Expr& e) {
    absl::StatusOr<Json> left = Eval(*e.args[0]);
    if (!left.ok()) return left;
    if (e.name == "and") return Truthy(*left) ? Eval(*e.args[1]) : left;
    if (e.name == "or") return Truthy(*left) ? left : Eval(*e.args[1]);
    absl::StatusOr<Json> right = Eval(*e.args[1]);
    if (!right.ok()) return right;
    const Json& a = *left;
    const Json& b = *right;
    if (e.name == "~") return Json(Str(a) + Str(b));
    if (e.name == "==") return Json(!IsUndefined(a) && !IsUndefined(b) && a == b);
    if (e.name == "!=") return Json(IsUndefined(a) || IsUndefined(b) || a != b);
    if (e.name == "in" || e.name == "not in") {
      bool found = false;
      if (b.is_string()) found = absl::StrContains(b.get<std::string>(), Str(a));
      else if (b.is_array()) found = std::find(b.begin(), b.end(), a) != b.end();
      else if (b.is_object()) found = a.is_string() && b.contains(a.get<std::string>());
      return Json(found == (e.name == "in"));
    }
    if (e.name == "+" && a.is_string() && b.is_string()) return Json(a.get<std::string>() + b.get<std::string>());
    if (e.name == "+" && a.is_array() && b.is_array()) {
      Json out = a;
      for (const Json& item : b) out.push_back(item);
      return out;
    }
    if (e.name == "<" || e.name == ">" || e.name == "<=" || e.name == ">=") {
      if (!((a.is_number() && b.is_number()) || (a.is_string() && b.is_string()))) {
        return Bad(absl::StrCat("cannot compare with ", e.name));
      }
      if (e.name == "<") return Json(a < b);
      if (e.name == ">") return Json(a > b);
      if (e.name == "<=") return Json(a <= b);
      return Json(a >= b);
    }
    if (!a.is_number() || !b.is_number()) return Bad(absl::StrCat("operator ", e.name, " needs numbers"));
    const bool ints = !a.is_number_float() && !b.is_number_float();
    const double x = a.get<double>(), y = b.get<double>();
    if (e.name == "/") {
      if (y == 0) return Bad("division by zero");
      return Json(x / y);
    }
    if ((e.name == "//" || e.name == "%") && y == 0) return Bad("division by zero");
    if (ints) {
      const int64_t i = a.get<int64_t>(), j = b.get<int64_t>();
      if (e.name == "+") return Json(i + j);
      if (e.name == "-") return Json(i - j);
      if (e.name == "*") return Json(i * j);
      const int64_t q = static_cast<int64_t>(std::floor(static_cast<double>(i) / static_cast<double>(j)));
      if (e.name == "//") return Json(q);
      if (e.name == "%") return Json(i - q * j);
    }
    if (e.name == "+") return Json(x + y);
    if (e.name == "-") return Json(x - y);
    if (e.name == "*") return Json(x * y);
    if (e.name == "//") return Json(std::floor(x / y));
    if (e.name == "%") return Json(x - std::floor(x / y) * y);
    return Bad(absl::StrCat("unsupported operator ", e.name));
  }

  std::vector<Json> scopes_;
};

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(std::string_view source) {
  absl::StatusOr<std::vector<Segment>> segments = Split(source);
  if (!segments.ok()) return segments.status();
  StatementParser parser(*std::move(segments));
  std::string stop, rest;
  absl::StatusOr<NodePtr> root = parser.Body({}, &stop, &rest);
  if (!root.ok()) return root.status();
  ChatTemplate parsed;
  parsed.root_ = *root;
  return parsed;
}

absl::StatusOr<std::optional<ChatTemplate>> ChatTemplate::FromModelDir(const std::string& dir) {
  std::ifstream in(dir + "/tokenizer_config.json");
  if (!in) return std::optional<ChatTemplate>();
  std::stringstream text;
  text << in.rdbuf();
  const Json config = Json::parse(text.str(), nullptr, false);
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, "/tokenizer_config.json: not JSON"));
  }
  const Json chat = config.value("chat_template", Json());
  std::string source;
  if (chat.is_string()) {
    source = chat.get<std::string>();
  } else if (chat.is_array()) {
    for (const Json& named : chat) {
      if (named.is_object() && named.value("name", "") == "default") {
        source = named.value("template", "");
      }
    }
  }
  if (source.empty()) return std::optional<ChatTemplate>();
  absl::StatusOr<ChatTemplate> parsed = Parse(source);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir, "/tokenizer_config.json: ", parsed.status().message()));
  }
  // bos/eos tokens: a string, or an AddedToken object {"content": ...}.
  auto token = [&config](const char* key) {
    const Json t = config.value(key, Json());
    if (t.is_string()) return t.get<std::string>();
    if (t.is_object()) return t.value("content", std::string());
    return std::string();
  };
  parsed->bos_token_ = token("bos_token");
  parsed->eos_token_ = token("eos_token");
  return std::optional<ChatTemplate>(*std::move(parsed));
}

absl::StatusOr<std::string> ChatTemplate::RenderJson(std::string_view context_json) const {
  Json context = Json::parse(context_json, nullptr, false);
  if (!context.is_object()) return Bad("the context is no JSON object");
  Renderer renderer(std::move(context));
  std::string out;
  if (absl::Status s = renderer.Run(*root_, &out); !s.ok()) return s;
  return out;
}

absl::StatusOr<std::string> ChatTemplate::Render(const std::vector<ChatMessage>& messages,
                                                 bool add_generation_prompt) const {
  Json context = {{"bos_token", bos_token_}, {"eos_token", eos_token_},
                  {"add_generation_prompt", add_generation_prompt}};
  Json list = Json::array();
  for (const ChatMessage& m : messages) list.push_back({{"role", m.role}, {"content", m.content}});
  context["messages"] = list;
  Renderer renderer(std::move(context));
  std::string out;
  if (absl::Status s = renderer.Run(*root_, &out); !s.ok()) return s;
  return out;
}

}  // namespace scd
