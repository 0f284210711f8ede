#include "mxq/io/safetensors.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <random>

#include "io/io_test_support.h"

namespace mxq::io {
namespace {

using testing::append;
using testing::append_le;
using testing::Bytes;
using testing::expect_error;
using testing::TempDir;

// A safetensors image from its parts, as the format specifies: u64 LE header length, header, data.
Bytes image(std::string_view header, const Bytes& data = {}) {
  Bytes out;
  append_le(out, header.size(), 8);
  append(out, header);
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

Tensor random_tensor(DType dtype, Shape shape, std::uint32_t seed) {
  Tensor tensor = Tensor::empty(dtype, shape);
  std::mt19937 rng(seed);
  for (std::size_t i = 0; i < tensor.nbytes(); ++i)
    tensor.view().bytes()[i] = static_cast<std::byte>(rng() & 0xff);
  return tensor;
}

bool same_bytes(std::span<const std::byte> a, const TensorView& b) {
  return a.size() == b.nbytes() && (a.empty() || std::memcmp(a.data(), b.data(), a.size()) == 0);
}

void expect_format_error(const Bytes& bytes, std::initializer_list<std::string_view> fragments) {
  expect_error([&] { (void)SafetensorsFile::parse(bytes, "bad.safetensors"); }, ErrorCode::kFormat,
               fragments);
}

TEST(SafetensorsTest, RoundTripsEveryDtypeAndShape) {
  const DType dtypes[] = {DType::kBool, DType::kU8,   DType::kI8,  DType::kI32,  DType::kI64,
                          DType::kF32,  DType::kBF16, DType::kF16, DType::kE4M3, DType::kE8M0};
  const Shape shapes[] = {Shape{},     Shape{0},       Shape{5},
                          Shape{2, 3}, Shape{3, 0, 2}, Shape{1, 2, 1, 2, 1, 2, 1, 2}};
  TempDir dir;
  std::vector<Tensor> owned;
  std::vector<NamedTensor> tensors;
  std::uint32_t seed = 1;
  for (const DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      owned.push_back(random_tensor(dtype, shape, seed++));
      tensors.emplace_back(std::string(name(dtype)) + shape.str(), owned.back().view());
    }
  }
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "ünïcode"}};
  const std::string path = dir.file("all.safetensors");
  write_safetensors(path, tensors, metadata);

  const SafetensorsFile file = SafetensorsFile::open(path);
  EXPECT_EQ(file.path(), path);
  EXPECT_EQ(file.metadata(), metadata);
  ASSERT_EQ(file.entries().size(), tensors.size());
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [tensor_name, tensor] = tensors[i];
    SCOPED_TRACE(tensor_name);
    // The writer lays tensors out in the given order, so file order is the given order.
    EXPECT_EQ(file.entries()[i].name, tensor_name);
    ASSERT_TRUE(file.contains(tensor_name));
    const SafetensorsEntry& entry = file.entry(tensor_name);
    EXPECT_EQ(entry.dtype, tensor.dtype());
    EXPECT_EQ(entry.shape, tensor.shape());
    EXPECT_EQ(entry.end - entry.begin, tensor.nbytes());
    EXPECT_TRUE(same_bytes(file.bytes(tensor_name), tensor));
    const TensorView view = file.view(tensor_name);
    EXPECT_EQ(view.dtype(), tensor.dtype());
    EXPECT_EQ(view.shape(), tensor.shape());
    EXPECT_TRUE(view.device().is_cpu());
    EXPECT_TRUE(view.is_contiguous());
    EXPECT_EQ(view.bytes(), file.bytes(tensor_name).data());
  }
  EXPECT_FALSE(file.contains("absent"));
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"all.safetensors"});
}

TEST(SafetensorsTest, WriterProducesTheSpecifiedBytes) {
  // Built from the format specification: compact JSON in the given order, __metadata__ first,
  // spaces up to a multiple of 8, then the tensors' bytes back to back.
  const float a_values[2] = {1.0f, -2.0f};
  const std::uint8_t b_values[3] = {1, 2, 3};
  const TensorView a(const_cast<float*>(a_values), DType::kF32, Shape{2});
  const TensorView b(const_cast<std::uint8_t*>(b_values), DType::kU8, Shape{3});
  std::string header =
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"U8","shape":[3],"data_offsets":[8,11]}})";
  ASSERT_EQ(header.size(), 138u);
  header += "      ";  // 138 + 6 = 144 = 18 * 8
  Bytes expected;
  append_le(expected, 144, 8);
  append(expected, header);
  append(expected, std::string_view("\x00\x00\x80\x3f\x00\x00\x00\xc0\x01\x02\x03", 11));

  TempDir dir;
  write_safetensors(dir.file("x.safetensors"), {{"a", a}, {"b", b}}, {{"format", "pt"}});
  EXPECT_EQ(testing::read_file(dir.file("x.safetensors")), expected);

  write_safetensors(dir.file("empty.safetensors"), {});
  Bytes empty;
  append_le(empty, 8, 8);
  append(empty, "{}      ");
  EXPECT_EQ(testing::read_file(dir.file("empty.safetensors")), empty);
}

