// Real model files in: the safetensors and GGUF header readers, module grouping and family
// detection, the scenario's "file:" source, `fuzz --model` and `models import`. Every file is
// built here by a tiny writer (never downloaded); big models get a sparse data section (the file
// is ftruncate'd to its full size, nothing is written), which is all a header reader may touch.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "harness/choices.h"
#include "harness/core/error.h"
#include "harness/generate.h"
#include "harness/scenario.h"
#include "models/catalog.h"
#include "models/gguf.h"
#include "models/import.h"
#include "models/safetensors.h"
#include "tests/run_cli.h"

#ifndef VF_CLI
#error "VF_CLI must name the vramfuzz executable (tests/CMakeLists.txt)"
#endif

namespace vf {
namespace {

namespace fs = std::filesystem;
using Shape = std::vector<std::uint64_t>;

// ---- a tiny safetensors writer ----------------------------------------------------------------

std::uint64_t st_bits(const std::string& dtype) { return st_dtype_bits(*parse_st_dtype(dtype)); }

std::uint64_t st_size(const std::string& dtype, const Shape& shape) {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) n *= d;
  return n * st_bits(dtype) / 8;
}

struct StEntry {
  std::string name;
  std::string dtype;
  Shape shape;
};

// The header JSON with the offsets laid out in entry order (padded with spaces to 8 bytes, as
// the reference writer does); `data_len` receives the size of the data section.
std::string st_header(const std::vector<StEntry>& entries, const std::vector<std::pair<std::string, std::string>>& metadata,
                      std::uint64_t& data_len) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  std::uint64_t off = 0;
  for (const StEntry& e : entries) {
    const std::uint64_t n = st_size(e.dtype, e.shape);
    h[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {off, off + n}}};
    off += n;
  }
  data_len = off;
  std::string text = h.dump();
  while (text.size() % 8 != 0) text += ' ';
  return text;
}

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<std::size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A whole file in memory: length, header text, `data_len` zero bytes.
std::string st_image(const std::string& header, std::uint64_t data_len) {
  return le64(header.size()) + header + std::string(static_cast<std::size_t>(data_len), '\0');
}

std::span<const std::uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

StHeader parse_st(const std::string& image) { return parse_safetensors_header(bytes_of(image), image.size(), "mem.safetensors"); }

// Writes `prefix` and extends the file to `total` bytes without writing the rest (a hole).
void write_sparse(const fs::path& path, const std::string& prefix, std::uint64_t total) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, prefix.data(), prefix.size()), static_cast<ssize_t>(prefix.size()));
  ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(total)), 0);
  ::close(fd);
}

void write_st(const fs::path& path, const std::vector<StEntry>& entries,
              const std::vector<std::pair<std::string, std::string>>& metadata = {}) {
  std::uint64_t data_len = 0;
  const std::string header = st_header(entries, metadata, data_len);
  write_sparse(path, le64(header.size()) + header, 8 + header.size() + data_len);
}

// Entries for every tensor of a built model, named the way ComfyUI files name them.
std::vector<StEntry> entries_of(const ModelSpec& m, const std::string& prefix) {
  std::vector<StEntry> out;
  for (const Module& mod : m.modules) {
    for (const Tensor& t : mod.tensors) {
      const std::string name = prefix + (mod.name.empty() ? t.name : mod.name + "." + t.name);
      out.push_back({name, std::string(dtype_info(t.dtype).safetensors), t.shape});
    }
  }
  return out;
}

// ---- a tiny GGUF writer -----------------------------------------------------------------------

struct GgufBytes {
  std::string b;
  void u8(std::uint8_t v) { b += static_cast<char>(v); }
  void uint(std::uint64_t v, int width) {
    for (int i = 0; i < width; ++i) b += static_cast<char>((v >> (8 * i)) & 0xff);
  }
  void u32(std::uint32_t v) { uint(v, 4); }
  void u64(std::uint64_t v) { uint(v, 8); }
  void f32(float f) {
    std::uint32_t x = 0;
    std::memcpy(&x, &f, 4);
    u32(x);
  }
  void f64(double f) {
    std::uint64_t x = 0;
    std::memcpy(&x, &f, 8);
    u64(x);
  }
  void str(const std::string& s) {
    u64(s.size());
    b += s;
  }
  void header(std::uint32_t version, std::uint64_t tensors, std::uint64_t kvs) {
    b = "GGUF";
    u32(version);
    u64(tensors);
    u64(kvs);
  }
  void key(const std::string& k, GgufType t) {
    str(k);
    u32(static_cast<std::uint32_t>(t));
  }
  void tensor(const std::string& name, const Shape& ne, std::uint32_t type, std::uint64_t offset) {
    str(name);
    u32(static_cast<std::uint32_t>(ne.size()));
    for (std::uint64_t d : ne) u64(d);
    u32(type);
    u64(offset);
  }
  void data(std::uint64_t alignment, std::uint64_t len) {
    while (b.size() % alignment != 0) b += '\0';
    b.append(static_cast<std::size_t>(len), '\0');
  }
};

GgufHeader parse_gguf(const std::string& image) { return parse_gguf_header(bytes_of(image), image.size(), "mem.gguf"); }

// ---- expectations -----------------------------------------------------------------------------

template <typename F>
void expect_input_error(F&& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    for (const std::string& n : needles) EXPECT_NE(what.find(n), std::string::npos) << "\"" << n << "\" not in: " << what;
  }
}

// The position of the first occurrence of `needle` in `header` as a file byte (header at 8).
std::string byte_at(const std::string& header, const std::string& needle) {
  const auto pos = header.find(needle);
  EXPECT_NE(pos, std::string::npos) << needle;
  return "byte " + std::to_string(8 + pos) + ":";
}

// Same modules (as sets: forward order is checked separately), tensor for tensor.
void expect_same_modules(const ModelSpec& got, const ModelSpec& want) {
  ASSERT_EQ(got.modules.size(), want.modules.size());
  std::map<std::string, const Module*> by_name;
  for (const Module& m : want.modules) by_name[m.name] = &m;
  for (const Module& m : got.modules) {
    SCOPED_TRACE(m.name);
    const auto it = by_name.find(m.name);
    ASSERT_NE(it, by_name.end()) << "unexpected module " << m.name;
    const Module& w = *it->second;
    EXPECT_EQ(m.bytes, w.bytes);
    EXPECT_EQ(m.cast_hook, w.cast_hook);
    EXPECT_EQ(m.container, w.container);
    ASSERT_EQ(m.tensors.size(), w.tensors.size());
    for (std::size_t i = 0; i < m.tensors.size(); ++i) {
      SCOPED_TRACE(m.tensors[i].name);
      EXPECT_EQ(m.tensors[i].name, w.tensors[i].name);
      EXPECT_EQ(m.tensors[i].shape, w.tensors[i].shape);
      EXPECT_EQ(m.tensors[i].dtype, w.tensors[i].dtype);
      EXPECT_EQ(m.tensors[i].role, w.tensors[i].role);
      EXPECT_EQ(m.tensors[i].bytes, w.tensors[i].bytes);
    }
  }
  EXPECT_EQ(got.bytes, want.bytes);
  EXPECT_EQ(got.params, want.params);
}

std::size_t index_of(const ModelSpec& m, const std::string& name) {
  for (std::size_t i = 0; i < m.modules.size(); ++i) {
    if (m.modules[i].name == name) return i;
  }
  ADD_FAILURE() << "no module " << name;
  return 0;
}

// FLUX forward order: inputs, double blocks by index, single blocks by index, final layer.
void expect_flux_order(const ModelSpec& m, std::uint64_t doubles, std::uint64_t singles) {
  EXPECT_EQ(m.modules.front().name, "img_in");
  EXPECT_EQ(m.modules.back().name, "final_layer.linear");
  EXPECT_LT(index_of(m, "txt_in"), index_of(m, "double_blocks.0.img_mod.lin"));
  for (std::uint64_t i = 0; i + 1 < doubles; ++i) {
    EXPECT_LT(index_of(m, fmt::format("double_blocks.{}.img_mlp.2", i)), index_of(m, fmt::format("double_blocks.{}.img_attn.qkv", i + 1)));
  }
  EXPECT_LT(index_of(m, fmt::format("double_blocks.{}.txt_mlp.2", doubles - 1)), index_of(m, "single_blocks.0.linear1"));
  for (std::uint64_t i = 0; i + 1 < singles; ++i) {
    EXPECT_LT(index_of(m, fmt::format("single_blocks.{}.linear2", i)), index_of(m, fmt::format("single_blocks.{}.linear1", i + 1)));
  }
}

using Import = test::TempDirTest;

// ==== safetensors header ======================================================================

