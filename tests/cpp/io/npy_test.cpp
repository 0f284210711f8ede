#include "mxq/io/npy.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <random>

#include "io/io_test_support.h"

namespace mxq::io {
namespace {

using testing::append;
using testing::append_le;
using testing::Bytes;
using testing::expect_error;
using testing::TempDir;

// An .npy image from its parts, as the format specifies (no padding unless the caller adds it).
Bytes npy_image(std::string_view header, const Bytes& data = {}, int major = 1) {
  Bytes out;
  append(out, "\x93NUMPY");
  out.push_back(static_cast<std::byte>(major));
  out.push_back(std::byte{0});
  append_le(out, header.size(), major == 1 ? 2 : 4);
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

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0);
}

void expect_format_error(const Bytes& bytes, std::initializer_list<std::string_view> fragments) {
  expect_error([&] { (void)parse_npy(bytes, "bad.npy"); }, ErrorCode::kFormat, fragments);
}

// A dict in a correctly padded v1.0 image, for header-parsing cases.
Bytes with_dict(std::string_view dict, const Bytes& data = {}) {
  std::string header(dict);
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  return npy_image(header, data);
}

TEST(NpyTest, RoundTripsEveryDtypeAndShape) {
  const DType dtypes[] = {DType::kF32, DType::kF16, DType::kI32, DType::kI64, DType::kU8};
  const Shape shapes[] = {Shape{},     Shape{0},       Shape{7},
                          Shape{2, 3}, Shape{2, 0, 3}, Shape{1, 2, 1, 2, 1, 2, 1, 3}};
  TempDir dir;
  std::uint32_t seed = 1;
  for (const DType dtype : dtypes) {
    for (const Shape& shape : shapes) {
      SCOPED_TRACE(std::string(name(dtype)) + shape.str());
      const Tensor original = random_tensor(dtype, shape, seed++);
      write_npy(dir.file("a.npy"), original);
      const Tensor loaded = read_npy(dir.file("a.npy"));
      EXPECT_TRUE(same_tensor(loaded, original));
      EXPECT_TRUE(loaded.device().is_cpu());
      const Bytes bytes = testing::read_file(dir.file("a.npy"));
      EXPECT_EQ((bytes.size() - original.nbytes()) % 64, 0u) << "header not padded to 64";
    }
  }
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"a.npy"});
}

TEST(NpyTest, WriterProducesNumpysBytes) {
  // The header numpy.save writes: sorted keys, repr values, then spaces and '\n' so the data
  // starts at a multiple of 64.
  const float values[6] = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, -0.0f};
  TempDir dir;
  write_npy(dir.file("m.npy"), TensorView(const_cast<float*>(values), DType::kF32, Shape{2, 3}));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  ASSERT_EQ(dict.size(), 59u);
  Bytes expected = npy_image(dict + std::string(128 - 10 - 59 - 1, ' ') + "\n");
  append(expected, std::string_view("\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40"
                                    "\x00\x00\x80\x40\x00\x00\xa0\x40\x00\x00\x00\x80",
                                    24));
  ASSERT_EQ(expected.size(), 128u + 24u);
  EXPECT_EQ(testing::read_file(dir.file("m.npy")), expected);

  const std::uint8_t bytes[5] = {1, 2, 3, 4, 255};
  write_npy(dir.file("v.npy"), TensorView(const_cast<std::uint8_t*>(bytes), DType::kU8, Shape{5}));
  const std::string vector_dict = "{'descr': '|u1', 'fortran_order': False, 'shape': (5,), }";
  Bytes expected_vector = npy_image(vector_dict + std::string(128 - 10 - 57 - 1, ' ') + "\n");
  append(expected_vector, std::string_view("\x01\x02\x03\x04\xff", 5));
  EXPECT_EQ(testing::read_file(dir.file("v.npy")), expected_vector);
}

TEST(NpyTest, WriterProducesNumpysBytesForAScalar) {
  // A scalar has no spare growth spaces (numpy adds 21 - len(str(shape[0])) only when rank > 0).
  TempDir dir;
  const std::int32_t scalar = -5;
  write_npy(dir.file("s.npy"),
            TensorView(const_cast<std::int32_t*>(&scalar), DType::kI32, Shape{}));
  const std::string scalar_dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (), }";
  Bytes expected_scalar = npy_image(scalar_dict + std::string(128 - 10 - 55 - 1, ' ') + "\n");
  append(expected_scalar, std::string_view("\xfb\xff\xff\xff", 4));
  EXPECT_EQ(testing::read_file(dir.file("s.npy")), expected_scalar);
}

