#include "models/gguf.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <numeric>
#include <set>

#include <fmt/format.h>

#include "harness/core/error.h"
#include "models/file_read.h"

namespace vf {
namespace {

// ggml type ids and names (ggml.h's append-only enum). Empty names are the retired ids, whose
// support was removed from GGUF files.
constexpr std::array<std::string_view, kGgufTypeCount> kGgmlTypeNames = {
    "F32",     "F16",     "Q4_0",  "Q4_1",  "",       "",        "Q5_0",    "Q5_1",   "Q8_0",  "Q8_1",   "Q2_K",
    "Q3_K",    "Q4_K",    "Q5_K",  "Q6_K",  "Q8_K",   "IQ2_XXS", "IQ2_XS",  "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
    "IQ2_S",   "IQ4_XS",  "I8",    "I16",   "I32",    "I64",     "F64",     "IQ1_M",  "BF16",  "",       "",
    "",        "TQ1_0",   "TQ2_0", "",      "",       "",        "MXFP4",   "NVFP4",  "Q1_0",  "Q2_0",
};
// What the retired ids were, for the message.
std::string_view retired_name(std::uint32_t id) {
  switch (id) {
    case 4: return "Q4_2";
    case 5: return "Q4_3";
    case 31: return "Q4_0_4_4";
    case 32: return "Q4_0_4_8";
    case 33: return "Q4_0_8_8";
    case 36: return "IQ4_NL_4_4";
    case 37: return "IQ4_NL_4_8";
    case 38: return "IQ4_NL_8_8";
    default: return "";
  }
}

std::optional<Dtype> vf_dtype_of_ggml(std::uint32_t id) {
  for (int d = 0; d < kDtypeCount; ++d) {
    const DtypeInfo& i = dtype_info(static_cast<Dtype>(d));
    if (i.ggml_type >= 0 && static_cast<std::uint32_t>(i.ggml_type) == id) return i.dtype;
  }
  return std::nullopt;
}

std::string supported_ggml_list() {
  std::string out;
  for (std::uint32_t id = 0; id < kGgufTypeCount; ++id) {
    if (!vf_dtype_of_ggml(id)) continue;
    if (!out.empty()) out += ", ";
    out += kGgmlTypeNames[id];
  }
  return out;
}

// Smallest encoding of one value of each type: what an array of `count` elements needs at least.
std::uint64_t min_value_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean: return 1;
    case GgufType::u16:
    case GgufType::i16: return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32: return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
    case GgufType::string: return 8;  // the length
    case GgufType::array: return 12;  // element type + count
  }
  return 1;
}

// The fixed size of a scalar type (0 for string / array).
std::uint64_t fixed_size(GgufType t) {
  return t == GgufType::string || t == GgufType::array ? 0 : min_value_size(t);
}

// Thrown when the header runs past the bytes read so far but not past the file: the file reader
// reads more and parses again.
struct NeedMore {
  std::uint64_t bytes;
};

// The smallest tensor info (empty name, no dims) and key/value (empty key is refused, so one
// byte of key, a type, a one-byte value).
constexpr std::uint64_t kMinTensorInfo = 8 + 4 + 4 + 8;
constexpr std::uint64_t kMinKv = 8 + 1 + 4 + 1;
constexpr std::uint64_t kFixedHeader = 4 + 4 + 8 + 8;

class Reader {
 public:
  Reader(std::span<const std::uint8_t> bytes, std::uint64_t file_size, std::string_view origin, bool allow_more)
      : b_(bytes), file_size_(file_size), origin_(origin), allow_more_(allow_more) {}

  std::uint64_t pos() const { return pos_; }
  std::uint64_t left_in_file() const { return file_size_ - pos_; }
  std::uint64_t file_size() const { return file_size_; }

  [[noreturn]] void fail_at(std::uint64_t offset, const std::string& message) const {
    throw InputError(std::string(origin_), at_byte(offset, message));
  }

  void need(std::uint64_t n, std::string_view what) {
    std::uint64_t end = 0;
    if (__builtin_add_overflow(pos_, n, &end) || end > file_size_) {
      fail_at(pos_, fmt::format("truncated {}: it needs {} bytes but the file ends at byte {}", what, n, file_size_));
    }
    if (end > b_.size()) {
      if (allow_more_) throw NeedMore{end};
      fail_at(pos_, fmt::format("{} lies past the {} bytes of the file that were given", what, b_.size()));
    }
  }