TEST(Safetensors, ReadsEntriesOffsetsAndMetadata) {
  std::uint64_t data_len = 0;
  const std::string header = st_header({{"a.weight", "BF16", {4, 2}}, {"a.bias", "F32", {4}}, {"s", "F32", {}}},
                                       {{"format", "pt"}, {"note", "x\"y"}}, data_len);
  const StHeader h = parse_st(st_image(header, data_len));
  EXPECT_EQ(h.header_len, header.size());
  EXPECT_EQ(h.data_start, 8 + header.size());
  ASSERT_EQ(h.tensors.size(), 3u);
  EXPECT_EQ(h.tensors[0].name, "a.weight");
  EXPECT_EQ(h.tensors[0].dtype, StDtype::BF16);
  EXPECT_EQ(h.tensors[0].shape, (Shape{4, 2}));
  EXPECT_EQ(h.tensors[0].begin, 0u);
  EXPECT_EQ(h.tensors[0].end, 16u);
  EXPECT_EQ(h.tensors[1].begin, 16u);
  EXPECT_EQ(h.tensors[1].bytes(), 16u);
  EXPECT_EQ(h.tensors[2].shape, Shape{});
  EXPECT_EQ(h.tensors[2].bytes(), 4u);
  ASSERT_EQ(h.metadata.size(), 2u);
  EXPECT_EQ(*h.find_metadata("note"), "x\"y");
  EXPECT_EQ(h.tensors[0].entry_offset, 8 + header.find("\"a.weight\""));
}

TEST(Safetensors, KnowsEveryDtypeAndMapsTheSixVramfuzzModels) {
  const std::map<std::string, std::pair<std::uint32_t, std::optional<Dtype>>> want = {
      {"BOOL", {8, {}}},          {"U8", {8, {}}},          {"I8", {8, Dtype::int8}},     {"I16", {16, {}}},
      {"U16", {16, {}}},          {"F16", {16, Dtype::fp16}}, {"BF16", {16, Dtype::bf16}}, {"I32", {32, {}}},
      {"U32", {32, {}}},          {"F32", {32, Dtype::fp32}}, {"F64", {64, {}}},           {"I64", {64, {}}},
      {"U64", {64, {}}},          {"C64", {64, {}}},          {"F8_E4M3", {8, Dtype::fp8_e4m3fn}},
      {"F8_E5M2", {8, Dtype::fp8_e5m2}}, {"F8_E8M0", {8, {}}}, {"F8_E4M3FNUZ", {8, {}}}, {"F8_E5M2FNUZ", {8, {}}},
      {"F4", {4, {}}},            {"F6_E2M3", {6, {}}},     {"F6_E3M2", {6, {}}},
  };
  ASSERT_EQ(want.size(), 22u);
  for (const auto& [name, v] : want) {
    SCOPED_TRACE(name);
    std::uint64_t data_len = 0;
    const std::string header = st_header({{"t", name, {8}}}, {}, data_len);
    const StHeader h = parse_st(st_image(header, data_len));
    ASSERT_EQ(h.tensors.size(), 1u);
    EXPECT_EQ(st_dtype_name(h.tensors[0].dtype), name);
    EXPECT_EQ(st_dtype_bits(h.tensors[0].dtype), v.first);
    EXPECT_EQ(h.tensors[0].bytes(), 8u * v.first / 8);
    EXPECT_EQ(st_dtype_to_vf(h.tensors[0].dtype), v.second);
  }
}

TEST(Safetensors, RejectsAHeaderLongerThanTheFile) {
  const std::string image = le64(1000) + "{}" + std::string(10, ' ');
  expect_input_error([&] { parse_st(image); }, {"mem.safetensors: byte 8: header length 1000 is longer than the file (20 bytes)"});
}

TEST(Safetensors, RejectsAHeaderOverTheSizeLimit) {
  const std::string image = le64(100'000'001) + "{}";
  expect_input_error([&] { parse_st(image); }, {"byte 0:", "header length 100000001 is over the 100000000-byte limit"});
}

TEST(Safetensors, RejectsAFileTooShortForTheLength) {
  expect_input_error([&] { parse_st("abc"); }, {"byte 0:", "too short for the 8-byte header length"});
}

TEST(Safetensors, RejectsInvalidJson) {
  const std::string header = R"({"a": {"dtype": "F32",, "shape": [1], "data_offsets": [0, 4]}})";
  expect_input_error([&] { parse_st(st_image(header, 4)); },
                     {"byte " + std::to_string(8 + header.find(",,") + 1) + ":", "expected a string for a member of tensor \"a\", found ','"});
  const std::string trailing = R"({} x)";
  expect_input_error([&] { parse_st(st_image(trailing, 0)); }, {byte_at(trailing, "x"), "after the header object"});
  const std::string open = R"({"a": {"dtype": "F32")";
  expect_input_error([&] { parse_st(st_image(open, 0)); }, {"byte " + std::to_string(8 + open.size()) + ":", "the header ends"});
}

TEST(Safetensors, RejectsAHeaderThatIsNotUtf8OrNotAnObject) {
  const std::string bad_utf8 = std::string("{\"a\xff\": 1}");
  expect_input_error([&] { parse_st(st_image(bad_utf8, 0)); }, {"byte 11:", "not valid UTF-8 (byte 0xff)"});
  const std::string array = "[]";
  expect_input_error([&] { parse_st(st_image(array, 0)); }, {"byte 8:", "must start with '{'"});
}

TEST(Safetensors, RejectsAnUnknownDtype) {
  const std::string header = R"({"w": {"dtype": "F9", "shape": [2], "data_offsets": [0, 2]}})";
  expect_input_error([&] { parse_st(st_image(header, 2)); }, {byte_at(header, "\"F9\""), "tensor \"w\": unknown dtype \"F9\""});
}

TEST(Safetensors, RejectsOffsetsOutOfOrder) {
  const std::string header = R"({"w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 4]}})";
  expect_input_error([&] { parse_st(st_image(header, 8)); }, {byte_at(header, "[8, 4]"), "data_offsets [8, 4] end before they begin"});
}

TEST(Safetensors, RejectsOverlappingOffsets) {
  const std::string header =
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})";
  expect_input_error([&] { parse_st(st_image(header, 12)); }, {byte_at(header, "[4, 12]"), "tensor \"b\"", "overlap tensor \"a\""});
}

TEST(Safetensors, RejectsOffsetsThatLeaveAHole) {
  const std::string header =
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "b": {"dtype": "F32", "shape": [2], "data_offsets": [12, 20]}})";
  expect_input_error([&] { parse_st(st_image(header, 20)); }, {byte_at(header, "[12, 20]"), "hole of 4 bytes", "data bytes 8..12"});
}

TEST(Safetensors, RejectsDataTheTensorsDoNotCover) {
  const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})";
  const std::string image = st_image(header, 12);
  expect_input_error([&] { parse_st(image); }, {"byte " + std::to_string(8 + header.size() + 8) + ":", "4 bytes after the last tensor"});
}

TEST(Safetensors, RejectsTensorsPastTheEndOfTheFile) {
  const std::string header = R"({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})";
  expect_input_error([&] { parse_st(st_image(header, 8)); }, {byte_at(header, "[0, 16]"), "run past the end of the file"});
}

TEST(Safetensors, RejectsAShapeProductOverflow) {
  const std::string header = R"({"a": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 0]}})";
  expect_input_error([&] { parse_st(st_image(header, 0)); }, {byte_at(header, "[4294967296"), "more elements than fit in 64 bits"});
  const std::string bytes = R"({"a": {"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 0]}})";
  expect_input_error([&] { parse_st(st_image(bytes, 0)); }, {byte_at(bytes, "[4611686018427387904"), "more bytes than fit in 64 bits"});
  const std::string big = R"({"a": {"dtype": "F32", "shape": [18446744073709551616], "data_offsets": [0, 0]}})";
  expect_input_error([&] { parse_st(st_image(big, 0)); }, {byte_at(big, "18446744073709551616"), "does not fit in 64 bits"});
}

TEST(Safetensors, RejectsASizeThatDoesNotMatchTheShape) {
  const std::string header = R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 6]}})";
  expect_input_error([&] { parse_st(st_image(header, 6)); }, {byte_at(header, "[0, 6]"), "hold 6 bytes, but shape [2] of F32 is 8 bytes"});
}

TEST(Safetensors, RejectsASubByteTensorThatEndsMidByte) {
  const std::string header = R"({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 1]}})";
  expect_input_error([&] { parse_st(st_image(header, 1)); }, {byte_at(header, "[3]"), "do not end on a byte boundary"});
}

TEST(Safetensors, RejectsDuplicateKeysAndNonStringMetadata) {
  const std::string dup = R"({"a": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]}, "a": {"dtype": "F32", "shape": [], "data_offsets": [4, 8]}})";
  expect_input_error([&] { parse_st(st_image(dup, 8)); },
                     {"byte " + std::to_string(8 + dup.find("\"a\"", 5)) + ":", "duplicate tensor name \"a\""});
  const std::string meta = R"({"__metadata__": {"n": 3}})";
  expect_input_error([&] { parse_st(st_image(meta, 0)); }, {byte_at(meta, "3}"), "values must be strings"});
  const std::string member = R"({"a": {"dtype": "F32", "dtype": "F16", "shape": [], "data_offsets": [0, 4]}})";
  expect_input_error([&] { parse_st(st_image(member, 4)); }, {"duplicate member \"dtype\""});
}

