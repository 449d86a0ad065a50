// The figures the project claims are the figures its records hold (README.md's "Headline figures"
// and docs/PERF.md's "Current figures" tables):
//  - every row has a `record` cell naming its record file(s) under bench/results/ and, for every
//    figure, the JSON pointer that holds it and the figure as written:
//        [file.json](../bench/results/file.json): `/rows/gpt2/tokens_per_s` 7,982; `/ratio` **1.47**
//    A figure may be a quotient of two pointers (`/a` / `/b` 0.43) or of a pointer and a unit
//    (`/peak_rss_bytes` / `1e6` 475.5 for MB) and, written with %, is the value times 100. The value, rounded to the decimals the figure shows, must be the figure;
//  - every number in a row's figure cells (all cells but the first and the record, command,
//    machine, date and commit cells; code spans excepted) is one of its record's figures, so a
//    number cannot be added or edited in the text without its record agreeing;
//  - every figure of README.md's headline table is also a figure of a row of PERF.md's table,
//    where the command that made it is named.
// The checker is shown to fail on each kind of fault in planted tables first.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

// One figure of a record cell: the record file, its pointer(s), the figure as written.
struct Figure {
  std::string file, pointer, divisor, text;
};

struct TableCheck {
  std::vector<std::string> errors;
  std::vector<Figure> figures;
};

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

// A table row's cells: split on | outside code spans; \| is a literal bar.
std::vector<std::string> cells_of(const std::string& line) {
  std::vector<std::string> cells;
  std::string cur;
  bool code = false;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (c == '\\' && i + 1 < line.size() && line[i + 1] == '|') cur += '|', ++i;
    else if (c == '`') code = !code, cur += c;
    else if (c == '|' && !code) cells.push_back(trim(cur)), cur.clear();
    else cur += c;
  }
  cells.push_back(trim(cur));
  // A row starts and ends with a bar: drop the empty ends.
  if (!cells.empty() && cells.front().empty()) cells.erase(cells.begin());
  if (!cells.empty() && cells.back().empty()) cells.pop_back();
  return cells;
}

// U+2212, the minus sign a negative figure is written with (a hyphen joins names).
const std::string kMinus = "\xE2\x88\x92";

bool word_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }

// The numbers of a text, as written: 7,982 / 1.47 / 29.8 (a trailing % is kept). Code spans are
// skipped, a link keeps its text only, and a digit run touching a letter, _ or - is part of a name
// (GPT-2, bf16, sm_90, 124M, 4-layer), not a figure.
std::vector<std::string> numbers_in(const std::string& s) {
  std::string t;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '`') {
      size_t e = s.find('`', i + 1);
      if (e == std::string::npos) break;
      t += ' ', i = e;
    } else if (s[i] == ']' && i + 1 < s.size() && s[i + 1] == '(') {
      size_t e = s.find(')', i);
      t += ' ', i = e == std::string::npos ? s.size() : e;
    } else {
      t += s[i];
    }
  }
  std::vector<std::string> out;
  auto skip_name = [&](size_t i) {  // past the rest of a name: its letters, digits and inner dots
    while (i < t.size() && (word_char(t[i]) || (t[i] == '.' && i + 1 < t.size() && std::isdigit((unsigned char)t[i + 1]))))
      ++i;
    return i;
  };
  for (size_t i = 0; i < t.size();) {
    if (!std::isdigit(static_cast<unsigned char>(t[i]))) { ++i; continue; }
    if (i > 0 && (word_char(t[i - 1]) || t[i - 1] == '.')) { i = skip_name(i); continue; }
    size_t j = i;
    auto digit = [&](size_t k) { return k < t.size() && std::isdigit(static_cast<unsigned char>(t[k])); };
    while (digit(j)) ++j;
    while (t.size() > j && t[j] == ',' && digit(j + 1) && digit(j + 2) && digit(j + 3) && !digit(j + 4)) j += 4;
    if (t.size() > j && t[j] == '.' && digit(j + 1)) {
      ++j;
      while (digit(j)) ++j;
    }
    if (j < t.size() && word_char(t[j])) { i = skip_name(j); continue; }
    if (j < t.size() && t[j] == '%') ++j;
    const bool negative = i >= 3 && t.compare(i - 3, 3, kMinus) == 0;  // −1.7%
    out.push_back((negative ? kMinus : "") + t.substr(i, j - i));
    i = j;
  }
  return out;
}

