// The JSON reader every file format goes through (harness/core/json_in.h): nesting is capped and
// refused at the byte that goes too deep, a duplicate key is named by its path at any depth, the
// path is built only for the message, and messages never carry a whole value.
#include <gtest/gtest.h>

#include <optional>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/core/error.h"
#include "harness/core/json_doc.h"
#include "harness/core/json_in.h"

namespace vf {
namespace {

std::string nested(std::size_t depth, std::string_view inner = "") {
  return std::string(depth, '[') + std::string(inner) + std::string(depth, ']');
}

// The message parse_json_text gives for `text` ("" when it parses).
std::string error_of(std::string_view text, std::string_view origin = "doc.json") {
  try {
    (void)parse_json_text(text, origin);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

TEST(JsonIn, NestingUpToTheLimitIsRead) {
  const nlohmann::json j = parse_json_text(nested(kMaxJsonDepth, "1"), "doc.json");
  const nlohmann::json* v = &j;
  for (int i = 0; i < kMaxJsonDepth; ++i) v = &(*v)[0];
  EXPECT_EQ(*v, 1);
}

TEST(JsonIn, OneLevelTooDeepIsRefusedAtItsBracket) {
  // The 65th '[' is byte 65.
  const std::string e = error_of(nested(kMaxJsonDepth + 1));
  EXPECT_NE(e.find("doc.json: arrays and objects nested deeper than 64 levels at byte 65"), std::string::npos) << e;
}

// The inputs of issue 14: a 200 KB document nested 100,000 deep ran for minutes and took
// gigabytes (each level copied the whole key path); 40,000 deep took 8.8 s and 2.4 GB.
TEST(JsonIn, HundredThousandDeepIsRefusedAtOnce) {
  const std::string text = nested(100000);
  ASSERT_EQ(text.size(), 200000u);
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of(text);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_NE(e.find("nested deeper than 64 levels at byte 65"), std::string::npos) << e;
  // Generous for a sanitized build on a loaded machine; the CLI measurement is in test_hostile.
  EXPECT_LT(s, 1.0);
}

TEST(JsonIn, FortyThousandDeepScenarioFieldNamesWhere) {
  const std::string text = R"({"schema":"vramfuzz.scenario/1","device":)" + nested(40000) + "}";
  const std::string e = error_of(text, "case.json");
  // "device" opens at byte 42; its 64th nested '[' (the 65th level) is byte 42 + 63 = 105.
  EXPECT_NE(e.find("case.json: arrays and objects nested deeper than 64 levels at byte 105 (at device[0][0]"), std::string::npos)
      << e;
  EXPECT_LT(e.size(), 300u) << "the path of the deep level is cut, not printed 64 levels long";
}

TEST(JsonIn, BracketsInsideStringsDoNotCount) {
  const std::string deep_text = "\"" + std::string(1000, '[') + "\\\"" + std::string(1000, '{') + "\"";
  const nlohmann::json j = parse_json_text("{\"a\":" + deep_text + ",\"b\":" + nested(kMaxJsonDepth - 1) + "}", "doc.json");
  EXPECT_EQ(j["a"].get<std::string>().size(), 2001u);
  // A string before the deep part moves the byte the error names, not the count.
  const std::string e = error_of("[" + deep_text + "," + nested(kMaxJsonDepth) + "]");
  EXPECT_NE(e.find(fmt::format("at byte {}", 1 + deep_text.size() + 1 + kMaxJsonDepth)), std::string::npos) << e;
}

TEST(JsonIn, SyntaxErrorBeforeTheDeepPartIsTheError) {
  const std::string e = error_of("[1,,2," + nested(100000));
  EXPECT_NE(e.find("invalid JSON at byte 4"), std::string::npos) << e;
}

TEST(JsonIn, DuplicateKeyIsNamedByItsPathAtAnyDepth) {
  EXPECT_NE(error_of(R"({"a":[{"b":1},{"c":{"d":1,"d":2}}]})").find("a[1].c.d: key given twice in one object"), std::string::npos);
  // Deep inside arrays, the indices of every level.
  // 62 arrays, then one holding the object: 64 levels.
  const std::string text = std::string(kMaxJsonDepth - 2, '[') + R"([0,{"x":1,"x":2}])" + std::string(kMaxJsonDepth - 2, ']');
  std::string path;
  for (int i = 0; i < kMaxJsonDepth - 2; ++i) path += "[0]";
  EXPECT_NE(error_of(text).find(path + "[1].x: key given twice"), std::string::npos) << error_of(text);
}

TEST(JsonIn, DuplicateKeyThrownByTheLowLevelParserToo) {
  try {
    (void)parse_json_unique(R"({"op":"alloc","size":1,"size":2})");
    FAIL() << "duplicate accepted";
  } catch (const JsonDuplicateKey& e) {
    EXPECT_EQ(e.path(), "size");
  }
  try {
    (void)parse_json_unique(R"({"op":)" + nested(30000) + "}");
    FAIL() << "deep line accepted";
  } catch (const JsonTooDeep& e) {
    EXPECT_EQ(e.byte(), 6u + 64u);
  }
}

// Paths are built when asked for, from links the values share: a value read through temporaries
// keeps its path after they are gone, and every form of step renders as before.
TEST(JsonIn, APathIsBuiltWhenAskedAndOutlivesTheValuesAboveIt) {
  const nlohmann::json doc = parse_json_unique(R"({"models": [{"modules": [{"tensors": [{"shape": [3, -4]}]}]}], "": {"x": 1}})");
  const JsonIn shape = JsonIn(doc, "scenario").at("models").at(0).at("modules").at(std::size_t{0}).at("tensors").at(0).at("shape");
  EXPECT_EQ(shape.path(), "scenario.models[0].modules[0].tensors[0].shape");
  const JsonIn second = shape.at(1);  // its parent's link, made once, shared
  EXPECT_EQ(second.path(), "scenario.models[0].modules[0].tensors[0].shape[1]");
  try {
    (void)second.u64();
    FAIL() << "a negative integer was read as a size";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario.models[0].modules[0].tensors[0].shape[1]");
  }
  // From an unnamed root, the first key has no dot.
  const JsonIn root(doc, "");
  EXPECT_EQ(root.at("models").path(), "models");
  EXPECT_EQ(root.at("models").at(0).path(), "models[0]");
  const std::optional<JsonIn> x = root.at("").opt("x");
  ASSERT_TRUE(x);
  EXPECT_EQ(x->u64(), 1u);
  // A missing key is named with the path above it.
  try {
    (void)root.at("models").at(0).at("id");
    FAIL() << "a missing key was read";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "models[0].id");
  }
}

// ---- the fast path ------------------------------------------------------------------------------

// Equal documents, type for type (nlohmann's == calls 0 and 0u and 0.0 equal).
bool same_json(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.type() != b.type()) return false;
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto x = a.begin(), y = b.begin(); x != a.end(); ++x, ++y) {
      if (x.key() != y.key() || !same_json(*x, *y)) return false;
    }
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (std::size_t k = 0; k < a.size(); ++k) {
      if (!same_json(a[k], b[k])) return false;
    }
    return true;
  }
  return a == b;
}