TEST(Safetensors, IndexJsonListsShardsAndRejectsBadOnes) {
  const StIndex idx = parse_safetensors_index(
      R"({"metadata": {"total_size": 24, "format": {"x": [1, 2.5e3, null]}}, "weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors"}})",
      "idx.json");
  ASSERT_EQ(idx.weight_map.size(), 2u);
  EXPECT_EQ(idx.weight_map[1].second, "m-2.safetensors");
  EXPECT_EQ(idx.total_size, 24u);
  expect_input_error([] { parse_safetensors_index(R"({"weight_map": {"a": "../x.safetensors"}})", "idx.json"); },
                     {"idx.json: byte 21:", "plain file name"});
  expect_input_error([] { parse_safetensors_index(R"({"metadata": {}})", "idx.json"); }, {"byte 0:", "no \"weight_map\""});
}

// ==== GGUF header =============================================================================

// A GGUF file with one key/value of every metadata type and tensors of several ggml types.
std::string gguf_every_type(std::uint32_t version) {
  GgufBytes g;
  g.header(version, 5, 15);
  g.key("general.architecture", GgufType::string);
  g.str("flux");
  g.key("general.alignment", GgufType::u32);
  g.u32(64);
  g.key("t.u8", GgufType::u8);
  g.u8(200);
  g.key("t.i8", GgufType::i8);
  g.u8(0xfe);  // -2
  g.key("t.u16", GgufType::u16);
  g.uint(65000, 2);
  g.key("t.i16", GgufType::i16);
  g.uint(0xfffd, 2);  // -3
  g.key("t.u32", GgufType::u32);
  g.u32(4000000000u);
  g.key("t.i32", GgufType::i32);
  g.u32(0xfffffffc);  // -4
  g.key("t.f32", GgufType::f32);
  g.f32(1.5f);
  g.key("t.bool", GgufType::boolean);
  g.u8(1);
  g.key("t.u64", GgufType::u64);
  g.u64(1ull << 40);
  g.key("t.i64", GgufType::i64);
  g.u64(static_cast<std::uint64_t>(-5));
  g.key("t.f64", GgufType::f64);
  g.f64(-2.25);
  g.key("t.strings", GgufType::array);  // array of strings
  g.u32(static_cast<std::uint32_t>(GgufType::string));
  g.u64(2);
  g.str("a");
  g.str("bc");
  g.key("t.nested", GgufType::array);  // [[1, 2], [3]] as i32
  g.u32(static_cast<std::uint32_t>(GgufType::array));
  g.u64(2);
  g.u32(static_cast<std::uint32_t>(GgufType::i32));
  g.u64(2);
  g.u32(1);
  g.u32(2);
  g.u32(static_cast<std::uint32_t>(GgufType::i32));
  g.u64(1);
  g.u32(3);
  // Tensors (ne in ggml order), each at a 64-byte aligned offset.
  g.tensor("img_in.weight", {64, 3072}, 0, 0);             // F32 [3072, 64]: 786432 B
  g.tensor("blk.q4k", {256, 3}, 12, 786432);               // Q4_K: 3 x 144 = 432 B
  g.tensor("blk.q8", {64, 2}, 8, 786432 + 448);            // Q8_0: 2 x 2 x 34 = 136 B
  g.tensor("blk.bf16", {5}, 30, 786432 + 448 + 192);       // BF16 [5]: 10 B
  g.tensor("blk.i8", {3, 1, 1, 2}, 24, 786432 + 448 + 256);  // I8 [2, 1, 1, 3]: 6 B
  g.data(64, 786432 + 448 + 256 + 6);
  return g.b;
}

void check_every_type(const GgufHeader& h, std::uint32_t version) {
  EXPECT_EQ(h.version, version);
  EXPECT_EQ(h.architecture, "flux");
  EXPECT_EQ(h.alignment, 64u);
  ASSERT_EQ(h.kvs.size(), 15u);
  EXPECT_EQ(h.find("t.u8")->value.u, 200u);
  EXPECT_EQ(h.find("t.i8")->value.i, -2);
  EXPECT_EQ(h.find("t.u16")->value.u, 65000u);
  EXPECT_EQ(h.find("t.i16")->value.i, -3);
  EXPECT_EQ(h.find("t.u32")->value.u, 4000000000u);
  EXPECT_EQ(h.find("t.i32")->value.i, -4);
  EXPECT_EQ(h.find("t.f32")->value.f, 1.5);
  EXPECT_EQ(h.find("t.bool")->value.u, 1u);
  EXPECT_EQ(h.find("t.u64")->value.u, 1ull << 40);
  EXPECT_EQ(h.find("t.i64")->value.i, -5);
  EXPECT_EQ(h.find("t.f64")->value.f, -2.25);
  const GgufValue& strings = h.find("t.strings")->value;
  ASSERT_EQ(strings.elems.size(), 2u);
  EXPECT_EQ(strings.elems[1].s, "bc");
  const GgufValue& nested = h.find("t.nested")->value;
  EXPECT_EQ(nested.elem_type, GgufType::array);
  ASSERT_EQ(nested.elems.size(), 2u);
  EXPECT_EQ(nested.elems[0].elems[1].i, 2);
  EXPECT_EQ(nested.elems[1].elems[0].i, 3);
  ASSERT_EQ(h.tensors.size(), 5u);
  EXPECT_EQ(h.tensors[0].torch_shape(), (Shape{3072, 64}));  // ggml ne reversed
  EXPECT_EQ(h.tensors[0].bytes, 786432u);
  EXPECT_EQ(h.tensors[1].dtype, Dtype::q4_k);
  EXPECT_EQ(h.tensors[1].bytes, 432u);
  EXPECT_EQ(h.tensors[2].dtype, Dtype::q8_0);
  EXPECT_EQ(h.tensors[2].bytes, 136u);
  EXPECT_EQ(h.tensors[3].dtype, Dtype::bf16);
  EXPECT_EQ(h.tensors[3].bytes, 10u);
  EXPECT_EQ(h.tensors[4].dtype, Dtype::int8);
  EXPECT_EQ(h.tensors[4].torch_shape(), (Shape{2, 1, 1, 3}));
  EXPECT_EQ(h.data_start % 64, 0u);
  EXPECT_TRUE(h.warnings.empty());
}

TEST(Gguf, V3ReadsEveryMetadataTypeAndTensorInfo) { check_every_type(parse_gguf(gguf_every_type(3)), 3); }

TEST(Gguf, V2ReadsTheSameLayout) { check_every_type(parse_gguf(gguf_every_type(2)), 2); }

TEST(Gguf, ReadsFromAFileGrowingTheRead) {
  const fs::path p = fs::temp_directory_path() / fmt::format("vf_test_gguf_{}.gguf", ::getpid());
  std::ofstream(p, std::ios::binary) << gguf_every_type(3);
  check_every_type(read_gguf_header(p.string()), 3);
  // A header bigger than the first 1 MiB read (a 3 MiB string: a tokenizer's worth).
  GgufBytes g;
  g.header(3, 1, 1);
  g.key("tokenizer.blob", GgufType::string);
  g.str(std::string(3 << 20, 'x'));
  g.tensor("w", {8}, 0, 0);
  g.data(32, 32);
  std::ofstream(p, std::ios::binary | std::ios::trunc) << g.b;
  const GgufHeader h = read_gguf_header(p.string());
  EXPECT_EQ(h.find("tokenizer.blob")->value.s.size(), std::size_t{3} << 20);
  EXPECT_EQ(h.tensors.at(0).name, "w");
  fs::remove(p);
}

// A minimal valid header before a tensor info, for the rejection tests below.
GgufBytes gguf_one_tensor_prefix(std::uint64_t tensors = 1) {
  GgufBytes g;
  g.header(3, tensors, 1);
  g.key("general.architecture", GgufType::string);
  g.str("flux");
  return g;
}

TEST(Gguf, RejectsBadMagic) {
  GgufBytes g = gguf_one_tensor_prefix(0);
  g.b[3] = 'G';
  expect_input_error([&] { parse_gguf(g.b); }, {"mem.gguf: byte 0:", "bad magic 47 47 55 47", "expected 47 47 55 46"});
}

TEST(Gguf, RejectsVersion1) {
  GgufBytes g = gguf_one_tensor_prefix(0);
  g.b[4] = 1;
  expect_input_error([&] { parse_gguf(g.b); }, {"byte 4:", "GGUF version 1 is not supported"});
}

TEST(Gguf, RejectsAByteSwappedVersion) {
  GgufBytes g = gguf_one_tensor_prefix(0);
  g.b[4] = 0;
  g.b[7] = 3;  // 0x03000000: version 3 written big-endian
  expect_input_error([&] { parse_gguf(g.b); }, {"byte 4:", "0x03000000", "byte order does not match", "version 3 byte-swapped"});
  g.b[7] = 0;
  g.b[4] = 9;
  expect_input_error([&] { parse_gguf(g.b); }, {"byte 4:", "unsupported GGUF version 9"});
}

TEST(Gguf, RejectsMoreThanFourDims) {
  GgufBytes g = gguf_one_tensor_prefix();
  const std::size_t at = g.b.size() + 8 + 1;  // name length + name, then n_dims
  g.tensor("w", {1, 1, 1, 1, 1}, 0, 0);
  g.data(32, 4);
  expect_input_error([&] { parse_gguf(g.b); }, {"byte " + std::to_string(at) + ":", "tensor \"w\": n_dims 5 is more than 4"});
}

