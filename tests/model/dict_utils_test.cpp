#include <gtest/gtest.h>
#include "model/dict_utils.h"
#include "model/errors.h"
using namespace ckptsim::model;
TEST(Smoke, MergeDuplicate) {
  Value a = dict_value({{"x", Value(1)}});
  Value b = dict_value({{"x", Value(1)}});
  EXPECT_THROW(merge(a, b), MergeError);
}
