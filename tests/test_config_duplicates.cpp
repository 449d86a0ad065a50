// Issue 14, finding 8: a key repeated in one JSON object, or a repeated section, is an error that
// names the key and both positions (JSON parsers keep the last one, silently).
#include <gtest/gtest.h>

#include "runtime/config.h"
#include "runtime/error.h"

using namespace llmpi;

static std::string error_of(const std::string& text) {
  try {
    parse_config(text, "run.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ConfigDuplicates, RepeatedKeyNamesKeyAndBothPositions) {
  const std::string text = "{\"data\": {\"train\": \"t.h5\"},\n"
                           " \"train\": {\"lr\": 1e-3,\n"
                           "            \"steps\": 5, \"lr\": 2e-3}}";
  const std::string e = error_of(text);
  EXPECT_NE(e.find("run.json: duplicate key 'train.lr' at line 2, column 12 and line 3, column 25"), std::string::npos)
      << e;
}

TEST(ConfigDuplicates, RepeatedSectionIsAnError) {
  // The second "train" section would reset train.steps to its default.
  const std::string text = "{\"data\": {\"train\": \"t.h5\"}, \"train\": {\"steps\": 5},\n"
                           "  \"train\": {\"lr\": 1e-3}}";
  const std::string e = error_of(text);
  EXPECT_NE(e.find("section 'train' appears twice (line 1, column 29 and line 2, column 3)"), std::string::npos) << e;
  EXPECT_NE(e.find("merge them"), std::string::npos) << e;
}

TEST(ConfigDuplicates, EscapedSpellingOfTheSameKeyIsCaught) {
  const std::string e = error_of(R"({"data": {"train": "t.h5", "tr\u0061in": "u.h5"}})");
  EXPECT_NE(e.find("duplicate key 'data.train'"), std::string::npos) << e;
}

TEST(ConfigDuplicates, SameKeyInDifferentObjectsAndInStringsOrCommentsIsFine) {
  // "lr" in two sections, a quoted brace and a key-like word inside a string and a comment.
  const std::string text = R"({
    // "train": {"steps": 1}
    "data": {"train": "t{\"steps\": 1, \"steps\": 2}.h5"},
    /* "data": {} */
    "model": {"n_layer": 2}, "train": {"steps": 3, "seed": 7}
  })";
  Config c = parse_config(text, "run.json");
  EXPECT_EQ(c.train.steps, 3);
  EXPECT_EQ(c.model.n_layer, 2);
  EXPECT_EQ(c.data.train, "t{\"steps\": 1, \"steps\": 2}.h5");
}