TEST(Gguf, RejectsATypeIdOutOfRangeRetiredOrUnsupported) {
  for (const auto& [type, needle] : std::vector<std::pair<std::uint32_t, std::string>>{
           {43, "ggml type id 43 is out of range (0..42)"},
           {4, "ggml type id 4 (Q4_2) was retired"},
           {16, "ggml type IQ2_XXS (16) is not supported by vramfuzz"}}) {
    GgufBytes g = gguf_one_tensor_prefix();
    const std::size_t at = g.b.size() + 8 + 1 + 4 + 8;  // name, n_dims, one dim
    g.tensor("w", {256}, type, 0);
    g.data(32, 1024);
    expect_input_error([&] { parse_gguf(g.b); }, {"byte " + std::to_string(at) + ":", needle});
  }
}

TEST(Gguf, RejectsAKQuantRowNotAMultipleOf256) {
  GgufBytes g = gguf_one_tensor_prefix();
  const std::size_t at = g.b.size() + 8 + 1;
  g.tensor("w", {320, 4}, 12, 0);  // Q4_K with ne[0] = 320 (SD's 320-channel convs)
  g.data(32, 4096);
  expect_input_error([&] { parse_gguf(g.b); },
                     {"byte " + std::to_string(at) + ":", "Q4_K rows have ne[0] = 320 elements, not a multiple of the 256-element block"});
  GgufBytes q8 = gguf_one_tensor_prefix();
  q8.tensor("w", {48}, 8, 0);
  q8.data(32, 64);
  expect_input_error([&] { parse_gguf(q8.b); }, {"Q8_0 rows have ne[0] = 48 elements, not a multiple of the 32-element block"});
}

TEST(Gguf, RejectsATruncatedTensorInfo) {
  GgufBytes g = gguf_one_tensor_prefix();
  g.tensor("double_blocks.0.img_attn.qkv.weight", {3072, 9216}, 1, 0);
  const std::size_t at = gguf_one_tensor_prefix().b.size() + 8 + 35 + 4 + 8;  // name length, name, n_dims, ne[0]
  const std::string cut = g.b.substr(0, at + 3);  // ends inside ne[1]
  expect_input_error([&] { parse_gguf(cut); },
                     {"byte " + std::to_string(at) + ":", "truncated dimension 1 of tensor \"double_blocks.0.img_attn.qkv.weight\"",
                      "the file ends at byte " + std::to_string(cut.size())});
  const std::string no_name = g.b.substr(0, gguf_one_tensor_prefix().b.size() + 8 + 10);
  expect_input_error([&] { parse_gguf(no_name); }, {"truncated the name of tensor info 0"});
}

TEST(Gguf, RejectsATruncatedKeyValue) {
  GgufBytes g;
  g.header(3, 0, 2);
  g.key("general.architecture", GgufType::string);
  g.str("flux");
  const std::size_t second = g.b.size();
  g.key("general.name", GgufType::string);
  g.str("a long model name");
  const std::string cut = g.b.substr(0, g.b.size() - 5);
  expect_input_error([&] { parse_gguf(cut); },
                     {"byte " + std::to_string(second + 8 + 12 + 4 + 8) + ":", "truncated KV \"general.name\": it needs 17 bytes"});
  GgufBytes big;
  big.header(3, 0, 1);
  big.key("t.arr", GgufType::array);
  big.u32(static_cast<std::uint32_t>(GgufType::u64));
  big.u64(1ull << 40);
  expect_input_error([&] { parse_gguf(big.b); }, {"truncated KV \"t.arr\": 1099511627776 elements of u64"});
  GgufBytes type;
  type.header(3, 0, 1);
  type.key("t.x", static_cast<GgufType>(13));
  type.u64(0);
  expect_input_error([&] { parse_gguf(type.b); }, {"byte 35:", "value type 13 is not a GGUF type"});
}

TEST(Gguf, RejectsCountsThatCannotFit) {
  GgufBytes g;
  g.header(3, 1ull << 60, 0);
  expect_input_error([&] { parse_gguf(g.b); }, {"byte 8:", "tensor_count 1152921504606846976 cannot fit"});
  g.header(3, 0, 1ull << 60);
  expect_input_error([&] { parse_gguf(g.b); }, {"byte 16:", "kv_count 1152921504606846976 cannot fit"});
}

TEST(Gguf, RejectsBadAlignmentOffsetsAndOverflow) {
  GgufBytes a;
  a.header(3, 0, 1);
  a.key("general.alignment", GgufType::u32);
  a.u32(12);
  expect_input_error([&] { parse_gguf(a.b); }, {"general.alignment 12 must be a non-zero multiple of 8"});
  GgufBytes off = gguf_one_tensor_prefix();
  off.tensor("w", {8}, 0, 16);
  off.data(32, 64);
  expect_input_error([&] { parse_gguf(off.b); }, {"offset 16 is not a multiple of the alignment 32"});
  GgufBytes past = gguf_one_tensor_prefix();
  past.tensor("w", {64}, 0, 0);
  past.data(32, 100);
  expect_input_error([&] { parse_gguf(past.b); }, {"tensor \"w\": data [0, 256) runs past the end of the file"});
  GgufBytes over = gguf_one_tensor_prefix();
  over.tensor("w", {1ull << 32, 1ull << 32}, 0, 0);
  expect_input_error([&] { parse_gguf(over.b); }, {"the element count overflows int64 at ne[1]"});
  GgufBytes dup = gguf_one_tensor_prefix(2);
  dup.tensor("w", {8}, 0, 0);
  dup.tensor("w", {8}, 0, 32);
  dup.data(32, 64);
  expect_input_error([&] { parse_gguf(dup.b); }, {"duplicate tensor name \"w\""});
}

TEST(Gguf, WarnsAboutNamesLongerThanTheSpecAllows) {
  GgufBytes g = gguf_one_tensor_prefix();
  g.tensor(std::string(80, 'n'), {8}, 0, 0);
  g.data(32, 32);
  const GgufHeader h = parse_gguf(g.b);
  ASSERT_EQ(h.warnings.size(), 1u);
  EXPECT_NE(h.warnings[0].find("longer than the spec's 64 bytes"), std::string::npos);
}

// ==== import: grouping, order, roles, families ===============================================

TEST_F(Import, GroupsModulesInForwardOrderByteForByte) {
  const std::string p = "model.diffusion_model.";
  // Written out of order, the way a writer sorting by dtype and name would.
  write_st(dir_ / "flux.safetensors", {
                                          {p + "final_layer.linear.weight", "BF16", {64, 3072}},
                                          {p + "double_blocks.10.img_mlp.0.weight", "BF16", {12288, 3072}},
                                          {p + "double_blocks.2.img_mlp.0.weight", "BF16", {12288, 3072}},
                                          {p + "double_blocks.2.img_attn.norm.query_norm.scale", "BF16", {128}},
                                          {p + "img_in.bias", "BF16", {3072}},
                                          {p + "single_blocks.0.linear1.weight", "BF16", {21504, 3072}},
                                          {p + "time_in.in_layer.weight", "BF16", {3072, 256}},
                                          {p + "img_in.weight", "BF16", {3072, 64}},
                                          {p + "double_blocks.2.img_attn.qkv.weight", "F8_E4M3", {9216, 3072}},
                                          {p + "double_blocks.2.img_attn.qkv.scale_weight", "F32", {}},
                                          {p + "final_layer.linear.bias", "BF16", {64}},
                                      });
  const ImportedModel r = import_model_file((dir_ / "flux.safetensors").string(), {});
  const ModelSpec& m = r.model;
  EXPECT_EQ(m.name, "flux");
  EXPECT_EQ(m.family, Family::flux);
  EXPECT_EQ(m.kind, ModelKind::diffusion);
  EXPECT_EQ(r.stripped_prefix, p);
  EXPECT_EQ(r.format, "safetensors");
  EXPECT_EQ(m.source, "file:" + (dir_ / "flux.safetensors").lexically_normal().string());
  struct T {
    std::string name;
    Shape shape;
    Dtype dtype;
    TensorRole role;
    Bytes bytes;
  };
  const std::vector<std::pair<std::string, std::vector<T>>> want = {
      {"img_in", {{"weight", {3072, 64}, Dtype::bf16, TensorRole::weight, 393216}, {"bias", {3072}, Dtype::bf16, TensorRole::bias, 6144}}},
      {"time_in.in_layer", {{"weight", {3072, 256}, Dtype::bf16, TensorRole::weight, 1572864}}},
      {"double_blocks.2.img_attn.norm.query_norm", {{"scale", {128}, Dtype::bf16, TensorRole::norm, 256}}},
      {"double_blocks.2.img_attn.qkv",
       {{"weight", {9216, 3072}, Dtype::fp8_e4m3fn, TensorRole::weight, 28311552}, {"scale_weight", {}, Dtype::fp32, TensorRole::scale, 4}}},
      {"double_blocks.2.img_mlp.0", {{"weight", {12288, 3072}, Dtype::bf16, TensorRole::weight, 75497472}}},
      {"double_blocks.10.img_mlp.0", {{"weight", {12288, 3072}, Dtype::bf16, TensorRole::weight, 75497472}}},
      {"single_blocks.0.linear1", {{"weight", {21504, 3072}, Dtype::bf16, TensorRole::weight, 132120576}}},
      {"final_layer.linear", {{"weight", {64, 3072}, Dtype::bf16, TensorRole::weight, 393216}, {"bias", {64}, Dtype::bf16, TensorRole::bias, 128}}},
  };
  ASSERT_EQ(m.modules.size(), want.size());
  Bytes total = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].first);
    EXPECT_EQ(m.modules[i].name, want[i].first);
    EXPECT_TRUE(m.modules[i].cast_hook);
    ASSERT_EQ(m.modules[i].tensors.size(), want[i].second.size());
    Bytes module_bytes = 0;
    for (std::size_t k = 0; k < want[i].second.size(); ++k) {
      const Tensor& t = m.modules[i].tensors[k];
      const T& w = want[i].second[k];
      EXPECT_EQ(t.name, w.name);
      EXPECT_EQ(t.shape, w.shape);
      EXPECT_EQ(t.dtype, w.dtype);
      EXPECT_EQ(t.role, w.role);
      EXPECT_EQ(t.bytes, w.bytes);
      module_bytes += w.bytes;
    }
    EXPECT_EQ(m.modules[i].bytes, module_bytes);
    total += module_bytes;
  }
  EXPECT_EQ(m.bytes, total);
  // The catalog's FLUX.1 numbers for the activation rules.
  const auto d = family_defaults(Family::flux);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(m.memory_usage_factor, d->memory_usage_factor);
  EXPECT_EQ(m.arch.hidden, 3072u);
  EXPECT_EQ(m.arch.widest, 21504u);
  EXPECT_NE(r.quantization.find("1 scale tensor"), std::string::npos) << r.quantization;
}