TEST(SafetensorsTest, ReadsAHandBuiltImage) {
  // Header order differs from data order, with spacing and a zero-size tensor.
  Bytes data;
  append(data, std::string_view("\x07\x00\x00\x00\x00\x00\x00\x00\xaa\xbb", 10));
  const Bytes bytes =
      image(R"({ "tail": {"dtype": "U8", "shape": [2], "data_offsets": [8, 10]},)"
            R"( "empty": {"dtype": "F32", "shape": [0, 4], "data_offsets": [8, 8]},)"
            R"( "head": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]} }   )",
            data);
  const SafetensorsFile file = SafetensorsFile::parse(bytes, "hand");
  ASSERT_EQ(file.entries().size(), 3u);
  EXPECT_EQ(file.entries()[0].name, "head");  // sorted by data offset
  EXPECT_EQ(file.entry("tail").shape, Shape{2});
  EXPECT_EQ(file.entry("empty").shape, (Shape{0, 4}));
  EXPECT_TRUE(file.metadata().empty());
  const std::size_t data_start = bytes.size() - data.size();
  EXPECT_EQ(file.bytes("tail").data(), bytes.data() + data_start + 8);
  EXPECT_EQ(std::to_integer<int>(file.bytes("tail")[1]), 0xbb);
  EXPECT_EQ(file.bytes("empty").size(), 0u);
  std::int64_t head = 0;
  std::memcpy(&head, file.view("head").data(), sizeof(head));
  EXPECT_EQ(head, 7);
}

TEST(SafetensorsTest, MisalignedTensorsAreReportedAndReadableByCopy) {
  // A u8 tensor of 1 byte first puts the f32 at data offset 1. The image lives in a buffer whose
  // data section starts 8-aligned, so the f32 starts at an odd address.
  const std::string header = R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                             R"("f":{"dtype":"F32","shape":[1],"data_offsets":[1,5]}})";
  const std::string padded = header + std::string((8 - header.size() % 8) % 8, ' ');
  Bytes data;
  append(data, std::string_view("\x09\x00\x00\x80\x3f", 5));
  alignas(8) std::byte buffer[256] = {};
  const Bytes built = image(padded, data);
  ASSERT_LE(built.size(), sizeof(buffer));
  std::memcpy(buffer, built.data(), built.size());
  const SafetensorsFile file =
      SafetensorsFile::parse(std::span<const std::byte>(buffer, built.size()), "odd");
  EXPECT_TRUE(file.is_aligned("b"));
  EXPECT_FALSE(file.is_aligned("f"));
  EXPECT_EQ(std::to_integer<int>(file.view("b").bytes()[0]), 9);
  const TensorView view = file.view("f");
  EXPECT_EQ(view.bytes(), buffer + built.size() - 4);
  EXPECT_EQ(view.shape(), Shape{1});
  float value = 0;
  std::memcpy(&value, view.data(), 4);
  EXPECT_EQ(value, 1.0f);
}

TEST(SafetensorsTest, ViewsStayValidWhileAnyCopyOfTheFileLives) {
  TempDir dir;
  const Tensor t = random_tensor(DType::kI32, Shape{64}, 7);
  write_safetensors(dir.file("t.safetensors"), {{"t", t.view()}});
  SafetensorsFile copy;
  {
    const SafetensorsFile original = SafetensorsFile::open(dir.file("t.safetensors"));
    copy = original;
  }
  EXPECT_TRUE(same_bytes(copy.bytes("t"), t.view()));
  const TensorView view = copy.view("t");
  EXPECT_EQ(view.data_as<std::int32_t>()[63], t.data_as<std::int32_t>()[63]);
}