// The same shape with the same links: each value's container and its place there (what paths are
// built from), value for value.
bool same_links(const JsonDoc& a, JsonDoc::Index x, const JsonDoc& b, JsonDoc::Index y) {
  if (a.type(x) != b.type(y) || a.slot(x) != b.slot(y) || (a.parent(x) == JsonDoc::kNoParent) != (b.parent(y) == JsonDoc::kNoParent)) {
    return false;
  }
  if (a.type(x) == JsonDoc::Type::array || a.type(x) == JsonDoc::Type::object) {
    if (a.size(x) != b.size(y)) return false;
    const bool object = a.type(x) == JsonDoc::Type::object;
    for (std::uint32_t i = 0; i < a.size(x); ++i) {
      const JsonDoc::Index u = object ? a.value(x, i) : a.element(x, i);
      const JsonDoc::Index v = object ? b.value(y, i) : b.element(y, i);
      if (object && a.key(x, i) != b.key(y, i)) return false;
      if (a.parent(u) != x || b.parent(v) != y || !same_links(a, u, b, v)) return false;
    }
  }
  return true;
}

// Whether the fast path (JsonDoc's strict parser) took `text`; where it did, its document must be
// nlohmann's value for value, and its links those of nlohmann's document converted.
bool fast_agrees(std::string_view text, bool& taken) {
  const std::shared_ptr<const JsonDoc> flat = JsonDoc::parse(text);
  taken = flat != nullptr;
  if (!taken) return true;
  nlohmann::json reference;
  try {
    reference = nlohmann::json::parse(text);
  } catch (const std::exception&) {
    return false;  // it took what nlohmann refuses
  }
  if (!same_json(flat->to_json(flat->root()), reference)) return false;
  const std::shared_ptr<const JsonDoc> converted = JsonDoc::from_json(reference);
  return same_links(*flat, flat->root(), *converted, converted->root());
}