// The figure as a number and the decimals it shows: "7,982" -> 7982, 0; "29.8%" -> 29.8, 1.
bool parse_figure(const std::string& text, double* value, int* decimals) {
  const bool negative = text.compare(0, kMinus.size(), kMinus) == 0;
  std::string digits = negative ? "-" : "";
  for (char c : text.substr(negative ? kMinus.size() : 0))
    if (c != ',' && c != '%') digits += c;
  if (digits.empty()) return false;
  size_t dot = digits.find('.');
  *decimals = dot == std::string::npos ? 0 : static_cast<int>(digits.size() - dot - 1);
  if (digits == "-") return false;
  try {
    *value = std::stod(digits);
  } catch (...) {
    return false;
  }
  return true;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Reads a record cell: [name](path) sets the file; `pointer` [/ `pointer`] figure adds a figure.
std::vector<Figure> figures_of(const std::string& cell, const std::string& where, std::vector<std::string>* errors) {
  std::vector<Figure> out;
  std::string file;
  size_t i = 0;
  auto skip_space = [&] {
    while (i < cell.size() && (cell[i] == ' ' || cell[i] == '*')) ++i;
  };
  while (i < cell.size()) {
    if (cell[i] == '[') {
      size_t close = cell.find("](", i), end = close == std::string::npos ? close : cell.find(')', close);
      if (end == std::string::npos) {
        errors->push_back(where + ": an unclosed link in the record cell");
        return out;
      }
      file = cell.substr(close + 2, end - close - 2);
      i = end + 1;
    } else if (cell[i] == '`') {
      size_t end = cell.find('`', i + 1);
      if (end == std::string::npos) {
        errors->push_back(where + ": an unclosed code span in the record cell");
        return out;
      }
      Figure f{file, cell.substr(i + 1, end - i - 1), "", ""};
      i = end + 1;
      skip_space();
      if (i + 1 < cell.size() && cell[i] == '/' && cell[i + 1] == ' ') {
        ++i;
        skip_space();
        size_t e2 = i < cell.size() && cell[i] == '`' ? cell.find('`', i + 1) : std::string::npos;
        if (e2 == std::string::npos) {
          errors->push_back(where + ": '" + f.pointer + " /' is not followed by a `pointer`");
          return out;
        }
        f.divisor = cell.substr(i + 1, e2 - i - 1);
        i = e2 + 1;
        skip_space();
      }
      size_t j = cell.compare(i, kMinus.size(), kMinus) == 0 ? i + kMinus.size() : i;
      while (j < cell.size() && (std::isdigit((unsigned char)cell[j]) || cell[j] == ',' || cell[j] == '.' || cell[j] == '%'))
        ++j;
      while (j > i && (cell[j - 1] == ',' || cell[j - 1] == '.')) --j;  // a list's comma, a sentence's stop
      f.text = cell.substr(i, j - i);
      if (f.text == kMinus) f.text.clear();
      i = j;
      if (f.file.empty()) errors->push_back(where + ": `" + f.pointer + "` comes before any [record](file) link");
      else if (f.text.empty()) errors->push_back(where + ": `" + f.pointer + "` is not followed by the figure it holds");
      else out.push_back(f);
    } else {
      ++i;
    }
  }
  return out;
}

// Checks the first table after the heading `heading` of the markdown file `md` (records' links are
// relative to md's folder, as a reader's are).
TableCheck check_claims(const fs::path& md, const std::string& heading) {
  TableCheck r;
  std::ifstream in(md);
  if (!in) {
    r.errors.push_back(md.string() + ": cannot be read");
    return r;
  }
  std::string line;
  bool in_section = false;
  std::vector<std::string> header;
  int record_col = -1;
  std::set<int> figure_cols;
  int rows = 0;
  while (std::getline(in, line)) {
    if (line.rfind("#", 0) == 0) {
      if (in_section && !header.empty()) break;
      in_section = trim(line.substr(line.find(' ') + 1)) == heading;
      continue;
    }
    if (!in_section) continue;
    if (line.rfind("|", 0) != 0) {
      if (!header.empty()) break;  // the table has ended
      continue;
    }
    std::vector<std::string> cells = cells_of(line);
    if (header.empty()) {
      header = cells;
      for (size_t c = 0; c < header.size(); ++c) {
        const std::string h = header[c];
        if (h == "record") record_col = static_cast<int>(c);
        else if (c > 0 && h != "command" && h != "machine" && h != "date" && h != "commit") figure_cols.insert(c);
      }
      if (record_col < 0) r.errors.push_back(md.string() + " '" + heading + "': the table has no 'record' column");
      continue;
    }
    if (line.find("---") != std::string::npos && line.find_first_not_of("|-: ") == std::string::npos) continue;
    ++rows;
    const std::string where = md.filename().string() + " '" + (cells.empty() ? "" : cells[0]) + "'";
    if (record_col < 0) continue;
    if (static_cast<int>(cells.size()) != static_cast<int>(header.size())) {
      r.errors.push_back(where + ": " + std::to_string(cells.size()) + " cells, the header has " +
                         std::to_string(header.size()));
      continue;
    }
    std::vector<Figure> figs = figures_of(cells[record_col], where, &r.errors);
    if (figs.empty()) {
      r.errors.push_back(where + ": no record: name the file in bench/results/ and the key of each figure");
      continue;
    }
    std::multiset<std::string> shown;
    for (int c : figure_cols)
      for (const std::string& n : numbers_in(cells[c])) shown.insert(n);
    std::set<std::string> keyed;
    for (const Figure& f : figs) {
      keyed.insert(f.text);
      const fs::path path = md.parent_path() / f.file;
      const std::string name = where + " " + f.file + " `" + f.pointer + "`";
      if (fs::path(f.file).parent_path().filename() != "results" || !fs::is_regular_file(path)) {
        r.errors.push_back(where + ": the record '" + f.file + "' is not a file in bench/results/");
        continue;
      }
      nlohmann::json doc;
      try {
        doc = nlohmann::json::parse(slurp(path));
      } catch (const std::exception& e) {
        r.errors.push_back(where + ": the record '" + f.file + "' is not JSON: " + e.what());
        continue;
      }
      auto number_at = [&](const std::string& ptr, double* v) {
        try {
          const nlohmann::json& j = doc.at(nlohmann::json::json_pointer(ptr));
          if (!j.is_number()) {
            r.errors.push_back(name + ": '" + ptr + "' holds " + j.dump().substr(0, 60) + ", not a number");
            return false;
          }
          *v = j.get<double>();
          return true;
        } catch (const std::exception&) {
          r.errors.push_back(where + ": " + f.file + " has no key '" + ptr + "'");
          return false;
        }
      };
      double v = 0, d = 1, want = 0;
      int decimals = 0;
      if (!number_at(f.pointer, &v)) continue;
      if (!f.divisor.empty() && f.divisor[0] == '/' && !number_at(f.divisor, &d)) continue;
      if (!f.divisor.empty() && f.divisor[0] != '/') {  // a unit: `1e6` for bytes as MB
        char* end = nullptr;
        d = std::strtod(f.divisor.c_str(), &end);
        if (*end != '\0' || !(d > 0)) {
          r.errors.push_back(name + ": the divisor '" + f.divisor + "' is neither a `/pointer` nor a positive number");
          continue;
        }
      }
      if (!parse_figure(f.text, &want, &decimals)) {
        r.errors.push_back(name + ": '" + f.text + "' is not a number");
        continue;
      }
      double value = v / d * (f.text.back() == '%' ? 100.0 : 1.0);
      const double half_ulp = 0.5 * std::pow(10.0, -decimals);
      if (!(std::fabs(value - want) <= half_ulp * (1 + 1e-9) + 1e-12 * std::fabs(value))) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.*f", decimals + 3, value);
        r.errors.push_back(name + ": the text says " + f.text + ", the record holds " + buf);
      }
      if (!shown.count(f.text))
        r.errors.push_back(where + ": the figure " + f.text + " of `" + f.pointer + "` is not in the row's text");
      r.figures.push_back(f);
    }
    for (const std::string& n : shown)
      if (!keyed.count(n)) r.errors.push_back(where + ": " + n + " is in the text but no record holds it");
  }
  if (header.empty()) r.errors.push_back(md.string() + ": no table under the heading '" + heading + "'");
  else if (rows == 0) r.errors.push_back(md.string() + " '" + heading + "': the table has no rows");
  return r;
}