  std::uint64_t uint(unsigned width, std::string_view what) {
    need(width, what);
    std::uint64_t v = 0;
    for (unsigned k = width; k-- > 0;) v = (v << 8) | b_[static_cast<std::size_t>(pos_ + k)];
    pos_ += width;
    return v;
  }
  std::uint32_t u32(std::string_view what) { return static_cast<std::uint32_t>(uint(4, what)); }
  std::uint64_t u64(std::string_view what) { return uint(8, what); }

  std::string bytes(std::uint64_t n, std::string_view what) {
    need(n, what);
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), static_cast<std::size_t>(n));
    pos_ += n;
    return s;
  }
  void skip(std::uint64_t n, std::string_view what) {
    need(n, what);
    pos_ += n;
  }

 private:
  std::span<const std::uint8_t> b_;
  std::uint64_t file_size_;
  std::string_view origin_;
  bool allow_more_;
  std::uint64_t pos_ = 0;
};

std::string printable(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 96)) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) out += fmt::format("\\x{:02x}", u);
    else out += c;
  }
  if (s.size() > 96) out += "...";
  return out;
}

GgufValue read_value(Reader& r, GgufType type, int depth, const std::string& what) {
  GgufValue v;
  v.type = type;
  const std::uint64_t at = r.pos();
  switch (type) {
    case GgufType::u8:
    case GgufType::u16:
    case GgufType::u32:
    case GgufType::u64: v.u = r.uint(static_cast<unsigned>(fixed_size(type)), what); break;
    case GgufType::i8: v.i = static_cast<std::int8_t>(r.uint(1, what)); break;
    case GgufType::i16: v.i = static_cast<std::int16_t>(r.uint(2, what)); break;
    case GgufType::i32: v.i = static_cast<std::int32_t>(r.uint(4, what)); break;
    case GgufType::i64: v.i = static_cast<std::int64_t>(r.uint(8, what)); break;
    case GgufType::f32: {
      const auto bits = static_cast<std::uint32_t>(r.uint(4, what));
      float f = 0;
      std::memcpy(&f, &bits, sizeof f);
      v.f = f;
      break;
    }
    case GgufType::f64: {
      const std::uint64_t bits = r.uint(8, what);
      std::memcpy(&v.f, &bits, sizeof v.f);
      break;
    }
    case GgufType::boolean:
      v.u = r.uint(1, what);
      if (v.u > 1) r.fail_at(at, fmt::format("{}: a bool must be 0 or 1, found {}", what, v.u));
      break;
    case GgufType::string: {
      const std::uint64_t len = r.u64(fmt::format("the length of {}", what));
      v.s = r.bytes(len, what);
      break;
    }
    case GgufType::array: {
      const std::uint32_t et = r.u32(fmt::format("the element type of {}", what));
      if (et > static_cast<std::uint32_t>(GgufType::f64)) {
        r.fail_at(at, fmt::format("{}: array element type {} is not a GGUF type (0..12)", what, et));
      }
      v.elem_type = static_cast<GgufType>(et);
      if (v.elem_type == GgufType::array && depth + 1 >= kGgufMaxArrayDepth) {
        r.fail_at(at, fmt::format("{}: arrays nested deeper than {} levels", what, kGgufMaxArrayDepth));
      }
      const std::uint64_t count_at = r.pos();
      v.count = r.u64(fmt::format("the element count of {}", what));
      std::uint64_t min_bytes = 0;
      if (__builtin_mul_overflow(v.count, min_value_size(v.elem_type), &min_bytes) || min_bytes > r.left_in_file()) {
        r.fail_at(count_at, fmt::format("truncated {}: {} elements of {} need at least {} bytes, but the file ends at byte {}", what,
                                        v.count, gguf_type_name(v.elem_type),
                                        min_bytes > r.left_in_file() ? fmt::format("{}", min_bytes) : std::string("2^64"),
                                        r.file_size()));
      }
      const std::uint64_t fixed = fixed_size(v.elem_type);
      if (v.count > kGgufKeptArrayElements && fixed != 0) {
        r.skip(v.count * fixed, what);  // checked above: fits in the file
        break;
      }
      if (v.count <= kGgufKeptArrayElements) v.elems.reserve(static_cast<std::size_t>(v.count));
      for (std::uint64_t k = 0; k < v.count; ++k) {
        GgufValue e = read_value(r, v.elem_type, depth + 1, what);
        if (v.count <= kGgufKeptArrayElements) v.elems.push_back(std::move(e));
      }
      break;
    }
  }
  return v;
}