TEST(JsonIn, TheFastPathTakesTheEdgesOfJsonAsNlohmannDoesOrLeavesThem) {
  struct Case {
    const char* text;
    bool taken;
  };
  const Case cases[] = {
      {"0", true}, {"-0", true}, {"-0.0", true}, {"1e5", true}, {"1E+5", true}, {"2.5e-3", true}, {"0e0", true},
      {"18446744073709551615", true}, {"-9223372036854775808", true}, {"9223372036854775808", true},
      {"18446744073709551616", false}, {"-9223372036854775809", false}, {"1e400", false}, {"1e-400", false},
      {"01", false}, {"1.", false}, {".5", false}, {"-", false}, {"+1", false}, {"1e", false}, {"0x10", false},
      {R"("a\"b\\c\/d\b\f\n\r\t")", true}, {R"("\u0041")", false}, {"\"caf\xc3\xa9\"", false}, {"\"a\tb\"", false},
      {"\"\x7f\"", true}, {R"("\x")", false}, {"\"open", false},
      {" {\"a\" : [1, 2.5, true, false, null, {}, []] }\r\n", true}, {R"({"a":1,"a":2})", false}, {R"({"a":1,})", false},
      {"[1,]", false}, {"[1 2]", false}, {"{\"a\"}", false}, {"", false}, {"   ", false}, {"[] []", false},
      {"\xef\xbb\xbf{}", false}, {"tru", false}, {"nulll", false}};
  for (const Case& c : cases) {
    bool taken = false;
    EXPECT_TRUE(fast_agrees(c.text, taken)) << c.text;
    EXPECT_EQ(taken, c.taken) << c.text;
  }
  bool nul = false;
  EXPECT_TRUE(fast_agrees(std::string_view("[1]\0", 4), nul));
  EXPECT_FALSE(nul);
  // Nesting: up to kMaxJsonDepth levels, not one more (parse_json_unique's error names its bracket).
  bool taken = false;
  EXPECT_TRUE(fast_agrees(nested(kMaxJsonDepth), taken));
  EXPECT_TRUE(taken);
  EXPECT_TRUE(fast_agrees(nested(kMaxJsonDepth + 1), taken));
  EXPECT_FALSE(taken);
  EXPECT_EQ(parse_json_unique(R"({"n":-0,"u":7})")["n"].type(), nlohmann::json::value_t::number_integer);
  EXPECT_EQ(parse_json_unique(R"({"n":-0,"u":7})")["u"].type(), nlohmann::json::value_t::number_unsigned);
}

