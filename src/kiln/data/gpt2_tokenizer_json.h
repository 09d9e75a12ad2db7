#pragma once
// A GPT-2 byte-level BPE tokenizer (vocab.json + merges.txt) as the one-file `tokenizer.json` of the
// Hugging Face `tokenizers` library: model BPE (the vocabulary and the merges in rank order),
// ByteLevel pre-tokenizer (GPT-2's regex, no prefix space), post-processor and decoder, and
// <|endoftext|> as a special added token when the vocabulary has it; what Hugging Face's own
// gpt2 repository ships. `kiln export-hf` writes it beside vocab.json and merges.txt: transformers'
// AutoTokenizer builds its fast tokenizer from this file, and without it converts from the slow
// tokenizer only for the model types that map to GPT-2's (a Mixtral or DeepSeek-V3 export with
// GPT-2's files failed to load there).
#include <filesystem>
#include <string>

namespace kiln::data {

// The tokenizer.json text; throws kiln::Error naming the file for an unreadable or malformed input.
std::string gpt2_tokenizer_json(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt);

}  // namespace kiln::data
