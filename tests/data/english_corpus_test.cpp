// The English corpus's text cleaners on excerpts of the real sources' formats. (Fetching the
// packages needs the network: `kiln data english-corpus` is run by hand, see docs/llm.md.)
#include "kiln/data/english_corpus.h"

#include <gtest/gtest.h>

#include "kiln/runtime/error.h"

namespace kiln::data {
namespace english_corpus_test {

TEST(EnglishCorpus, BrownTagsAreDroppedAndPunctuationAttached) {
  const std::string tagged =
      "\n\n\tThe/at Fulton/np-tl County/nn-tl Grand/jj-tl Jury/nn-tl said/vbd Friday/nr an/at investigation/nn "
      "of/in Atlanta's/np$ recent/jj primary/nn election/nn produced/vbd ``/`` no/at evidence/nn ''/'' that/cs "
      "any/dti irregularities/nns took/vbd place/nn ./.\n\n\n\tThe/at jury/nn said/vbd ,/, however/rb ,/, "
      "it/pps did/dod n't/* ./.\n";
  EXPECT_EQ(detag_brown(tagged),
            "The Fulton County Grand Jury said Friday an investigation of Atlanta's recent primary election produced "
            "\"no evidence\" that any irregularities took place.\n\nThe jury said, however, it didn't.\n");
}

TEST(EnglishCorpus, MailBodyWithoutHeadersAndOnlyPlainText) {
  EXPECT_EQ(mail_body("From: a@b.c\nSubject: hi\nContent-Type: text/plain\n\nHello there.\nBye.\n"),
            "Hello there.\nBye.\n");
  EXPECT_EQ(mail_body("From: a@b.c\nContent-Type: text/html\n\n<html><body>x</body></html>"), "");
  EXPECT_EQ(mail_body("From: a@b.c\nContent-Transfer-Encoding: base64\n\nSGVsbG8=\n"), "");
  EXPECT_EQ(mail_body("From: a@b.c\n\n<HTML>\n<BODY>spam</BODY>"), "");
  EXPECT_EQ(mail_body("no blank line, no body"), "");
}

TEST(EnglishCorpus, KjvBooksJoinWrappedVerses) {
  const std::string output =
      "\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n  2 And the earth was without "
      "form, and void; and darkness was upon the face of\nthe deep.\n\nGenesis 2\n\n  1 Thus the heavens and the "
      "earth were finished.\n\n1 Kings 1\n\n  1 Now king David was old and stricken in years;\n";
  const auto books = kjv_books(output);
  ASSERT_EQ(books.size(), 2u);
  EXPECT_EQ(books[0].first, "Genesis");
  EXPECT_EQ(books[0].second,
            "Genesis 1\nIn the beginning God created the heaven and the earth.\nAnd the earth was without form, and "
            "void; and darkness was upon the face of the deep.\n\nGenesis 2\nThus the heavens and the earth were "
            "finished.\n");
  EXPECT_EQ(books[1].first, "1 Kings");
  EXPECT_EQ(books[1].second, "1 Kings 1\nNow king David was old and stricken in years;\n");
}

TEST(EnglishCorpus, UnknownSourceIsRefusedByName) {
  EnglishCorpusOptions options;
  options.out_dir = ::testing::TempDir() + "/english_corpus_unknown";
  options.only = {"wikipedia"};
  try {
    build_english_corpus(options);
    FAIL() << "an unknown source was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown source 'wikipedia'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sotu"), std::string::npos) << e.what();
  }
}

}  // namespace english_corpus_test
}  // namespace kiln::data