TEST(ImportOrder, NaturalOrderComparesDigitRunsAsNumbers) {
  EXPECT_TRUE(natural_less("blocks.9", "blocks.10"));
  EXPECT_FALSE(natural_less("blocks.10", "blocks.9"));
  EXPECT_TRUE(natural_less("blocks.2.attn", "blocks.10.attn"));
  EXPECT_TRUE(natural_less("a.b", "a.c"));
  EXPECT_TRUE(natural_less("layer", "layer.0"));
  EXPECT_FALSE(natural_less("x", "x"));
  EXPECT_TRUE(natural_less("x.1", "x.01") != natural_less("x.01", "x.1"));  // a strict total order
}

TEST_F(Import, KeepsUnmodelledBuffersAsRawBytesAndRejectsUnmodelledWeights) {
  write_st(dir_ / "clip.safetensors", {
                                          {"text_model.embeddings.position_ids", "I64", {1, 77}},
                                          {"text_model.embeddings.token_embedding.weight", "F16", {49408, 1280}},
                                          {"text_model.encoder.layers.0.mlp.fc1.weight", "F16", {5120, 1280}},
                                          {"text_model.encoder.layers.0.layer_norm1.weight", "F16", {1280}},
                                          {"text_model.encoder.layers.0.layer_norm1.bias", "F16", {1280}},
                                          {"text_model.encoder.layers.0.mlp.fc1.bias", "F16", {5120}},
                                      });
  const ImportedModel r = import_model_file((dir_ / "clip.safetensors").string(), {});
  EXPECT_EQ(r.model.family, Family::clip);
  EXPECT_EQ(r.model.kind, ModelKind::text_encoder);
  EXPECT_EQ(r.model.arch.hidden, 1280u);  // read from the file (a CLIP-G), not CLIP-L's 768
  EXPECT_EQ(r.model.arch.widest, 5120u);
  const Module& emb = r.model.modules[0];
  ASSERT_EQ(emb.name, "text_model.embeddings");
  ASSERT_EQ(emb.tensors.size(), 1u);
  EXPECT_EQ(emb.tensors[0].name, "position_ids");
  EXPECT_EQ(emb.tensors[0].dtype, Dtype::int8);
  EXPECT_EQ(emb.tensors[0].shape, (Shape{1, 616}));  // 77 x 8 bytes
  EXPECT_EQ(emb.tensors[0].role, TensorRole::other);
  EXPECT_FALSE(emb.cast_hook);
  EXPECT_EQ(r.model.modules[1].tensors[0].role, TensorRole::embedding);
  const Module& ln = r.model.modules[index_of(r.model, "text_model.encoder.layers.0.layer_norm1")];
  EXPECT_EQ(ln.tensors[1].name, "bias");
  EXPECT_EQ(ln.tensors[1].role, TensorRole::norm);  // a norm's shift, not a Linear bias
  const Module& fc1 = r.model.modules[index_of(r.model, "text_model.encoder.layers.0.mlp.fc1")];
  EXPECT_EQ(fc1.tensors[1].role, TensorRole::bias);
  ASSERT_FALSE(r.warnings.empty());
  EXPECT_NE(r.warnings[0].find("1 I64 tensor(s)"), std::string::npos) << r.warnings[0];

  std::uint64_t data_len = 0;
  const std::string header = st_header({{"x.weight", "U8", {16, 8}}}, {}, data_len);
  write_sparse(dir_ / "nf4.safetensors", le64(header.size()) + header, 8 + header.size() + data_len);
  expect_input_error([&] { import_model_file((dir_ / "nf4.safetensors").string(), {.name = "", .family = Family::generic}); },
                     {"nf4.safetensors: byte 9:", "tensor \"x.weight\": dtype U8 cannot be modelled"});
}

// The tensor layout says which modules are containers: tensors of their own beside parameters
// below them. Their own tensors are raw (no castable op owns them), whatever their names.
TEST_F(Import, ContainersFromTheTensorLayoutHaveNoCastHook) {
  write_st(dir_ / "raw.safetensors", {
                                         {"pos_embed", "BF16", {1, 16, 64}},
                                         {"blocks.0.modulation", "BF16", {1, 6, 64}},
                                         {"blocks.0.self_attn.q.weight", "BF16", {64, 64}},
                                         {"blk.weight", "BF16", {64, 64}},
                                         {"blk.lin.weight", "BF16", {64, 64}},
                                         {"blk.lin.bias", "BF16", {64}},
                                         {"bn.running_mean", "F32", {8}},
                                         {"bn.running_var", "F32", {8}},
                                     });
  const ImportedModel r = import_model_file((dir_ / "raw.safetensors").string(), {.name = "raw", .family = Family::generic});
  const ModelSpec& m = r.model;
  const auto at = [&](const std::string& name) -> const Module& { return m.modules[index_of(m, name)]; };
  EXPECT_TRUE(at("").container);
  EXPECT_FALSE(at("").cast_hook);
  EXPECT_TRUE(at("blocks.0").container);
  EXPECT_FALSE(at("blocks.0").cast_hook);
  EXPECT_EQ(at("blocks.0").tensors[0].role, TensorRole::bias);  // Wan's modulation: a parameter
  EXPECT_TRUE(at("blk").container);
  EXPECT_FALSE(at("blk").cast_hook);  // a "weight", but beside blk.lin: not a castable op's
  EXPECT_EQ(at("blk").tensors[0].role, TensorRole::weight);
  for (const char* leaf : {"blocks.0.self_attn.q", "blk.lin"}) {
    EXPECT_FALSE(at(leaf).container) << leaf;
    EXPECT_TRUE(at(leaf).cast_hook) << leaf;
  }
  // BatchNorm running statistics: a leaf of buffers, no cast hook, not a container.
  EXPECT_FALSE(at("bn").container);
  EXPECT_FALSE(at("bn").cast_hook);
  EXPECT_FALSE(owns_parameters(at("bn")));
  // As an inline fragment, the model reads back the same.
  Catalog catalog;
  const std::string doc = fmt::format(
      R"({{"device": {{"total": "8GiB"}}, "allocator": "raw", "policy": "comfy:dec2025", "models": [{}]}})",
      model_fragment_json(m, "raw"));
  const Scenario s = parse_scenario_json(doc, catalog, "fragment.json");
  expect_same_modules(*s.models[0].spec, m);
}

TEST_F(Import, AsksForTheFamilyWhenTheNamesCannotTell) {
  write_st(dir_ / "odd.safetensors", {{"foo.proj.weight", "F16", {64, 64}}, {"foo.proj.bias", "F16", {64}}});
  expect_input_error([&] { import_model_file((dir_ / "odd.safetensors").string(), {}); },
                     {"odd.safetensors: cannot tell the model family", "--family", "\"family\""});
  const ImportedModel r = import_model_file((dir_ / "odd.safetensors").string(), {.name = "odd", .family = Family::generic});
  EXPECT_EQ(r.model.family, Family::generic);
  EXPECT_EQ(r.model.modules.size(), 1u);
  // A FLUX layout at a width the catalog does not know is not guessed either.
  write_st(dir_ / "small-flux.safetensors",
           {{"img_in.weight", "BF16", {1024, 64}}, {"double_blocks.0.x.weight", "BF16", {8, 8}}, {"single_blocks.0.y.weight", "BF16", {8, 8}}});
  expect_input_error([&] { import_model_file((dir_ / "small-flux.safetensors").string(), {}); }, {"hidden 1024", "--family"});
}

