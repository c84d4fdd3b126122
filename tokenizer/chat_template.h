// ChatTemplate: a Hugging Face chat template (tokenizer_config.json's "chat_template", a Jinja2
// template) rendered the way transformers' apply_chat_template renders it: Jinja2 with
// trim_blocks and lstrip_blocks, the variables messages, bos_token, eos_token and
// add_generation_prompt, and raise_exception(). The subset of Jinja2 chat templates use:
//   {{ expr }}, {% if %}/{% elif %}/{% else %}/{% endif %}, {% for x in xs %} (also `a, b`),
//   {% else %} in a for, {% set x = expr %} and {% set ns.attr = expr %} with namespace(),
//   {# comments #}, whitespace control with - and +; expressions with literals (strings,
//   numbers, true/false/none in either case, lists, dicts), names, .attr, [index], [a:b]
//   slices, calls, filters (trim, length, count, upper, lower, capitalize, title, string,
//   first, last, join, default/d, tojson, replace, list, items, reverse, int), tests (is [not]
//   defined, undefined, none, string, number, integer, mapping, iterable, sequence, boolean,
//   true, false, odd, even), not/and/or, comparisons, in / not in, + - * / // % ~, x if c else
//   y; loop.index/index0/first/last/length/revindex/revindex0; string methods (strip, lstrip,
//   rstrip, upper, lower, title, capitalize, startswith, endswith, split, replace), dict
//   methods (items, keys, values, get), range(). Anything else is refused when the template is
//   parsed (INVALID_ARGUMENT naming it), never rendered wrongly. tests/chat_template_test.cc
//   compares renderings with Python's jinja2 (Debian's python3-jinja2).
// One concept in a long file: chat_template.cc (about 1,200 lines) is one template engine --
// lexer, parser and evaluator of one language sharing one syntax tree and one value type; split
// into files, each part would export internals only the others use.
// Thread-safety: an immutable value; Render is const and thread-safe.
#ifndef SCD_TOKENIZER_CHAT_TEMPLATE_H_
#define SCD_TOKENIZER_CHAT_TEMPLATE_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace scd {

struct ChatMessage {
  std::string role;  // system | user | assistant | ...
  std::string content;
};

class ChatTemplate {
 public:
  struct Node;  // the parsed template (chat_template.cc)

  // INVALID_ARGUMENT naming what does not parse or is outside the subset above.
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);
  // The template of a model directory's tokenizer_config.json ("chat_template": a string, or
  // a list of {name, template} whose "default" is taken), with its bos and eos tokens; nullopt
  // when the file or the key is absent.
  static absl::StatusOr<std::optional<ChatTemplate>> FromModelDir(const std::string& dir);

  // Renders `messages` (raise_exception's message as INVALID_ARGUMENT).
  absl::StatusOr<std::string> Render(const std::vector<ChatMessage>& messages,
                                     bool add_generation_prompt = true) const;
  // Renders with a context given as a JSON object (messages, bos_token, ... as the template
  // expects).
  absl::StatusOr<std::string> RenderJson(std::string_view context_json) const;

  const std::string& bos_token() const { return bos_token_; }
  const std::string& eos_token() const { return eos_token_; }

 private:
  std::shared_ptr<const Node> root_;
  std::string bos_token_, eos_token_;
};

}  // namespace scd

#endif  // SCD_TOKENIZER_CHAT_TEMPLATE_H_
