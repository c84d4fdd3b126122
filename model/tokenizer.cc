// Placeholder: the tokenizer implementation lands here.
namespace scd {}