std::string joined(const TableCheck& c) {
  std::string s;
  for (const std::string& e : c.errors) s += e + "\n";
  return s;
}

fs::path repo_root() {
  for (fs::path p : {fs::path("."), fs::path("..")})
    if (fs::exists(p / "docs/PERF.md") && fs::exists(p / "bench/results")) return p;
  return {};
}

// A scratch repository with one record and a claims table written by the test.
class ClaimsCheck : public ::testing::Test {
 protected:
  fs::path dir;
  void SetUp() override {
    dir = fs::temp_directory_path() / ("llmpi-claims-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir / "docs");
    fs::create_directories(dir / "bench/results");
    std::ofstream(dir / "bench/results/run-x-2026-01-01.json")
        << R"({"rows": {"ours": {"tokens_per_s": 7981.6}, "peer": {"tokens_per_s": 5427.2}},
              "ratio": 1.4714, "mfu": 0.2983, "list": [1.5, 2.25], "error": -0.0171, "name": "x"})";
  }
  void TearDown() override { fs::remove_all(dir); }
  TableCheck check(const std::string& row) {
    std::ofstream(dir / "docs/PERF.md")
        << "# P\n\n## Current figures\n\n| claim | figure | compared with | ratio | command | record |\n"
        << "|---|---|---|---:|---|---|\n"
        << row << "\n\nText after, 12345 not checked.\n";
    return check_claims(dir / "docs/PERF.md", "Current figures");
  }
};

