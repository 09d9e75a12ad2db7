#pragma once
// Readers of the two tokenizer file formats byte-level BPE comes in:
// - GPT-2's vocab.json (token -> id, in the byte-level alphabet) and merges.txt ("a b" per line,
//   rank order, after a "#version" line), as Megatron's GPT2BPETokenizer takes them;
// - a Hugging Face tokenizer.json (model BPE, Split/ByteLevel pre-tokenizer, added tokens), with
//   tokenizer_config.json beside it naming the end-of-sequence token.
#include <filesystem>

#include "kiln/data/bpe_tokenizer.h"

namespace kiln::data {

// GPT-2 files. The end-of-document token is "<|endoftext|>"; like Megatron and tiktoken's
// encode_ordinary, text that spells it is encoded as ordinary text.
BpeDefinition read_gpt2_bpe_files(const std::filesystem::path& vocab_json, const std::filesystem::path& merges_txt);

// A Hugging Face tokenizer.json, or a directory holding one. Throws kiln::Error naming the file
// and the field for what Kiln does not implement (normalizers, non-BPE models, byte fallback).
BpeDefinition read_hugging_face_tokenizer(const std::filesystem::path& path);

// The whole file, or a kiln::Error naming it.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace kiln::data