TEST(SafetensorsTest, LookupErrorsNameTheFileAndTheTensor) {
  const SafetensorsFile file = SafetensorsFile::parse(
      image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", Bytes(1)), "f.st");
  expect_error([&] { (void)file.entry("missing"); }, ErrorCode::kInvalidArgument,
               {"'f.st'", "'missing'"});
  expect_error([&] { (void)file.view("missing"); }, ErrorCode::kInvalidArgument, {"'missing'"});
  expect_error([&] { (void)file.bytes("missing"); }, ErrorCode::kInvalidArgument, {"'missing'"});
  const SafetensorsFile unopened;
  expect_error([&] { (void)unopened.entries(); }, ErrorCode::kInvalidArgument,
               {"default-constructed"});
}

TEST(SafetensorsTest, OpenErrorsNameThePath) {
  TempDir dir;
  expect_error([&] { (void)SafetensorsFile::open(dir.file("nope.safetensors")); }, ErrorCode::kIo,
               {"nope.safetensors", "cannot open", "No such file"});
  std::filesystem::create_directory(dir.file("sub"));
  expect_error([&] { (void)SafetensorsFile::open(dir.file("sub")); }, ErrorCode::kIo,
               {"sub'", "a directory"});
  testing::write_file(dir.file("empty"), {});
  expect_error([&] { (void)SafetensorsFile::open(dir.file("empty")); }, ErrorCode::kFormat,
               {"empty'", "at least 8 bytes", "found 0"});
}

TEST(SafetensorsTest, RejectsMalformedHeaderLengths) {
  expect_format_error(Bytes(5), {"bad.safetensors", "at least 8 bytes", "found 5"});
  Bytes huge;
  append_le(huge, 100'000'001, 8);
  expect_format_error(huge, {"header length 100000001", "limit"});
  Bytes past;
  append_le(past, 20, 8);
  append(past, "{}");
  expect_format_error(past, {"header length 20", "2 bytes", "truncated"});
  Bytes all_ones;
  append_le(all_ones, ~0ull, 8);
  expect_format_error(all_ones, {"header length 18446744073709551615"});
}

TEST(SafetensorsTest, RejectsHeadersThatAreNotAJsonObject) {
  expect_format_error(image("{\"a\": "), {"not valid JSON"});
  expect_format_error(image("[1, 2]"), {"must be a JSON object", "array"});
  expect_format_error(image("{} x"), {"not valid JSON"});
  expect_format_error(image("{\"\xff\": 1}"), {"not valid JSON"});
  expect_format_error(image(std::string_view("{}\0\0", 4)),
                      {"not valid JSON", "NUL byte at header offset 2"});
  expect_format_error(
      image(R"({"a":{"dtype":"U8","shape":[],"data_offsets":[0,1]},"a":{}})", Bytes(1)),
      {"repeats the key 'a'"});
  expect_format_error(
      image(R"({"a":{"dtype":"U8","dtype":"I8","shape":[],"data_offsets":[0,1]}})", Bytes(1)),
      {"repeats the key 'dtype'"});
}

TEST(SafetensorsTest, RejectsMalformedEntries) {
  const auto entry = [](std::string_view body) {
    return image("{\"w\":" + std::string(body) + "}", Bytes(64));
  };
  expect_format_error(entry("[1]"), {"tensor 'w'", "expected an object", "array"});
  expect_format_error(entry(R"({"shape":[1],"data_offsets":[0,1]})"),
                      {"tensor 'w'", "missing field 'dtype'"});
  expect_format_error(entry(R"({"dtype":"U8","data_offsets":[0,1]})"), {"missing field 'shape'"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[1]})"), {"missing field 'data_offsets'"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":0})"),
                      {"unexpected field 'x'"});
  expect_format_error(entry(R"({"dtype":7,"shape":[1],"data_offsets":[0,1]})"),
                      {"dtype: expected a string", "found the non-negative integer 7"});
  expect_format_error(entry(R"({"dtype":"F64","shape":[1],"data_offsets":[0,8]})"),
                      {"tensor 'w'", "dtype: expected one of", "F8_E4M3", "found 'F64'"});
  expect_format_error(entry(R"({"dtype":"U8","shape":3,"data_offsets":[0,3]})"),
                      {"shape: expected an array"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[2,-3],"data_offsets":[0,1]})"),
                      {"shape[1]", "non-negative integer", "negative integer", "-3"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[2.5],"data_offsets":[0,1]})"),
                      {"shape[0]", "floating-point", "2.5"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,1]})"),
                      {"at most 8 dimensions, found 9"});
  expect_format_error(
      entry(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,1]})"),
      {"too large", "2^63 bytes"});
  expect_format_error(
      entry(R"({"dtype":"U8","shape":[4294967296,0,4294967296],"data_offsets":[0,0]})"),
      {"too large"});
  expect_format_error(
      entry(R"({"dtype":"U8","shape":[18446744073709551615],"data_offsets":[0,1]})"), {"shape[0]"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[0]})"),
                      {"data_offsets: expected [begin, end]", "found an array of 1 elements"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[1],"data_offsets":{"a":1}})"),
                      {"data_offsets: expected [begin, end]", "an object with 1 keys"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[1],"data_offsets":[-1,0]})"),
                      {"data_offsets[0]", "negative integer"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[0],"data_offsets":[5,4]})"),
                      {"begin <= end", "[5, 4]"});
  expect_format_error(entry(R"({"dtype":"U8","shape":[65],"data_offsets":[0,65]})"),
                      {"tensor 'w'", "[0, 65]", "past the data section (64 bytes)", "truncated"});
  expect_format_error(entry(R"({"dtype":"F32","shape":[2,3],"data_offsets":[0,20]})"),
                      {"span 20 bytes", "expected 24", "[2, 3]", "f32"});
}