GgufHeader parse(std::span<const std::uint8_t> bytes, std::uint64_t file_size, std::string_view origin, bool allow_more) {
  if (bytes.size() > file_size) bytes = bytes.first(static_cast<std::size_t>(file_size));
  Reader r(bytes, file_size, origin, allow_more);
  GgufHeader h;
  h.file_size = file_size;
  if (file_size < 4) r.fail_at(0, fmt::format("the file is {} bytes, too short for the GGUF magic", file_size));
  r.need(4, "the magic");
  if (std::memcmp(bytes.data(), "GGUF", 4) != 0) {
    r.fail_at(0, fmt::format("bad magic {:02x} {:02x} {:02x} {:02x} (\"{}\"), expected 47 47 55 46 (\"GGUF\")", bytes[0], bytes[1],
                             bytes[2], bytes[3], printable(std::string_view(reinterpret_cast<const char*>(bytes.data()), 4))));
  }
  r.skip(4, "the magic");
  h.version = r.u32("the version");
  if (h.version != 0 && (h.version & 0xFFFFu) == 0) {
    r.fail_at(4, fmt::format("version 0x{:08x} has its low 16 bits zero: the file's byte order does not match this machine "
                             "(a big-endian GGUF, version {} byte-swapped); vramfuzz reads little-endian GGUF",
                             h.version, __builtin_bswap32(h.version)));
  }
  if (h.version == 1) {
    r.fail_at(4, "GGUF version 1 is not supported (v1 used 32-bit counts and lengths; re-convert the file to v3)");
  }
  if (h.version < 2 || h.version > 3) r.fail_at(4, fmt::format("unsupported GGUF version {} (this reader reads versions 2 and 3)", h.version));
  h.tensor_count = r.u64("tensor_count");
  h.kv_count = r.u64("kv_count");
  const std::uint64_t after_counts = file_size - std::min(file_size, kFixedHeader);
  if (h.kv_count > after_counts / kMinKv) {
    r.fail_at(16, fmt::format("kv_count {} cannot fit: each key/value takes at least {} bytes and the file has {} bytes after the "
                              "header",
                              h.kv_count, kMinKv, after_counts));
  }
  if (h.tensor_count > after_counts / kMinTensorInfo) {
    r.fail_at(8, fmt::format("tensor_count {} cannot fit: each tensor info takes at least {} bytes and the file has {} bytes after "
                             "the header",
                             h.tensor_count, kMinTensorInfo, after_counts));
  }

  // ---- metadata ----
  std::set<std::string, std::less<>> keys;
  for (std::uint64_t i = 0; i < h.kv_count; ++i) {
    GgufKv kv;
    kv.offset = r.pos();
    const std::string what_key = fmt::format("the key of KV {}", i);
    const std::uint64_t len = r.u64(fmt::format("the key length of KV {}", i));
    if (len == 0) r.fail_at(kv.offset, fmt::format("KV {} has an empty key", i));
    if (len > kGgufMaxKeyLength) {
      r.fail_at(kv.offset, fmt::format("KV {}: key length {} is over the {}-byte limit", i, len, kGgufMaxKeyLength));
    }
    kv.key = r.bytes(len, what_key);
    if (keys.count(kv.key) != 0) r.fail_at(kv.offset, fmt::format("duplicate key \"{}\"", printable(kv.key)));
    keys.insert(kv.key);
    const std::uint64_t type_at = r.pos();
    const std::string what = fmt::format("KV \"{}\"", printable(kv.key));
    const std::uint32_t type = r.u32(fmt::format("the value type of {}", what));
    if (type > static_cast<std::uint32_t>(GgufType::f64)) {
      r.fail_at(type_at, fmt::format("{}: value type {} is not a GGUF type (0..12)", what, type));
    }
    kv.value = read_value(r, static_cast<GgufType>(type), 0, what);
    if (kv.key == "general.alignment") {
      if (kv.value.type != GgufType::u32) {
        r.fail_at(type_at, fmt::format("general.alignment must be a u32, found {}", gguf_type_name(kv.value.type)));
      }
      if (kv.value.u == 0 || kv.value.u % 8 != 0) {
        r.fail_at(type_at + 4, fmt::format("general.alignment {} must be a non-zero multiple of 8", kv.value.u));
      }
      h.alignment = static_cast<std::uint32_t>(kv.value.u);
    } else if (kv.key == "general.architecture") {
      if (kv.value.type != GgufType::string) {
        r.fail_at(type_at, fmt::format("general.architecture must be a string, found {}", gguf_type_name(kv.value.type)));
      }
      h.architecture = kv.value.s;
    }
    h.kvs.push_back(std::move(kv));
  }

  // ---- tensor infos ----
  std::set<std::string, std::less<>> names;
  std::uint64_t long_names = 0;
  for (std::uint64_t i = 0; i < h.tensor_count; ++i) {
    GgufTensorInfo t;
    t.info_offset = r.pos();
    const std::uint64_t len = r.u64(fmt::format("the name length of tensor info {}", i));
    if (len > kGgufMaxKeyLength) {
      r.fail_at(t.info_offset, fmt::format("tensor info {}: name length {} is over the {}-byte limit", i, len, kGgufMaxKeyLength));
    }
    t.name = r.bytes(len, fmt::format("the name of tensor info {}", i));
    if (len > kGgufSpecMaxName) ++long_names;
    const std::string what = fmt::format("tensor \"{}\"", printable(t.name));
    if (names.count(t.name) != 0) r.fail_at(t.info_offset, fmt::format("duplicate tensor name \"{}\"", printable(t.name)));
    names.insert(t.name);
    const std::uint64_t dims_at = r.pos();
    const std::uint32_t n_dims = r.u32(fmt::format("n_dims of {}", what));
    if (n_dims > kGgufMaxDims) r.fail_at(dims_at, fmt::format("{}: n_dims {} is more than {}", what, n_dims, kGgufMaxDims));
    std::uint64_t numel = 1;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const std::uint64_t at = r.pos();
      const std::uint64_t ne = r.u64(fmt::format("dimension {} of {}", d, what));
      if (ne > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        r.fail_at(at, fmt::format("{}: ne[{}] = {} does not fit in int64", what, d, ne));
      }
      if (__builtin_mul_overflow(numel, ne, &numel) || numel > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        r.fail_at(at, fmt::format("{}: the element count overflows int64 at ne[{}] = {}", what, d, ne));
      }
      t.ne.push_back(ne);
    }
    const std::uint64_t type_at = r.pos();
    t.ggml_type = r.u32(fmt::format("the type of {}", what));
    if (t.ggml_type >= kGgufTypeCount) {
      r.fail_at(type_at, fmt::format("{}: ggml type id {} is out of range (0..{})", what, t.ggml_type, kGgufTypeCount - 1));
    }
    if (!retired_name(t.ggml_type).empty()) {
      r.fail_at(type_at, fmt::format("{}: ggml type id {} ({}) was retired and is no longer valid in GGUF files", what, t.ggml_type,
                                     retired_name(t.ggml_type)));
    }
    const auto dtype = vf_dtype_of_ggml(t.ggml_type);
    if (!dtype) {
      r.fail_at(type_at, fmt::format("{}: ggml type {} ({}) is not supported by vramfuzz (supported: {})", what,
                                     kGgmlTypeNames[t.ggml_type], t.ggml_type, supported_ggml_list()));
    }
    t.dtype = *dtype;
    const DtypeInfo& di = dtype_info(t.dtype);
    const std::uint64_t row = t.ne.empty() ? 1 : t.ne[0];
    if (row % di.block_elems != 0) {
      r.fail_at(dims_at, fmt::format("{}: {} rows have ne[0] = {} elements, not a multiple of the {}-element block{}", what,
                                     kGgmlTypeNames[t.ggml_type], row, di.block_elems,
                                     di.block_elems == 256 ? " (K-quants need whole 256-element super-blocks)" : ""));
    }
    // Bytes: whole blocks per row times the rows (all dims but ne[0]).
    const std::uint64_t rows = row == 0 ? 0 : numel / row;
    std::uint64_t size = 0;
    if (__builtin_mul_overflow(row / di.block_elems, static_cast<std::uint64_t>(di.block_bytes), &size) ||
        __builtin_mul_overflow(size, rows, &size)) {
      r.fail_at(dims_at, fmt::format("{}: its size in bytes overflows 64 bits", what));
    }
    t.bytes = size;
    const std::uint64_t off_at = r.pos();
    t.offset = r.u64(fmt::format("the offset of {}", what));
    if (t.offset % h.alignment != 0) {
      r.fail_at(off_at, fmt::format("{}: offset {} is not a multiple of the alignment {}", what, t.offset, h.alignment));
    }
    h.tensors.push_back(std::move(t));
  }
  if (long_names > 0) {
    h.warnings.push_back(fmt::format("{} tensor name(s) are longer than the spec's {} bytes (llama.cpp would refuse the file; "
                                     "ComfyUI-GGUF reads it)",
                                     long_names, kGgufSpecMaxName));
  }

  // ---- data section ----
  const std::uint64_t end_of_infos = r.pos();
  std::uint64_t data_start = 0;
  if (__builtin_add_overflow(end_of_infos, static_cast<std::uint64_t>(h.alignment - 1), &data_start)) {
    r.fail_at(end_of_infos, "the data section offset overflows 64 bits");
  }
  h.data_start = data_start / h.alignment * h.alignment;
  const std::uint64_t data_len = file_size > h.data_start ? file_size - h.data_start : 0;
  std::vector<std::size_t> order(h.tensors.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  for (const GgufTensorInfo& t : h.tensors) {
    std::uint64_t end = 0;
    if (__builtin_add_overflow(t.offset, t.bytes, &end) || (t.bytes > 0 && end > data_len)) {
      r.fail_at(t.info_offset, fmt::format("tensor \"{}\": data [{}, {}) runs past the end of the file: the data section starts at "
                                           "byte {} and holds {} bytes (file: {} bytes)",
                                           printable(t.name), t.offset, t.offset + std::min(t.bytes, ~t.offset), h.data_start,
                                           data_len, file_size));
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return h.tensors[a].offset < h.tensors[b].offset; });
  const GgufTensorInfo* prev = nullptr;
  for (std::size_t k : order) {
    const GgufTensorInfo& t = h.tensors[k];
    if (t.bytes == 0) continue;
    if (prev != nullptr && t.offset < prev->offset + prev->bytes) {
      r.fail_at(t.info_offset, fmt::format("tensor \"{}\": data [{}, {}) overlaps tensor \"{}\" [{}, {})", printable(t.name), t.offset,
                                           t.offset + t.bytes, printable(prev->name), prev->offset, prev->offset + prev->bytes));
    }
    prev = &t;
  }
  return h;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64: return true;
    default: return false;
  }
}