// Every JSON file of the project (scenarios, repros, corpus entries, reports) is taken by the fast
// path with nlohmann's document, and so is every mutation of one that the fast path takes at all:
// whatever it is unsure of it leaves to nlohmann, whose errors are the ones users see.
TEST(JsonIn, TheFastPathsDocumentIsNlohmannsOnTheProjectsFilesAndTheirMutations) {
  std::vector<std::filesystem::path> files;
  for (const char* dir : {"fuzz/corpus", "tests/data", "examples", "adapters", "reports", "docs"}) {
    const std::filesystem::path root = std::filesystem::path(VF_SOURCE_DIR) / dir;
    if (!std::filesystem::exists(root)) continue;
    for (const auto& e : std::filesystem::recursive_directory_iterator(root)) {
      if (e.is_regular_file() && e.path().extension() == ".json" && e.file_size() < (4u << 20)) files.push_back(e.path());
    }
  }
  ASSERT_GT(files.size(), 20u);
  std::uint64_t rng = 0x5eed;
  const auto next = [&rng] {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return rng >> 33;
  };
  const std::string specials = "\"{}[],:\\-+.0123456789eE \nut\x01\x80";
  std::size_t base_taken = 0, mutated_taken = 0, mutations = 0;
  for (const auto& f : files) {
    const std::string text = read_text_file(f.string());
    bool taken = false;
    ASSERT_TRUE(fast_agrees(text, taken)) << f;
    const bool plain = text.find("\\u") == std::string::npos &&
                       std::none_of(text.begin(), text.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; });
    bool valid = true;
    try {
      (void)parse_json_text(text, f.string());
    } catch (const InputError&) {
      valid = false;  // a corpus entry that is bad input on purpose
    }
    if (plain && valid) {
      EXPECT_TRUE(taken) << f << ": the fast path left a plain valid document to nlohmann";
    }
    base_taken += taken ? 1 : 0;
    for (int m = 0; m < 60 && !text.empty(); ++m) {
      std::string t = text;
      const std::size_t at = next() % t.size();
      switch (next() % 4) {
        case 0: t[at] = specials[next() % specials.size()]; break;
        case 1: t.erase(at, 1 + next() % 8); break;
        case 2: t.insert(at, 1, specials[next() % specials.size()]); break;
        default: t.resize(at); break;
      }
      ++mutations;
      ASSERT_TRUE(fast_agrees(t, taken)) << f << " mutation " << m << " at byte " << at;
      mutated_taken += taken ? 1 : 0;
    }
  }
  EXPECT_GT(base_taken, files.size() / 2);
  EXPECT_GT(mutated_taken, 0u);
  EXPECT_LT(mutated_taken, mutations);
}

TEST(JsonIn, LongKeysAreCutInPaths) {
  const std::string key(100000, 'k');
  const std::string e = error_of("{\"" + key + "\":1,\"" + key + "\":2}");
  EXPECT_NE(e.find("...(100000 bytes): key given twice"), std::string::npos) << e.substr(0, 200);
  EXPECT_LT(e.size(), 200u);
  const nlohmann::json doc = nlohmann::json::parse("{\"" + key + "\":1}");
  try {
    JsonIn(doc, "device").expect_object({"total"});
    FAIL();
  } catch (const InputError& err) {
    EXPECT_LT(std::string(err.what()).size(), 200u);
    EXPECT_EQ(err.path().rfind("device.kkkk", 0), 0u) << err.path();
  }
}

TEST(JsonIn, MessagesQuoteValuesShortly) {
  EXPECT_EQ(json_excerpt(nlohmann::json::array({1, 2, 3})), "an array of 3 elements");
  EXPECT_EQ(json_excerpt(nlohmann::json::object({{"a", 1}})), "an object with 1 key");
  EXPECT_EQ(json_excerpt(nlohmann::json("short")), "\"short\"");
  EXPECT_EQ(json_excerpt(nlohmann::json(-4)), "-4");
  EXPECT_EQ(json_excerpt(nlohmann::json(std::string(1 << 20, 'x'))), "\"" + std::string(48, 'x') + "\"... (1048576 bytes)");
  // A cut never splits a UTF-8 sequence: no replacement character (U+FFFD) where the cut is.
  std::string accents(47, 'x');
  for (int i = 0; i < 10; ++i) accents += "\xc3\xa9";  // é: the 48-byte cut falls inside the first one
  const std::string cut = json_excerpt(nlohmann::json(accents));
  EXPECT_EQ(cut.find("\xef\xbf\xbd"), std::string::npos) << cut;
  EXPECT_EQ(cut, "\"" + std::string(47, 'x') + "\"... (67 bytes)");
  const nlohmann::json big_string = std::string(1 << 20, 'y');
  try {
    (void)JsonIn(big_string, "name").u64();
    FAIL();
  } catch (const InputError& e) {
    EXPECT_LT(std::string(e.what()).size(), 200u);
  }
}

TEST(JsonIn, ADirectoryIsNotAFile) {
  const std::string dir = std::filesystem::temp_directory_path().string();
  try {
    (void)read_text_file(dir);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), dir);
    EXPECT_NE(std::string(e.what()).find("is a directory, not a file"), std::string::npos);
  }
}


// ---- the flat document JsonIn reads -------------------------------------------------------------

