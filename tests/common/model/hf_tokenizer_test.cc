#include "common/model/hf_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace tandem::model {
namespace {

TEST(HfTokenizerTest, Placeholder) {}

}  // namespace
}  // namespace tandem::model