TEST(NpyTest, ReadsOtherVersionsAndSpellings) {
  // Version 2.0 with double quotes, no spaces, keys in another order, no padding.
  const Bytes v2 = npy_image(R"({"shape":(3,),"fortran_order":False,"descr":"<i4"})"
                             "\n",
                             Bytes{std::byte{1},
                                   {},
                                   {},
                                   {},
                                   std::byte{2},
                                   {},
                                   {},
                                   {},
                                   std::byte{0xff},
                                   std::byte{0xff},
                                   std::byte{0xff},
                                   std::byte{0xff}},
                             2);
  const Tensor a = parse_npy(v2);
  EXPECT_EQ(a.dtype(), DType::kI32);
  EXPECT_EQ(a.shape(), Shape{3});
  EXPECT_EQ(a.data_as<std::int32_t>()[0], 1);
  EXPECT_EQ(a.data_as<std::int32_t>()[2], -1);
  // Version 3.0 with tabs, a trailing comma in the shape, no trailing comma in the dict.
  const Bytes v3 = npy_image("{'descr':\t'<u1', 'fortran_order' : False,\t'shape': (2, 1,)}  \n",
                             Bytes{std::byte{7}, std::byte{9}}, 3);
  const Tensor b = parse_npy(v3);
  EXPECT_EQ(b.dtype(), DType::kU8);
  EXPECT_EQ(b.shape(), (Shape{2, 1}));
  EXPECT_EQ(b.data_as<std::uint8_t>()[1], 9);
  // A scalar f16 (1.0 = 0x3c00) from a padded 1.0 header.
  const Tensor c = parse_npy(with_dict("{'descr': '<f2', 'fortran_order': False, 'shape': (), }",
                                       Bytes{std::byte{0x00}, std::byte{0x3c}}));
  EXPECT_EQ(c.shape().rank(), 0);
  EXPECT_EQ(std::to_integer<int>(c.view().bytes()[1]), 0x3c);
}

TEST(NpyTest, RejectsBadPrefixes) {
  expect_format_error(Bytes{}, {"bad.npy", "magic", "not an .npy file"});
  Bytes wrong;
  append(wrong, "PK\x03\x04 zip file");
  expect_format_error(wrong, {"magic", "'PK\\x03\\x04 z'"});
  Bytes short_version;
  append(short_version, "\x93NUMPY\x01");
  expect_format_error(short_version, {"ends inside the format version"});
  Bytes v4;
  append(v4, std::string_view("\x93NUMPY\x04\x00\x00\x00", 10));
  expect_format_error(v4, {"format version 4.0", "expected 1.0, 2.0 or 3.0"});
  Bytes v11;
  append(v11, std::string_view("\x93NUMPY\x01\x01\x00\x00", 10));
  expect_format_error(v11, {"format version 1.1"});
  Bytes short_length;
  append(short_length, std::string_view("\x93NUMPY\x02\x00\x10\x00", 10));
  expect_format_error(short_length, {"ends inside the header length", "at least 12"});
  Bytes past;
  append(past, std::string_view("\x93NUMPY\x01\x00\xff\x00{}", 12));
  expect_format_error(past, {"header length 255", "2 bytes", "truncated"});
}

TEST(NpyTest, RejectsWhatMxqDoesNotRead) {
  expect_format_error(
      with_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", Bytes(16)),
      {"bad.npy", "fortran_order is True", "C-order"});
  expect_format_error(
      with_dict("{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }", Bytes(4)),
      {"'>f4'", "big-endian", "'<f4'"});
  expect_format_error(
      with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (1,), }", Bytes(8)),
      {"'<f8'", "not supported", "'<f4', '<f2', '<i4', '<i8', '|u1'"});
  expect_format_error(
      with_dict("{'descr': '|b1', 'fortran_order': False, 'shape': (1,), }", Bytes(1)),
      {"'|b1'", "not supported"});
  expect_format_error(
      with_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (), }", Bytes(4)),
      {"structured dtypes"});
}

TEST(NpyTest, RejectsMalformedDicts) {
  const auto dict = [](std::string_view shape) {
    return with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': " + std::string(shape) +
                     ", }");
  };
  expect_format_error(with_dict("['descr', '<f4']"), {"header", "'{'", "found '['descr'"});
  expect_format_error(with_dict("{'descr': '<f4', 'shape': (), }", Bytes(4)),
                      {"no 'fortran_order' key"});
  expect_format_error(with_dict("{'fortran_order': False, 'shape': (), }", Bytes(4)),
                      {"no 'descr' key"});
  expect_format_error(with_dict("{'descr': '<f4', 'fortran_order': False, }"), {"no 'shape' key"});
  expect_format_error(
      with_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (), }"),
      {"'descr' appears twice"});
  expect_format_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (), 'x': 1}"),
                      {"unexpected key 'x'"});
  expect_format_error(with_dict("{'descr': '<f4', 'fortran_order': Tru, 'shape': (), }"),
                      {"True or False"});
  expect_format_error(with_dict("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (), }"),
                      {"True or False"});
  expect_format_error(with_dict("{'descr': '<f4, 'fortran_order': False, 'shape': (), }"),
                      {"header"});
  expect_format_error(with_dict("{'descr': '<f\\x34', 'fortran_order': False, 'shape': (), }"),
                      {"escape sequences"});
  expect_format_error(with_dict("{'descr': '<f4' 'fortran_order': False, 'shape': (), }"),
                      {"',' or '}'"});
  expect_format_error(with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (), } x"),
                      {"only spaces", "found 'x"});
  expect_format_error(npy_image("{'descr': '<f4', 'fortran_order': False, 'shape': ("),
                      {"found the end of the header"});
  expect_format_error(dict("(5)"), {"'(n)' is not a tuple", "'(n,)'"});
  expect_format_error(dict("(-1,)"), {"shape[0]", "non-negative integer", "found '-1"});
  expect_format_error(dict("(2, 3.5)"), {"',' or ')' in the shape tuple", "found '.5"});
  expect_format_error(dict("(2L, 3L)"), {"after shape[0]"});
  expect_format_error(dict("(2,,)"), {"shape[1]"});
  expect_format_error(dict("[2, 3]"), {"a tuple such as (2, 3)"});
  expect_format_error(dict("(1, 1, 1, 1, 1, 1, 1, 1, 1)"), {"at most 8 dimensions"});
  expect_format_error(dict("(9223372036854775808,)"), {"shape[0] does not fit"});
  expect_format_error(dict("(4294967296, 4294967296)"),
                      {"[4294967296, 4294967296]", "too large", "2^63 bytes"});
  // Empty, yet its strides would overflow: refused like numpy refuses it.
  expect_format_error(dict("(3000000000, 0, 3000000000)"), {"too large"});
}