const std::string kRec = "[run-x](../bench/results/run-x-2026-01-01.json): ";

TEST_F(ClaimsCheck, AgreeingRowPasses) {
  TableCheck c = check("| fp32, 2 ranks | 7,981.6 tokens/s (7.98 k), 29.8% MFU | peer, 5,427 | **1.47**; 1.471 | `make bench --n 3` | " +
                       kRec + "`/rows/ours/tokens_per_s` 7,981.6; `/mfu` 29.8%; `/rows/peer/tokens_per_s` 5,427; "
                       "`/ratio` 1.47; `/rows/ours/tokens_per_s` / `/rows/peer/tokens_per_s` 1.471; "
                       "`/rows/ours/tokens_per_s` / `1e3` 7.98 |");
  EXPECT_TRUE(c.errors.empty()) << joined(c);
  EXPECT_EQ(c.figures.size(), 6u);
}

TEST_F(ClaimsCheck, EachKindOfFaultFailsNamingIt) {
  struct Plant {
    std::string row, message;
  };
  const std::vector<Plant> plants = {
      {"| a | 7,983 tokens/s | — | — | x | " + kRec + "`/rows/ours/tokens_per_s` 7,983 |", "the text says 7,983, the record holds 7981.600"},
      {"| a | 1.48 | — | — | x | " + kRec + "`/ratio` 1.48 |", "the text says 1.48"},
      {"| a | 30% | — | — | x | " + kRec + "`/mfu` 30% |", ""},  // 29.83 rounds to 30: passes
      {"| a | 7,982 tokens/s | — | 1.47 | x | " + kRec + "`/rows/ours/tokens_per_s` 7,982 |", "1.47 is in the text but no record holds it"},
      {"| a | 7,982 tokens/s | — | — | x | |", "no record"},
      {"| a | 7,982 tokens/s | — | — | x | [m](../bench/results/missing.json): `/x` 7,982 |", "'../bench/results/missing.json' is not a file in bench/results/"},
      {"| a | 7,982 tokens/s | — | — | x | " + kRec + "`/rows/nobody` 7,982 |", "has no key '/rows/nobody'"},
      {"| a | 7,982 tokens/s | — | — | x | " + kRec + "`/name` 7,982 |", "holds \"x\", not a number"},
      {"| a | 7,982 tokens/s | — | — | x | " + kRec + "`/rows/ours/tokens_per_s` 7,982; `/ratio` 1.47 |", "the figure 1.47 of `/ratio` is not in the row's text"},
      {"| a | 7,982 tokens/s | — | — | x | `/ratio` 1.47 |", "comes before any [record](file) link"},
      {"| a | 2.25 | — | — | x | " + kRec + "`/list/1` 2.25 |", ""},
      {"| a | \u22121.7% | — | — | x | " + kRec + "`/error` \u22121.7% |", ""},
      {"| a | 1.7% | — | — | x | " + kRec + "`/error` 1.7% |", "the text says 1.7%, the record holds -1.710"},
      {"| a | \u22121.7% | — | — | x | " + kRec + "`/error` 1.7% |", "\u22121.7% is in the text but no record holds it"},
      {"| a | 2.25 | — | — | x | " + kRec + "`/list/1` / `MB` 2.25 |", "the divisor 'MB' is neither"},
      {"| a | 7,982 | — | — |" + kRec + "`/rows/ours/tokens_per_s` 7,982 |", "5 cells, the header has 6"},
  };
  for (const Plant& p : plants) {
    TableCheck c = check(p.row);
    if (p.message.empty()) {
      EXPECT_TRUE(c.errors.empty()) << p.row << "\n" << joined(c);
    } else {
      EXPECT_NE(joined(c).find(p.message), std::string::npos) << p.row << "\nexpected: " << p.message << "\ngot:\n" << joined(c);
    }
  }
}

