# Sourced by the CLI training flows after they set K (the kiln binary), W (a fresh work folder) and
# SRC (the source tree): writes the byte-level GPT-2 tokenizer (write_byte_tokenizer.py, nothing
# fetched) into $W/tok, tokenizes tests/data/tinyshakespeare_100k.txt with it, and leaves TOK (the
# tokenizer flags) and DATA (the dataset prefix) for the flow.
rm -rf "$W"
mkdir -p "$W/tok"
python3 "$SRC/tests/cli/write_byte_tokenizer.py" "$W/tok"
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file "$W/tok/vocab.json" --merge-file "$W/tok/merges.txt")
"$K" preprocess-data --input "$SRC/tests/data/tinyshakespeare_100k.txt" --input-format text --text-documents line \
  --append-eod "${TOK[@]}" --output-prefix "$W/shakespeare" > "$W/preprocess.txt"
DATA=$W/shakespeare_text_document