TEST_F(Import, OrdersEachFamilyInputsBlocksOutputs) {
  // SDXL in the LDM layout ComfyUI saves: time_embed, label_emb, input/middle/output blocks, out.
  write_st(dir_ / "sdxl.safetensors", {
                                          {"out.2.weight", "F16", {4, 320, 3, 3}},
                                          {"output_blocks.0.0.in_layers.2.weight", "F16", {1280, 2560, 3, 3}},
                                          {"middle_block.1.proj_in.weight", "F16", {1280, 1280}},
                                          {"input_blocks.10.0.in_layers.2.weight", "F16", {1280, 1280, 3, 3}},
                                          {"input_blocks.4.1.transformer_blocks.0.attn2.to_k.weight", "F16", {640, 2048}},
                                          {"label_emb.0.0.weight", "F16", {1280, 2816}},
                                          {"time_embed.0.weight", "F16", {1280, 320}},
                                          {"input_blocks.0.0.weight", "F16", {320, 4, 3, 3}},
                                      });
  const ImportedModel r = import_model_file((dir_ / "sdxl.safetensors").string(), {});
  EXPECT_EQ(r.model.family, Family::sdxl);
  std::vector<std::string> order;
  for (const Module& m : r.model.modules) order.push_back(m.name);
  EXPECT_EQ(order, (std::vector<std::string>{"time_embed.0", "label_emb.0.0", "input_blocks.0.0",
                                             "input_blocks.4.1.transformer_blocks.0.attn2.to_k", "input_blocks.10.0.in_layers.2",
                                             "middle_block.1.proj_in", "output_blocks.0.0.in_layers.2", "out.2"}));
  // The BFL VAE decoder runs its levels from 3 down to 0.
  const ModelSpec vae = build_catalog_model("flux-vae", {Dtype::fp32, true}, "test");
  write_st(dir_ / "ae.safetensors", entries_of(vae, ""));
  const ImportedModel v = import_model_file((dir_ / "ae.safetensors").string(), {});
  EXPECT_EQ(v.model.family, Family::vae_kl);
  EXPECT_EQ(v.model.arch.latent_channels, 16u);
  expect_same_modules(v.model, vae);
  EXPECT_LT(index_of(v.model, "decoder.up.3.block.0.conv1"), index_of(v.model, "decoder.up.2.block.0.conv1"));
  EXPECT_LT(index_of(v.model, "decoder.mid.block_2.conv2"), index_of(v.model, "decoder.up.3.block.0.conv1"));
  EXPECT_EQ(v.model.modules.back().name, "decoder.conv_out");
}

TEST_F(Import, EveryCatalogModelImportsBackToItself) {
  // Names and shapes from the catalog's generators, one file per model (sparse): the importer must
  // find each family and rebuild every module. The FLUX.2 text encoder stands for Mistral.
  for (const CatalogEntry& e : catalog_entries()) {
    SCOPED_TRACE(std::string(e.name));
    const ModelSpec want = build_catalog_model(e.name, {e.native_dtype, true}, "test");
    const fs::path file = dir_ / fmt::format("{}.safetensors", e.name);
    write_st(file, entries_of(want, ""));
    const ImportedModel r = import_model_file(file.string(), {});
    EXPECT_EQ(r.model.family, e.family) << r.family_reason;
    EXPECT_EQ(r.model.kind, e.kind);
    EXPECT_EQ(r.model.memory_usage_factor, want.memory_usage_factor);
    EXPECT_EQ(r.model.arch.hidden, want.arch.hidden);
    EXPECT_EQ(r.model.arch.widest, want.arch.widest);
    EXPECT_EQ(r.model.arch.latent_channels, want.arch.latent_channels);
    expect_same_modules(r.model, want);
    fs::remove(file);
  }
}

// ==== the FLUX.1 check ========================================================================

