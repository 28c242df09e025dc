// Drives the OpenAI fields evaluation tools and chat clients use (logprobs, top_logprobs, echo,
// n with a seed, penalties, logit_bias) through the official `openai` npm package, and prints
// what came back as one JSON object for tests/integration/openai_api_test.cc to check against
// the engine's own log-softmax (echo scoring of the same tokens, and the gRPC SDK).
//   node tests/openai/features.mjs BASE_URL PROMPT MAX_TOKENS CHAT_MESSAGE SCORED_IDS_JSON
// SCORED_IDS_JSON: the prompt's token ids followed by its greedy continuation's.
import OpenAI from "openai";

const [baseURL, prompt, maxTokensText, chatMessage, scoredText] = process.argv.slice(2);
const maxTokens = Number(maxTokensText);
const scored = JSON.parse(scoredText);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120_000 });
const model = (await client.models.list()).data[0].id;
const out = {};

// Completions' logprobs objects from a stream, concatenated.
async function collectCompletion(stream) {
  const got = { text: "", tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [] };
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    got.text += choice.text;
    if (!choice.logprobs) continue;
    for (const key of ["tokens", "token_logprobs", "top_logprobs", "text_offset"]) {
      got[key].push(...choice.logprobs[key]);
    }
  }
  return got;
}

const greedy = { model, prompt, max_tokens: maxTokens, temperature: 0 };
const whole = await client.completions.create({ ...greedy, logprobs: 3 });
out.completion = { text: whole.choices[0].text, logprobs: whole.choices[0].logprobs };
out.completion_stream = await collectCompletion(
  await client.completions.create({ ...greedy, logprobs: 3, stream: true }));

// Chat: logprobs true with top_logprobs, whole and streamed.
const messages = [{ role: "user", content: chatMessage }];
const chat = await client.chat.completions.create({
  model, messages, max_tokens: maxTokens, temperature: 0, logprobs: true, top_logprobs: 2,
});
out.chat = {
  content: chat.choices[0].message.content,
  logprobs: chat.choices[0].logprobs.content,
  completion_tokens: chat.usage.completion_tokens,
};
const chatStream = await client.chat.completions.create({
  model, messages, max_tokens: maxTokens, temperature: 0, logprobs: true, top_logprobs: 2,
  stream: true,
});
out.chat_stream = { content: "", logprobs: [] };
for await (const chunk of chatStream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  if (choice.delta.content) out.chat_stream.content += choice.delta.content;
  if (choice.logprobs) out.chat_stream.logprobs.push(...choice.logprobs.content);
}

// Echo: the prompt and its greedy continuation, scored (lm-evaluation-harness's
// loglikelihood request), and the prompt echoed before a short generation.
const echoed = await client.completions.create({
  model, prompt: scored, echo: true, max_tokens: 0, logprobs: 1, temperature: 0,
});
out.echo_scored = {
  text: echoed.choices[0].text, logprobs: echoed.choices[0].logprobs, usage: echoed.usage,
};
const echoGenerate = await client.completions.create({
  ...greedy, max_tokens: 4, echo: true, logprobs: 0,
});
out.echo_generate = {
  text: echoGenerate.choices[0].text, logprobs: echoGenerate.choices[0].logprobs,
  usage: echoGenerate.usage,
};
out.echo_stream = await collectCompletion(await client.completions.create({
  ...greedy, max_tokens: 4, echo: true, logprobs: 0, stream: true,
}));

// n = 3 with a seed, twice: the same three answers, and not all alike.
const sampled = { model, prompt, max_tokens: maxTokens, temperature: 1.0, seed: 1234, n: 3 };
const first = await client.completions.create(sampled);
const second = await client.completions.create(sampled);
out.n = {
  first: first.choices.map((c) => [c.index, c.text]),
  second: second.choices.map((c) => [c.index, c.text]),
  usage: first.usage,
};
const nStream = { texts: ["", "", ""] };
for await (const chunk of await client.completions.create({ ...sampled, stream: true })) {
  for (const c of chunk.choices) nStream.texts[c.index] += c.text;
}
out.n_stream = nStream.texts;
const chatN = await client.chat.completions.create({
  model, messages, max_tokens: maxTokens, temperature: 1.0, seed: 1234, n: 3,
});
out.chat_n = chatN.choices.map((c) => [c.index, c.message.content]);
const bestOf = await client.completions.create({
  ...greedy, temperature: 1.0, seed: 99, n: 1, best_of: 3, logprobs: 0,
});
out.best_of = { choices: bestOf.choices.length, logprobs: bestOf.choices[0].logprobs };
const candidates = await client.completions.create({
  ...greedy, temperature: 1.0, seed: 99, n: 3, logprobs: 0,
});
out.best_of_candidates = candidates.choices.map((c) => c.logprobs.token_logprobs);

// Penalties and bias, greedy: each token's ids come back through logprobs (0 alternatives).
async function greedyTokens(extra) {
  const r = await client.completions.create({ ...greedy, logprobs: 0, ...extra });
  return { text: r.choices[0].text, tokens: r.choices[0].logprobs.tokens };
}
out.penalties = {
  none: await greedyTokens({}),
  presence: await greedyTokens({ presence_penalty: 2.0 }),
  frequency: await greedyTokens({ frequency_penalty: 2.0 }),
  repetition: await greedyTokens({ repetition_penalty: 2.0 }),
  // The greedy first token, banned.
  banned: await greedyTokens({ logit_bias: { [String(scored[scored.length - maxTokens])]: -100 } }),
};

out.errors = {};
for (const [name, request] of [
  ["logprobs_too_many", { ...greedy, logprobs: 21 }],
  ["top_logprobs_without_logprobs", { chat: true, model, messages, top_logprobs: 2 }],
  ["n_too_many", { ...greedy, n: 17 }],
  ["best_of_below_n", { ...greedy, n: 3, best_of: 2 }],
  ["presence_out_of_range", { ...greedy, presence_penalty: 3 }],
  ["logit_bias_not_a_token", { ...greedy, logit_bias: { hello: 1 } }],
  ["logit_bias_out_of_vocabulary", { ...greedy, logit_bias: { "99999999": 1 } }],
  ["max_tokens_zero_without_echo", { ...greedy, max_tokens: 0 }],
]) {
  try {
    const { chat: isChat, ...body } = request;
    if (isChat) await client.chat.completions.create(body);
    else await client.completions.create(body);
    out.errors[name] = { status: 200 };
  } catch (e) {
    out.errors[name] = { status: e.status, message: e.error?.message ?? String(e), param: e.error?.param ?? null };
  }
}

process.stdout.write(JSON.stringify(out) + "\n");
