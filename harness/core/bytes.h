// Byte counts: uint64_t everywhere, checked arithmetic (an overflow is an input error, never a
// wrap), MiB/GiB only at the edges (parsing "24GiB", printing). MiB = 2^20.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace vf {

using Bytes = std::uint64_t;

inline constexpr Bytes KiB = Bytes{1} << 10;
inline constexpr Bytes MiB = Bytes{1} << 20;
inline constexpr Bytes GiB = Bytes{1} << 30;

// Checked arithmetic. `what` names the quantity for the error message
// ("models[0].tensors[3] bytes"); it throws vf::InputError on overflow.
Bytes checked_add(Bytes a, Bytes b, std::string_view what);
Bytes checked_sub(Bytes a, Bytes b, std::string_view what);  // underflow is an error too
Bytes checked_mul(Bytes a, Bytes b, std::string_view what);
Bytes checked_round_up(Bytes value, Bytes align, std::string_view what);  // align > 0

// Unchecked helpers for values already known to be in range (internal bookkeeping).
constexpr Bytes round_up(Bytes value, Bytes align) { return (value + align - 1) / align * align; }
constexpr Bytes ceil_div(Bytes value, Bytes div) { return value / div + (value % div != 0 ? 1 : 0); }
constexpr Bytes sat_sub(Bytes a, Bytes b) { return a > b ? a - b : 0; }

// Multiplies by a non-negative factor and truncates toward zero (ComfyUI's int() casts);
// throws on overflow or a negative / non-finite factor.
Bytes scale_bytes(Bytes value, double factor, std::string_view what);

// "24GiB", "400MiB", "1.5GiB", "512KiB", "123" (bytes), "2048B", "24G" (= GiB), "100MB" (= MiB:
// ComfyUI's and PyTorch's "MB" are MiB). Throws vf::InputError(`what`, reason) on anything else:
// negative numbers, trailing junk, an unknown unit, a value that overflows 64 bits.
Bytes parse_size(std::string_view text, std::string_view what);

// "1280.00 MiB" (two decimals) and the signed variant "+32.00 MiB".
std::string format_mib(Bytes b);
std::string format_signed_mib(std::int64_t delta);
// "24 GiB" when exact, else "24.50 GiB"; for device sizes in headers.
std::string format_size(Bytes b);
double to_mib(Bytes b);

}  // namespace vf