TEST(JsonDoc, ReadsWhatNlohmannReadsWithTheSameTypesKeysInByteOrderAndEscapesUndone) {
  const std::string text = R"({"zeta": [1, -2, 2.5, -0, 18446744073709551615, true, null], "Alpha": "a\"b\\c\nd", "alpha": {}, "b": []})";
  const std::shared_ptr<const JsonDoc> d = JsonDoc::parse(text);
  ASSERT_TRUE(d);
  const JsonDoc::Index root = d->root();
  ASSERT_EQ(d->type(root), JsonDoc::Type::object);
  ASSERT_EQ(d->size(root), 4u);
  // Members in byte order, as nlohmann's std::map keeps them: "Alpha" < "alpha" < "b" < "zeta".
  EXPECT_EQ(d->key(root, 0), "Alpha");
  EXPECT_EQ(d->key(root, 1), "alpha");
  EXPECT_EQ(d->key(root, 2), "b");
  EXPECT_EQ(d->key(root, 3), "zeta");
  EXPECT_EQ(d->string(d->value(root, 0)), "a\"b\\c\nd");
  const JsonDoc::Index zeta = *d->find(root, "zeta");
  ASSERT_EQ(d->size(zeta), 7u);
  EXPECT_EQ(d->type(d->element(zeta, 0)), JsonDoc::Type::unsigned_integer);
  EXPECT_EQ(d->signed_value(d->element(zeta, 1)), -2);
  EXPECT_EQ(d->real(d->element(zeta, 2)), 2.5);
  EXPECT_EQ(d->type(d->element(zeta, 3)), JsonDoc::Type::signed_integer);  // -0, as nlohmann reads it
  EXPECT_EQ(d->unsigned_value(d->element(zeta, 4)), 18446744073709551615u);
  EXPECT_TRUE(d->boolean(d->element(zeta, 5)));
  EXPECT_EQ(d->type(d->element(zeta, 6)), JsonDoc::Type::null);
  EXPECT_FALSE(d->find(root, "zet"));
  // Each value knows where it sits: the fifth element of "zeta", the fourth member of the root.
  EXPECT_EQ(d->parent(d->element(zeta, 4)), zeta);
  EXPECT_EQ(d->slot(d->element(zeta, 4)), 4u);
  EXPECT_EQ(d->slot(zeta), 3u);
  EXPECT_EQ(d->parent(root), JsonDoc::kNoParent);
  EXPECT_TRUE(same_json(d->to_json(root), nlohmann::json::parse(text)));
  // An object of many keys is searched as well as one of few.
  std::string wide = "{";
  for (int i = 299; i >= 0; --i) wide += fmt::format("\"k{}\": {}{}", i, i, i == 0 ? "}" : ", ");
  const std::shared_ptr<const JsonDoc> w = JsonDoc::parse(wide);
  ASSERT_TRUE(w);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(w->unsigned_value(*w->find(w->root(), fmt::format("k{}", i))), static_cast<std::uint64_t>(i));
  EXPECT_FALSE(w->find(w->root(), "k300"));
}

TEST(JsonDoc, ParseJsonDocAcceptsAndRefusesWhatParseJsonTextDoesWithTheSameMessage) {
  // Valid text the fast parser leaves to nlohmann is read all the same (and converted).
  for (const char* text : {R"({"name": "caf\u00e9"})", "{\"name\": \"caf\xc3\xa9\"}", R"({"big": 18446744073709551616})", R"({"tiny": 1e-400})"}) {
    EXPECT_FALSE(JsonDoc::parse(text)) << text;
    const std::shared_ptr<const JsonDoc> d = parse_json_doc(text, "x.json");
    EXPECT_TRUE(same_json(d->to_json(d->root()), parse_json_text(text, "x.json"))) << text;
  }
  // Bad text: the error parse_json_text words, path and message alike.
  for (const char* text : {R"({"a": 1, "a": 2})", R"({"a": [1, 2,]})", R"({"a": 1e999})", "", R"({"models": [{"id": "x", "id": "y"}]})"}) {
    std::string want_path, want_what, got_path, got_what;
    try {
      (void)parse_json_text(text, "x.json");
      ADD_FAILURE() << "parse_json_text read " << text;
    } catch (const InputError& e) {
      want_path = e.path();
      want_what = e.what();
    }
    try {
      (void)parse_json_doc(text, "x.json");
      ADD_FAILURE() << "parse_json_doc read " << text;
    } catch (const InputError& e) {
      got_path = e.path();
      got_what = e.what();
    }
    EXPECT_EQ(got_path, want_path) << text;
    EXPECT_EQ(got_what, want_what) << text;
  }
}