TEST(SafetensorsTest, ManyTensorsParseInLinearithmicTime) {
  // 100k entries: a parser that rescans the header per entry (O(n^2)) takes minutes here.
  const std::size_t count = 100000;
  std::string header = "{";
  for (std::size_t i = 0; i < count; ++i) {
    // Reverse name order, so sorting by offset is real work.
    header += (i ? ",\"" : "\"") + std::to_string(count - i) + R"(":{"dtype":"U8","shape":[1],)" +
              R"("data_offsets":[)" + std::to_string(i) + "," + std::to_string(i + 1) + "]}";
  }
  header += "}";
  Bytes data(count);
  for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<std::byte>(i % 251);
  const Bytes bytes = image(header, data);
  const auto start = std::chrono::steady_clock::now();
  const SafetensorsFile file = SafetensorsFile::parse(bytes);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(file.entries().size(), count);
  EXPECT_EQ(file.entries().front().name, std::to_string(count));
  EXPECT_EQ(std::to_integer<std::size_t>(file.bytes("1")[0]), (count - 1) % 251);
  EXPECT_LT(seconds, 30.0);
}

TEST(SafetensorsTest, DeeplyNestedHeadersAreAnErrorNotAStackOverflow) {
  const std::size_t depth = 200000;
  expect_format_error(image(std::string(depth, '[') + std::string(depth, ']')),
                      {"must be a JSON object", "an array of 1 elements"});
  const std::string deep = std::string(depth, '[') + std::string(depth, ']');
  expect_format_error(
      image(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":)" + deep + "}}", Bytes(1)),
      {"tensor 'w'", "data_offsets", "an array of 1 elements"});
  expect_format_error(image(R"({"__metadata__":{"k":)" + deep + "}}"),
                      {"__metadata__ 'k'", "an array of 1 elements"});
}

TEST(SafetensorsTest, RejectsOverlappingTensors) {
  expect_format_error(image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[3,7]}})",
                            Bytes(8)),
                      {"'a'", "'b'", "overlap"});
  expect_format_error(image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]},)"
                            R"("b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
                            Bytes(8)),
                      {"overlap"});
  // Empty tensors overlap nothing, adjacent tensors do not overlap.
  const SafetensorsFile fine =
      SafetensorsFile::parse(image(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                   R"("z":{"dtype":"U8","shape":[0],"data_offsets":[2,2]},)"
                                   R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                                   Bytes(8)));
  EXPECT_EQ(fine.entries().size(), 3u);
}

TEST(SafetensorsTest, RejectsMalformedMetadata) {
  expect_format_error(image(R"({"__metadata__":["a"]})"), {"__metadata__", "object of strings"});
  expect_format_error(
      image(R"({"__metadata__":{"k":1}})"),
      {"__metadata__ 'k'", "expected a string", "found the non-negative integer 1"});
  const SafetensorsFile file = SafetensorsFile::parse(image(R"({"__metadata__":{"k":"v"}})"));
  EXPECT_EQ(file.metadata().at("k"), "v");
  EXPECT_TRUE(file.entries().empty());
}

TEST(SafetensorsTest, EveryTruncationIsAnErrorNeverACrash) {
  TempDir dir;
  const Tensor a = random_tensor(DType::kF32, Shape{2, 3}, 3);
  const Tensor b = random_tensor(DType::kU8, Shape{5}, 4);
  write_safetensors(dir.file("full"), {{"a", a.view()}, {"b", b.view()}}, {{"k", "v"}});
  const Bytes full = testing::read_file(dir.file("full"));
  ASSERT_GT(full.size(), 100u);
  EXPECT_EQ(SafetensorsFile::parse(full).entries().size(), 2u);
  for (std::size_t length = 0; length < full.size(); ++length) {
    SCOPED_TRACE(length);
    // An exact-size copy, so reading one byte too far is caught by the sanitizers.
    const Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(length));
    EXPECT_THROW((void)SafetensorsFile::parse(prefix), Error);
    testing::write_file(dir.file("cut"), prefix);
    EXPECT_THROW((void)SafetensorsFile::open(dir.file("cut")), Error);
  }
}