TEST(ClaimsNumbers, NamesAndCodeAreNotFigures) {
  EXPECT_EQ(numbers_in("GPT-2 124M bf16, B = 64, `bucket_mb 1`, sm_90, 4-layer, [PERF.md](PERF.md#a-1)"),
            (std::vector<std::string>{"64"}));
  EXPECT_EQ(numbers_in("1.15 / 1.48 GB/s, 3.9–4.2× as fast, 29.8% MFU, 0.43×; 6,081; \u22121.7%"),
            (std::vector<std::string>{"1.15", "1.48", "3.9", "4.2", "29.8%", "0.43", "6,081", "\u22121.7%"}));
}

// The project's own tables.
TEST(Claims, ReadmeAndPerfFiguresAreTheirRecords) {
  const fs::path root = repo_root();
  ASSERT_FALSE(root.empty()) << "run the tests from the project root (docs/PERF.md not found)";
  TableCheck perf = check_claims(root / "docs/PERF.md", "Current figures");
  TableCheck readme = check_claims(root / "README.md", "Headline figures");
  EXPECT_TRUE(perf.errors.empty()) << joined(perf);
  EXPECT_TRUE(readme.errors.empty()) << joined(readme);
  EXPECT_GT(perf.figures.size(), 20u);
  EXPECT_GE(readme.figures.size(), 6u);
  // The headline's figures are PERF.md's, where the command is named (record paths differ by folder).
  std::set<std::string> in_perf;
  for (const Figure& f : perf.figures)
    in_perf.insert(fs::path(f.file).filename().string() + " " + f.pointer + " " + f.divisor + " " + f.text);
  for (const Figure& f : readme.figures) {
    const std::string key = fs::path(f.file).filename().string() + " " + f.pointer + " " + f.divisor + " " + f.text;
    EXPECT_TRUE(in_perf.count(key)) << "README.md's headline figure '" << key << "' is not in docs/PERF.md's table";
  }
}

}  // namespace