// nlohmann's parser takes a NUL byte for the end of the input, so `{...}\0garbage` was read as
// `{...}`. JSON text has no NUL byte: it is the error, at its offset, whatever follows it.
TEST(JsonDoc, ANulByteIsAnErrorAtItsOffsetNotTheEndOfTheText) {
  const std::string text = std::string("{\"a\": 1}") + '\0' + "garbage";
  const std::string want = "doc.json: invalid JSON at byte 9: a NUL byte (JSON text has none; a string writes it \\u0000)";
  EXPECT_EQ(error_of(text), want);
  try {
    (void)parse_json_doc(text, "doc.json");
    ADD_FAILURE() << "read";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), want);
  }
  EXPECT_EQ(error_of(std::string("[1]") + '\0'), "doc.json: invalid JSON at byte 4: a NUL byte (JSON text has none; a string writes it \\u0000)");
  // An error before the NUL is the error.
  EXPECT_EQ(error_of(std::string("[1,]") + '\0'), error_of("[1,]"));
  // A NUL where more was expected is the NUL, not "unexpected end of input".
  EXPECT_EQ(error_of(std::string("[1") + '\0' + "]"), "doc.json: invalid JSON at byte 3: a NUL byte (JSON text has none; a string writes it \\u0000)");
  // \u0000 inside a string is JSON's own way to write one.
  EXPECT_EQ(error_of(R"({"a": "x\u0000y"})"), "");
}

// A number too large for a double is named where it stands as a number, not where its digits
// first appear (inside a string before it).
TEST(JsonDoc, ANumberOverflowIsNamedAtTheNumberNotAtAStringWithItsDigits) {
  EXPECT_EQ(error_of(R"({"name": "1e400", "seed": 1e400})"), "doc.json: invalid JSON at byte 27: number overflow parsing '1e400'");
  // Strings skipped with their escaped quotes.
  EXPECT_EQ(error_of(R"({"s": "1e400", "t": "x \" 1e400", "u": 1e400})"), "doc.json: invalid JSON at byte 40: number overflow parsing '1e400'");
}

TEST(JsonDoc, JsonInOverAParsedDocumentNamesPathsAndFieldsAsBefore) {
  const std::string text =
      R"({"models": [{"id": "a", "modules": [{"name": "m", "tensors": [{"shape": [4, -4], "dtype": "fp16"}]}]}], "zz": 1, "aa": 2})";
  const JsonIn root(parse_json_doc(text, "s.json"), "scenario");
  const JsonIn dim = root.at("models").at(0).at("modules").at(std::size_t{0}).at("tensors").at(0).at("shape").at(1);
  EXPECT_EQ(dim.path(), "scenario.models[0].modules[0].tensors[0].shape[1]");
  try {
    (void)dim.u64();
    FAIL() << "a negative dimension was read";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario.models[0].modules[0].tensors[0].shape[1]");
    EXPECT_NE(std::string(e.what()).find("must not be negative, got -4"), std::string::npos) << e.what();
  }
  // The first unknown key in byte order is the one named, as it was over nlohmann's document.
  try {
    root.expect_object({"models"});
    FAIL() << "unknown keys were accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.path(), "scenario.aa");
  }
  EXPECT_EQ(root.member_count(), 3u);
  EXPECT_EQ(root.key(0), "aa");
  EXPECT_EQ(root.member(2).u64(), 1u);
  EXPECT_EQ(root.member(2).path(), "scenario.zz");
  // A value outlives the JsonIn values above it, and the document they shared.
  std::optional<JsonIn> kept;
  {
    const JsonIn temp(parse_json_doc(R"({"a": {"b": "text\tkept"}})", "t.json"), "");
    kept = temp.at("a").at("b");
  }
  EXPECT_EQ(kept->str(), "text\tkept");
  EXPECT_EQ(kept->path(), "a.b");
  EXPECT_EQ(kept->type_name(), "string \"text\\tkept\"");
}

}  // namespace
}  // namespace vf