// Writer refusals happen before anything touches the disk.
class SafetensorsWriterTest : public ::testing::Test {
 protected:
  void expect_refused(const std::vector<NamedTensor>& tensors, ErrorCode code,
                      std::initializer_list<std::string_view> fragments) {
    expect_error([&] { write_safetensors(dir_.file("out.safetensors"), tensors); }, code,
                 fragments);
    EXPECT_TRUE(dir_.listing().empty());
  }
  TempDir dir_;
  Tensor tensor_ = random_tensor(DType::kF32, Shape{4, 4}, 11);
};

TEST_F(SafetensorsWriterTest, RefusesDuplicateAndReservedNames) {
  expect_refused({{"w", tensor_.view()}, {"w", tensor_.view()}}, ErrorCode::kInvalidArgument,
                 {"'w'", "twice"});
  expect_refused({{"__metadata__", tensor_.view()}}, ErrorCode::kInvalidArgument, {"reserved"});
  expect_refused({{"bad\xff", tensor_.view()}}, ErrorCode::kInvalidArgument, {"UTF-8"});
}

TEST_F(SafetensorsWriterTest, RefusesNonContiguousAndDeviceTensors) {
  const TensorView strided(tensor_.data(), DType::kF32, Shape{4, 2}, Shape{4, 2}, Device::cpu());
  expect_refused({{"s", strided}}, ErrorCode::kInvalidArgument, {"'s'", "contiguous"});
  const TensorView on_gpu(tensor_.data(), DType::kF32, Shape{4, 4}, Device::cuda(0));
  expect_refused({{"g", on_gpu}}, ErrorCode::kDeviceMismatch, {"'g'", "cpu", "cuda:0"});
}

TEST_F(SafetensorsWriterTest, RefusesPackedFp4WithAHint) {
  const TensorView fp4(tensor_.data(), DType::kE2M1x2, Shape{8});
  expect_refused({{"q", fp4}}, ErrorCode::kUnsupported, {"'q'", "e2m1x2", "as U8"});
}

TEST_F(SafetensorsWriterTest, RefusalLeavesAnExistingFileUntouched) {
  const std::string path = dir_.file("out.safetensors");
  write_safetensors(path, {{"old", tensor_.view()}});
  const Bytes before = testing::read_file(path);
  EXPECT_THROW(write_safetensors(path, {{"new", tensor_.view()}, {"new", tensor_.view()}}), Error);
  EXPECT_EQ(testing::read_file(path), before);
  EXPECT_EQ(dir_.listing(), std::vector<std::string>{"out.safetensors"});
}

TEST_F(SafetensorsWriterTest, FailedWriteRemovesTheTemporaryAndKeepsTheOldFile) {
  const std::string path = dir_.file("out.safetensors");
  write_safetensors(path, {{"old", tensor_.view()}});
  const Bytes before = testing::read_file(path);
  const Tensor big = random_tensor(DType::kU8, Shape{1 << 16}, 12);
  // A file size limit makes write() fail with EFBIG part-way through the temporary file.
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto previous_handler = signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  try {
    write_safetensors(path, {{"big", big.view()}});
    ADD_FAILURE() << "expected the write to fail";
  } catch (const Error& error) {
    EXPECT_EQ(error.code(), ErrorCode::kIo);
    EXPECT_NE(std::string(error.what()).find("write failed"), std::string::npos) << error.what();
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, previous_handler);
  EXPECT_EQ(testing::read_file(path), before);
  EXPECT_EQ(dir_.listing(), std::vector<std::string>{"out.safetensors"});
}

TEST_F(SafetensorsWriterTest, FailedRenameRemovesTheTemporary) {
  std::filesystem::create_directory(dir_.file("taken"));
  std::filesystem::create_directory(dir_.file("taken/inner"));
  expect_error(
      [&] {
        write_safetensors(dir_.file("taken"), {{"w", tensor_.view()}});
      },
      ErrorCode::kIo, {"taken'", "rename"});
  EXPECT_EQ(dir_.listing(), std::vector<std::string>{"taken"});
  EXPECT_TRUE(std::filesystem::exists(dir_.file("taken/inner")));
  expect_error(
      [&] {
        write_safetensors(dir_.file("no/such/dir/x"), {{"w", tensor_.view()}});
      },
      ErrorCode::kIo, {"no/such/dir/x'", "temporary file"});
}

}  // namespace
}  // namespace mxq::io