TEST(NpyTest, ChecksThePayloadSizeAgainstTheFile) {
  const std::string header = "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 2), }";
  expect_format_error(with_dict(header, Bytes(31)), {"expected 32 bytes of array data", "[2, 2]",
                                                     "i64", "found 31", "truncated"});
  expect_format_error(with_dict(header, Bytes(33)),
                      {"expected 32 bytes", "found 33", "1 unexpected bytes at the end"});
  EXPECT_EQ(parse_npy(with_dict(header, Bytes(32))).numel(), 4);
}

TEST(NpyTest, EveryTruncationIsAnErrorNeverACrash) {
  TempDir dir;
  write_npy(dir.file("full.npy"), random_tensor(DType::kI32, Shape{3, 5}, 5));
  const Bytes full = testing::read_file(dir.file("full.npy"));
  ASSERT_EQ(full.size(), 128u + 60u);
  for (std::size_t length = 0; length < full.size(); ++length) {
    SCOPED_TRACE(length);
    const Bytes prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(length));
    EXPECT_THROW((void)parse_npy(prefix), Error);
    testing::write_file(dir.file("cut.npy"), prefix);
    EXPECT_THROW((void)read_npy(dir.file("cut.npy")), Error);
  }
}

TEST(NpyTest, ReadErrorsNameThePath) {
  TempDir dir;
  expect_error([&] { (void)read_npy(dir.file("missing.npy")); }, ErrorCode::kIo,
               {"missing.npy", "cannot open"});
}

TEST(NpyTest, WriterRefusesAndLeavesNothingBehind) {
  TempDir dir;
  const std::string path = dir.file("out.npy");
  const Tensor good = random_tensor(DType::kF32, Shape{4, 4}, 9);
  write_npy(path, good);
  const Bytes before = testing::read_file(path);

  const Tensor bf16 = random_tensor(DType::kBF16, Shape{4}, 10);
  expect_error([&] { write_npy(path, bf16); }, ErrorCode::kUnsupported,
               {"f32, f16, i32, i64 or u8", "found bf16"});
  const TensorView strided(good.data(), DType::kF32, Shape{4, 2}, Shape{4, 2}, Device::cpu());
  expect_error([&] { write_npy(path, strided); }, ErrorCode::kInvalidArgument, {"contiguous"});
  const TensorView on_gpu(good.data(), DType::kF32, Shape{4, 4}, Device::cuda(1));
  expect_error([&] { write_npy(path, on_gpu); }, ErrorCode::kDeviceMismatch, {"cuda:1"});
  expect_error([&] { write_npy(dir.file("missing/dir/x.npy"), good); }, ErrorCode::kIo,
               {"temporary file"});

  EXPECT_EQ(testing::read_file(path), before);
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"out.npy"});
}

// Permissions are what writing in place would give: a new file 0666 & ~umask, a replaced file
// its own permission bits (the atomic writer's temporary file must not impose its mode).
TEST(NpyTest, WriterGivesANewFileTheUmaskAndAReplacedFileItsOwnPermissions) {
  TempDir dir;
  const std::string path = dir.file("out.npy");
  const Tensor tensor = random_tensor(DType::kF32, Shape{4}, 3);
  const auto mode_of = [&] {
    struct stat st {};
    EXPECT_EQ(::stat(path.c_str(), &st), 0);
    return st.st_mode & 07777;
  };
  const mode_t umask_before = ::umask(027);
  write_npy(path, tensor);
  EXPECT_EQ(mode_of(), 0640U);
  ASSERT_EQ(::chmod(path.c_str(), 0604), 0);
  write_npy(path, tensor);
  EXPECT_EQ(mode_of(), 0604U);
  ASSERT_EQ(::chmod(path.c_str(), 0600), 0);
  write_npy(path, tensor);
  EXPECT_EQ(mode_of(), 0600U);
  ::umask(umask_before);
  EXPECT_EQ(dir.listing(), std::vector<std::string>{"out.npy"});
}

}  // namespace
}  // namespace mxq::io