std::optional<std::int64_t> GgufValue::as_int() const {
  switch (type) {
    case GgufType::i8:
    case GgufType::i16:
    case GgufType::i32:
    case GgufType::i64: return i;
    case GgufType::u8:
    case GgufType::u16:
    case GgufType::u32:
    case GgufType::u64:
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) return std::nullopt;
      return static_cast<std::int64_t>(u);
    default: return std::nullopt;
  }
}

const GgufKv* GgufHeader::find(std::string_view key) const {
  for (const GgufKv& kv : kvs) {
    if (kv.key == key) return &kv;
  }
  return nullptr;
}

std::string_view ggml_type_name(std::uint32_t id) {
  if (id >= kGgufTypeCount) return "unknown";
  if (!retired_name(id).empty()) return "retired";
  return kGgmlTypeNames[id];
}

GgufHeader parse_gguf_header(std::span<const std::uint8_t> bytes, std::uint64_t file_size, std::string_view origin) {
  return parse(bytes, file_size, origin, false);
}

GgufHeader read_gguf_header(const std::string& path) {
  const HeaderFile f(path);
  // Most diffusion GGUF headers are well under 1 MiB; LLM files with a vocabulary reach tens of
  // MiB. Read more (at least double) whenever the parser runs past what was read.
  constexpr std::uint64_t kFirstRead = 1 * 1024 * 1024;
  constexpr std::uint64_t kMaxHeaderRead = std::uint64_t{4} << 30;
  std::uint64_t want = std::min(f.size(), kFirstRead);
  while (true) {
    const std::vector<std::uint8_t> bytes = f.prefix(want);
    try {
      return parse(bytes, f.size(), path, true);
    } catch (const NeedMore& more) {
      std::uint64_t next = std::max(more.bytes, want * 2);
      next = std::min(next, f.size());
      if (next > kMaxHeaderRead) {
        throw InputError(path, at_byte(want, fmt::format("the GGUF header is larger than {} GiB; refusing to read it", kMaxHeaderRead >> 30)));
      }
      want = next;
    }
  }
}

}  // namespace vf