TEST_F(Import, Flux1DevCheckpointMatchesTheCatalogExactly) {
  const ModelSpec want = build_catalog_model("flux1-dev", {Dtype::bf16, true}, "test");
  const fs::path file = dir_ / "flux1-dev.safetensors";
  std::uint64_t data_len = 0;
  const std::string header = st_header(entries_of(want, "model.diffusion_model."), {{"format", "pt"}}, data_len);
  EXPECT_EQ(data_len, want.bytes);
  EXPECT_GT(data_len, 23'800'000'000u);  // 23.8 GB of bf16, never written
  write_sparse(file, le64(header.size()) + header, 8 + header.size() + data_len);
  ASSERT_EQ(fs::file_size(file), 8 + header.size() + data_len);

  const ImportedModel r = import_model_file(file.string(), {});
  EXPECT_EQ(r.model.family, Family::flux);
  EXPECT_EQ(r.model.params, 11'901'408'320u);
  expect_same_modules(r.model, want);
  expect_flux_order(r.model, 19, 38);
  EXPECT_EQ(r.model.memory_usage_factor, want.memory_usage_factor);
  EXPECT_EQ(r.model.arch.widest, want.arch.widest);
  EXPECT_EQ(r.model.arch.text_tokens, want.arch.text_tokens);
  EXPECT_TRUE(r.warnings.empty());
}

// ==== both scaled-fp8 conventions =============================================================

TEST_F(Import, LegacyScaledFp8MarkerAndScaleWeights) {
  const ModelSpec want = build_catalog_model("flux1-dev", {Dtype::fp8_e4m3fn, true}, "test");
  std::vector<StEntry> entries = entries_of(want, "model.diffusion_model.");
  entries.push_back({"model.diffusion_model.scaled_fp8", "F8_E4M3", {}});
  write_st(dir_ / "flux1-dev-fp8.safetensors", entries);
  const ImportedModel r = import_model_file((dir_ / "flux1-dev-fp8.safetensors").string(), {});
  expect_same_modules(r.model, want);  // the marker is read, not kept; every scale_weight is a scale
  EXPECT_EQ(r.model.family, Family::flux);
  EXPECT_NE(r.quantization.find("scaled_fp8 marker (F8_E4M3)"), std::string::npos) << r.quantization;
  std::size_t quantized = 0;
  for (const Module& m : want.modules) quantized += m.tensors.front().dtype == Dtype::fp8_e4m3fn ? 1 : 0;
  EXPECT_EQ(quantized, 314u);  // every Linear of FLUX.1
  EXPECT_NE(r.quantization.find("314 scaled module(s)"), std::string::npos) << r.quantization;
  const Module& qkv = r.model.modules[index_of(r.model, "double_blocks.0.img_attn.qkv")];
  ASSERT_EQ(qkv.tensors.size(), 3u);
  EXPECT_EQ(qkv.tensors[1].name, "scale_weight");
  EXPECT_EQ(qkv.tensors[1].role, TensorRole::scale);
}

TEST_F(Import, QuantizationMetadataWithInt8BlockwiseWeightScales) {
  const ModelSpec want = build_catalog_model("flux1-dev", {Dtype::int8, true}, "test");
  nlohmann::ordered_json layers = nlohmann::ordered_json::object();
  for (const Module& m : want.modules) {
    if (m.tensors.front().dtype == Dtype::int8) layers["model.diffusion_model." + m.name] = {{"format", "int8_blockwise"}, {"group_size", 128}};
  }
  const std::string qm = nlohmann::ordered_json{{"format_version", "1.0"}, {"layers", layers}}.dump();
  write_st(dir_ / "flux1-dev-int8.safetensors", entries_of(want, "model.diffusion_model."), {{"_quantization_metadata", qm}});
  const ImportedModel r = import_model_file((dir_ / "flux1-dev-int8.safetensors").string(), {});
  expect_same_modules(r.model, want);
  EXPECT_EQ(layers.size(), 314u);
  EXPECT_NE(r.quantization.find("_quantization_metadata: 314 layer(s) (int8_blockwise 314)"), std::string::npos) << r.quantization;
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
  const Module& l1 = r.model.modules[index_of(r.model, "single_blocks.0.linear1")];
  EXPECT_EQ(l1.tensors[1].name, "weight_scale");
  EXPECT_EQ(l1.tensors[1].shape, (Shape{168, 24}));  // ceil(21504/128) x ceil(3072/128)

  // The fp8 flavour of the same convention, and a broken metadata string.
  write_st(dir_ / "bad-qm.safetensors", {{"a.weight", "F8_E4M3", {4, 4}}, {"a.weight_scale", "F32", {}}},
           {{"_quantization_metadata", "{\"layers\": [1"}});
  std::uint64_t len = 0;
  const std::string header = st_header({{"a.weight", "F8_E4M3", {4, 4}}, {"a.weight_scale", "F32", {}}},
                                       {{"_quantization_metadata", "{\"layers\": [1"}}, len);
  expect_input_error([&] { import_model_file((dir_ / "bad-qm.safetensors").string(), {.name = "", .family = Family::generic}); },
                     {byte_at(header, "\"{\\\"layers"), "_quantization_metadata is not valid JSON"});
  write_st(dir_ / "fp8-qm.safetensors", {{"a.weight", "F8_E4M3", {4, 4}}, {"a.weight_scale", "F32", {}}},
           {{"_quantization_metadata", R"({"format_version": "1.0", "layers": {"a": {"format": "float8_e4m3fn"}}})"}});
  const ImportedModel f = import_model_file((dir_ / "fp8-qm.safetensors").string(), {.name = "", .family = Family::generic});
  EXPECT_NE(f.quantization.find("float8_e4m3fn 1"), std::string::npos);
  EXPECT_EQ(f.model.modules[0].tensors[1].role, TensorRole::scale);
  // A layer's format given twice: which one the file means is unknowable, so it is an error
  // naming the key (a JSON parser would keep the last one), and so is a number beyond a double.
  const std::string dup_qm = R"({"layers": {"a": {"format": "float8_e4m3fn", "format": "int8_blockwise"}}})";
  write_st(dir_ / "dup-qm.safetensors", {{"a.weight", "F8_E4M3", {4, 4}}, {"a.weight_scale", "F32", {}}},
           {{"_quantization_metadata", dup_qm}});
  const std::string dup_header = st_header({{"a.weight", "F8_E4M3", {4, 4}}, {"a.weight_scale", "F32", {}}},
                                           {{"_quantization_metadata", dup_qm}}, len);
  expect_input_error([&] { import_model_file((dir_ / "dup-qm.safetensors").string(), {.name = "", .family = Family::generic}); },
                     {byte_at(dup_header, "\"{\\\"layers"), "_quantization_metadata: layers.a.format: key given twice"});
  write_st(dir_ / "huge-qm.safetensors", {{"a.weight", "F8_E4M3", {4, 4}}, {"a.weight_scale", "F32", {}}},
           {{"_quantization_metadata", R"({"format_version": 1e999})"}});
  expect_input_error([&] { import_model_file((dir_ / "huge-qm.safetensors").string(), {.name = "", .family = Family::generic}); },
                     {"_quantization_metadata is not valid JSON"});
}

// ==== sharded checkpoints =====================================================================

TEST_F(Import, ShardedCheckpointThroughTheIndex) {
  const ModelSpec want = build_catalog_model("t5xxl", {Dtype::fp16, true}, "test");
  const std::vector<StEntry> all = entries_of(want, "");
  const std::size_t half = all.size() / 2;
  const std::vector<StEntry> a(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(half));
  const std::vector<StEntry> b(all.begin() + static_cast<std::ptrdiff_t>(half), all.end());
  write_st(dir_ / "model-00001-of-00002.safetensors", a);
  write_st(dir_ / "model-00002-of-00002.safetensors", b);
  nlohmann::ordered_json map = nlohmann::ordered_json::object();
  for (const StEntry& e : a) map[e.name] = "model-00001-of-00002.safetensors";
  for (const StEntry& e : b) map[e.name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir_ / "model.safetensors.index.json") << nlohmann::ordered_json{{"metadata", {{"total_size", want.bytes}}}, {"weight_map", map}}.dump(1);
  const ImportedModel r = import_model_file((dir_ / "model.safetensors.index.json").string(), {});
  EXPECT_EQ(r.model.name, "model");
  EXPECT_EQ(r.model.family, Family::t5);
  EXPECT_NE(r.format.find("sharded: 2 file(s)"), std::string::npos) << r.format;
  expect_same_modules(r.model, want);
  EXPECT_TRUE(r.warnings.empty()) << r.warnings.front();
  EXPECT_EQ(r.model.modules.front().name, "shared");
  EXPECT_EQ(r.model.modules.back().name, "encoder.final_layer_norm");

  // The same shards given one by one on the command line.
  const std::string shards[] = {(dir_ / "model-00001-of-00002.safetensors").string(), (dir_ / "model-00002-of-00002.safetensors").string()};
  expect_same_modules(import_model_files(shards, {}).model, want);

  // weight_map pointing at a shard that lacks the tensor.
  map["encoder.block.0.layer.0.SelfAttention.q.weight"] = "model-00002-of-00002.safetensors";
  std::ofstream(dir_ / "bad.safetensors.index.json") << nlohmann::ordered_json{{"weight_map", map}}.dump();
  expect_input_error([&] { import_model_file((dir_ / "bad.safetensors.index.json").string(), {}); },
                     {"bad.safetensors.index.json: byte ", "weight_map puts tensor \"encoder.block.0.layer.0.SelfAttention.q.weight\" in model-00002-of-00002.safetensors"});
  // The same tensor in two shards.
  write_st(dir_ / "dup.safetensors", {a.front()});
  const std::string dup[] = {(dir_ / "model-00001-of-00002.safetensors").string(), (dir_ / "dup.safetensors").string()};
  expect_input_error([&] { import_model_files(dup, {}); }, {"dup.safetensors: byte 9:", "tensor \"shared.weight\" is also in"});
}

// ==== GGUF import =============================================================================

TEST_F(Import, GgufImportReversesDimsAndRestoresOriginalShapes) {
  GgufBytes g;
  g.header(3, 4, 2);
  g.key("general.architecture", GgufType::string);
  g.str("flux");
  g.key("comfy.gguf.orig_shape.patch.weight", GgufType::array);
  g.u32(static_cast<std::uint32_t>(GgufType::i32));
  g.u64(5);
  for (std::uint32_t d : {3u, 2u, 1u, 2u, 2u}) g.u32(d);
  g.tensor("img_in.weight", {64, 3072}, 0, 0);                         // F32 [3072, 64]
  g.tensor("double_blocks.0.img_attn.qkv.weight", {3072, 9216}, 12, 786432);  // Q4_K [9216, 3072]
  g.tensor("single_blocks.0.norm.query_norm.scale", {128}, 0, 786432 + 15925248);
  g.tensor("patch.weight", {4, 6}, 1, 786432 + 15925248 + 512);          // F16, stored 2-D, 5-D in PyTorch
  g.data(32, 786432 + 15925248 + 512 + 48);
  std::ofstream(dir_ / "flux-Q4_K.gguf", std::ios::binary) << g.b;
  const ImportedModel r = import_model_file((dir_ / "flux-Q4_K.gguf").string(), {});
  EXPECT_EQ(r.format, "gguf v3");
  EXPECT_EQ(r.model.family, Family::flux);
  const Module& qkv = r.model.modules[index_of(r.model, "double_blocks.0.img_attn.qkv")];
  EXPECT_EQ(qkv.tensors[0].shape, (Shape{9216, 3072}));
  EXPECT_EQ(qkv.tensors[0].dtype, Dtype::q4_k);
  EXPECT_EQ(qkv.tensors[0].bytes, 9216u * 12 * 144);
  const Module& patch = r.model.modules[index_of(r.model, "patch")];
  EXPECT_EQ(patch.tensors[0].shape, (Shape{3, 2, 1, 2, 2}));
  EXPECT_EQ(patch.tensors[0].bytes, 48u);
  EXPECT_EQ(r.model.modules.front().name, "img_in");

  // general.architecture decides when the names cannot.
  GgufBytes h;
  h.header(2, 1, 1);
  h.key("general.architecture", GgufType::string);
  h.str("sd3");
  h.tensor("foo.weight", {8, 8}, 0, 0);
  h.data(32, 256);
  std::ofstream(dir_ / "x.gguf", std::ios::binary) << h.b;
  const ImportedModel x = import_model_file((dir_ / "x.gguf").string(), {});
  EXPECT_EQ(x.model.family, Family::sd3);
  EXPECT_EQ(x.format, "gguf v2");
  EXPECT_NE(x.family_reason.find("general.architecture"), std::string::npos);
}

// ==== scenarios, the fragment, the generator ==================================================

std::string scenario_with(const std::string& model_json) {
  return R"({"schema": "vramfuzz.scenario/1", "device": {"total": "24GiB"}, "models": [)" + model_json + "]}";
}

TEST_F(Import, ScenarioFileSourceIsResolvedAgainstTheScenarioDirectory) {
  fs::create_directories(dir_ / "models");
  write_st(dir_ / "models" / "clip.safetensors",
           entries_of(build_catalog_model("clip-l", {Dtype::fp16, true}, "test"), "text_encoders.clip_l.transformer."));
  std::ofstream(dir_ / "s.json") << scenario_with(R"({"source": "file:models/clip.safetensors", "compute": "fp16"})");
  Catalog catalog;
  const Scenario s = load_scenario_file((dir_ / "s.json").string(), catalog);
  ASSERT_EQ(s.models.size(), 1u);
  EXPECT_EQ(s.models[0].id, "clip");
  EXPECT_EQ(s.models[0].source, "file:" + (dir_ / "models" / "clip.safetensors").lexically_normal().string());
  EXPECT_EQ(s.models[0].spec->family, Family::clip);
  expect_same_modules(*s.models[0].spec, build_catalog_model("clip-l", {Dtype::fp16, true}, "test"));

  // scenario_to_json keeps the file source (resolved), and it loads back the same from anywhere.
  const std::string text = scenario_to_json(s);
  const nlohmann::json j = nlohmann::json::parse(text);
  EXPECT_EQ(j["models"][0]["source"], s.models[0].source);
  EXPECT_EQ(j["models"][0]["family"], "clip");
  EXPECT_FALSE(j["models"][0].contains("storage"));
  const Scenario again = parse_scenario_json(text, catalog, "/elsewhere/roundtrip.json");
  EXPECT_EQ(again.models[0].spec->bytes, s.models[0].spec->bytes);
  EXPECT_EQ(scenario_to_json(again), text);
}

TEST_F(Import, ScenarioFileSourceErrorsKeepTheFieldPath) {
  std::ofstream(dir_ / "bad.safetensors", std::ios::binary) << le64(5000) << "{}";
  Catalog catalog;
  std::ofstream(dir_ / "a.json") << scenario_with(R"({"source": "file:bad.safetensors"})");
  expect_input_error([&] { load_scenario_file((dir_ / "a.json").string(), catalog); },
                     {"models[0].source: ", "bad.safetensors: byte 8: header length 5000 is longer than the file (10 bytes)"});
  std::ofstream(dir_ / "b.json") << scenario_with(R"({"source": "file:bad.safetensors", "storage": "fp8"})");
  expect_input_error([&] { load_scenario_file((dir_ / "b.json").string(), catalog); }, {"models[0].storage", "not allowed with a file model"});
  std::ofstream(dir_ / "c.json") << scenario_with(R"({"source": "file:missing.safetensors"})");
  expect_input_error([&] { load_scenario_file((dir_ / "c.json").string(), catalog); }, {"models[0].source: ", "missing.safetensors", "cannot open"});
  // "family" is the scenario's --family.
  write_st(dir_ / "odd.safetensors", {{"foo.weight", "F16", {8, 8}}});
  std::ofstream(dir_ / "d.json") << scenario_with(R"({"source": "file:odd.safetensors"})");
  expect_input_error([&] { load_scenario_file((dir_ / "d.json").string(), catalog); }, {"models[0].source: ", "--family"});
  std::ofstream(dir_ / "e.json") << scenario_with(R"({"source": "file:odd.safetensors", "family": "generic"})");
  EXPECT_EQ(load_scenario_file((dir_ / "e.json").string(), catalog).models[0].spec->family, Family::generic);
}

TEST_F(Import, FragmentLoadsBackAsTheSameModel) {
  const ModelSpec want = build_catalog_model("wan21-14b", {Dtype::bf16, true}, "test");
  write_st(dir_ / "wan.safetensors", entries_of(want, "model.diffusion_model."));
  const ImportedModel r = import_model_file((dir_ / "wan.safetensors").string(), {.name = "wan", .family = std::nullopt});
  expect_same_modules(r.model, want);  // raw `modulation` parameters included (no cast hook)
  const std::string fragment = model_fragment_json(r.model, "dit");
  const nlohmann::json f = nlohmann::json::parse(fragment);
  EXPECT_EQ(f["id"], "dit");
  EXPECT_EQ(f["family"], "wan21");
  Catalog catalog;
  const Scenario s = parse_scenario_json(scenario_with(fragment), catalog, "fragment.json");
  const ModelSpec& back = *s.models[0].spec;
  EXPECT_EQ(s.models[0].id, "dit");
  EXPECT_EQ(back.family, Family::wan21);
  EXPECT_EQ(back.memory_usage_factor, r.model.memory_usage_factor);
  EXPECT_EQ(back.arch.temporal_down, 4u);
  ASSERT_EQ(back.modules.size(), r.model.modules.size());
  for (std::size_t i = 0; i < back.modules.size(); ++i) {
    EXPECT_EQ(back.modules[i].name, r.model.modules[i].name);  // the same order
    EXPECT_EQ(back.modules[i].bytes, r.model.modules[i].bytes);
    EXPECT_EQ(back.modules[i].cast_hook, r.model.modules[i].cast_hook);
  }
  EXPECT_EQ(back.bytes, want.bytes);
}

TEST_F(Import, GeneratorFuzzesAroundTheImportedModel) {
  write_st(dir_ / "sd15.safetensors", entries_of(build_catalog_model("sd15-unet", {Dtype::fp16, true}, "test"), "model.diffusion_model."));
  ImportedModel r = import_model_file((dir_ / "sd15.safetensors").string(), {});
  GenConfig cfg;
  cfg.model = std::make_shared<const ModelSpec>(std::move(r.model));
  Catalog catalog;
  std::set<AllocatorMode> modes;
  std::set<Bytes> devices;
  for (std::uint64_t seed = 1; seed <= 60; ++seed) {
    PrngChoices c(seed);
    const Scenario s = generate_scenario(c, cfg, catalog);
    ASSERT_EQ(s.models.size(), 1u);
    EXPECT_EQ(s.models[0].spec, cfg.model);
    EXPECT_EQ(s.models[0].source, cfg.model->source);
    modes.insert(s.allocator.mode);
    devices.insert(s.device.total);
    // A finding written from it replays: its JSON loads the same model back from the file.
    if (seed == 1) {
      const Scenario again = parse_scenario_json(scenario_to_json(s), catalog, "finding.json");
      EXPECT_EQ(again.models[0].spec->bytes, cfg.model->bytes);
    }
  }
  EXPECT_EQ(modes.size(), 4u);
  EXPECT_GT(devices.size(), 3u);
}

// ==== the command line ========================================================================

TEST_F(Import, CliImportPrintsTheModelAndWritesTheFragment) {
  write_st(dir_ / "ae.safetensors", entries_of(build_catalog_model("flux2-vae", {Dtype::fp32, true}, "test"), ""));
  const test::Proc p = test::run_process(VF_CLI, {"models", "import", "ae.safetensors", "--family", "vae_kl", "--out", "ae.json"}, dir_);
  test::expect_clean(p);
  ASSERT_EQ(p.exit_code, 0) << test::describe(p);
  EXPECT_NE(p.out.find("family vae_kl"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("bytes by dtype:"), std::string::npos) << p.out;
  EXPECT_NE(p.out.find("largest modules:"), std::string::npos) << p.out;
  // The BatchNorm's running statistics: 2 x 128 fp32 buffers.
  EXPECT_NE(p.out.find("without a cast hook: 1 module, 1024 B (1 leaf of buffers only)\n"), std::string::npos) << p.out;
  ASSERT_TRUE(fs::exists(dir_ / "ae.json"));
  Catalog catalog;
  std::ifstream in(dir_ / "ae.json");
  const std::string fragment((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const Scenario s = parse_scenario_json(scenario_with(fragment), catalog, "ae.json");
  EXPECT_EQ(s.models[0].spec->arch.latent_channels, 32u);  // FLUX.2's VAE, read from the file
}

TEST_F(Import, CliImportOfABadFileExits2WithTheByteOffset) {
  std::ofstream(dir_ / "bad.safetensors", std::ios::binary) << le64(1234) << "{}";
  const test::Proc p = test::run_process(VF_CLI, {"models", "import", "bad.safetensors"}, dir_);
  test::expect_clean(p);
  EXPECT_EQ(p.exit_code, 2) << test::describe(p);
  EXPECT_NE(p.err.find("bad.safetensors: byte 8: header length 1234 is longer than the file (10 bytes)"), std::string::npos)
      << test::describe(p);
  EXPECT_EQ(p.out, "");
  GgufBytes g;
  g.header(1, 0, 0);
  std::ofstream(dir_ / "old.gguf", std::ios::binary) << g.b;
  const test::Proc q = test::run_process(VF_CLI, {"models", "import", "old.gguf"}, dir_);
  EXPECT_EQ(q.exit_code, 2) << test::describe(q);
  EXPECT_NE(q.err.find("old.gguf: byte 4: GGUF version 1 is not supported"), std::string::npos) << test::describe(q);
  const test::Proc f = test::run_process(VF_CLI, {"fuzz", "--model", "bad.safetensors", "--cases", "1"}, dir_);
  EXPECT_EQ(f.exit_code, 2) << test::describe(f);
  EXPECT_NE(f.err.find("byte 8:"), std::string::npos) << test::describe(f);
}

TEST_F(Import, CliFuzzAroundAModelFile) {
  write_st(dir_ / "clip.safetensors", entries_of(build_catalog_model("clip-l", {Dtype::fp16, true}, "test"), ""));
  const test::Proc p = test::run_process(VF_CLI, {"fuzz", "--model", "clip.safetensors", "--cases", "20", "--seed", "3", "--backend", "sim"}, dir_, 120);
  test::expect_clean(p);
  EXPECT_TRUE(p.exit_code == 0 || p.exit_code == 1) << test::describe(p);
  EXPECT_NE(p.out.find("fuzz: 20 cases"), std::string::npos) << test::describe(p);
}

// ==== fuzz regressions (the inputs are in fuzz/corpus/) ========================================

TEST(FuzzRegressions, ANumberTooLargeForADoubleIsBadInputAtItsByte) {
  // fuzz_scenario_json: nlohmann's out_of_range (406) escaped parse_json_text, which caught only
  // parse_error (regress-number-overflow.json).
  Catalog catalog;
  const std::string text = R"({"device": {"total": 1e999}})";
  expect_input_error([&] { parse_scenario_json(text, catalog, "big.json"); }, {"big.json: invalid JSON at byte 22:", "number overflow"});
}

}  // namespace
}  // namespace vf
