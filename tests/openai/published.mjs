// Drives a Tandem server that serves a checkpoint as published (Qwen3's tokenizer.json and
// Jinja chat template) through the official `openai` npm package, and computes what the
// references make of the same conversations: Python's jinja2 configured as transformers
// configures it (tests/common/chat/render_reference.py) renders them, and a reference
// implementation of tokenizer.json (@lenml/tokenizers, a transformers.js fork; its own Jinja
// cannot parse Qwen3's template) encodes the result. Prints one JSON object for
// tests/integration/published_model_test.cc to compare.
//   node tests/openai/published.mjs BASE_URL TOKENIZER_DIR
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";

const [baseURL, tokenizerDir] = process.argv.slice(2);
const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const { TokenizerLoader } = await import(
  join(repo, "tests/tokenizers/node_modules/@lenml/tokenizers/dist/main.mjs"));
const tokenizerConfig = JSON.parse(readFileSync(join(tokenizerDir, "tokenizer_config.json"), "utf8"));
const reference = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(join(tokenizerDir, "tokenizer.json"), "utf8")),
  tokenizerConfig: { ...tokenizerConfig, chat_template: undefined },
});
// transformers' apply_chat_template: the special tokens, then the conversation's variables;
// assistant tool calls' arguments as objects, as vLLM passes them.
const render = (c) => {
  const context = {};
  for (const key of ["bos_token", "eos_token", "unk_token", "pad_token"]) {
    const token = tokenizerConfig[key];
    const text = typeof token === "string" ? token : token?.content;
    if (typeof text === "string") context[key] = text;
  }
  Object.assign(context, {
    messages: c.messages.map((m) => !m.tool_calls ? m : {
      ...m,
      tool_calls: m.tool_calls.map((t) => ({ ...t, function: { ...t.function,
        arguments: JSON.parse(t.function.arguments) } })),
    }),
    tools: c.tools ?? null, documents: null, add_generation_prompt: true,
    ...(c.chat_template_kwargs ?? {}),
  });
  const out = JSON.parse(execFileSync("/usr/bin/python3",
    [join(repo, "tests/common/chat/render_reference.py")],
    { input: JSON.stringify({ now: 0, cases: [{ template: tokenizerConfig.chat_template, context }] }) }));
  if (!out[0].ok) throw new Error(out[0].error);
  return out[0].output;
};
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 120_000 });
const root = baseURL.replace(/\/v1$/, "");
const post = async (path, body) => {
  const response = await fetch(root + path, {
    method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body),
  });
  return { status: response.status, body: await response.json() };
};

const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather in a city",
    parameters: {
      type: "object",
      properties: { city: { type: "string", description: "City name" },
                    unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
      required: ["city"],
    },
  },
}];
const conversations = {
  plain: { messages: [{ role: "system", content: "You are terse." },
                      { role: "user", content: "Hello, world! 你好 👋" }] },
  tools: { messages: [{ role: "user", content: "Weather in Paris?" }], tools },
  tool_history: {
    messages: [
      { role: "user", content: "Weather in Paris and Oslo?" },
      { role: "assistant", content: "",
        tool_calls: [
          { id: "call_1", type: "function",
            function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } },
          { id: "call_2", type: "function",
            function: { name: "get_weather", arguments: "{\"city\": \"Oslo\", \"unit\": \"celsius\"}" } }] },
      { role: "tool", tool_call_id: "call_1", content: "18 C, sunny" },
      { role: "tool", tool_call_id: "call_2", content: "4 C, rain" },
    ],
    tools,
  },
  thinking_off: { messages: [{ role: "user", content: "2+2?" }],
                  chat_template_kwargs: { enable_thinking: false } },
  thinking_history: {
    messages: [{ role: "user", content: "2+2?" },
               { role: "assistant", content: "<think>\nSimple sum.\n</think>\n\n4" },
               { role: "user", content: "And 3+3?" }],
    chat_template_kwargs: { enable_thinking: true } },
};

const out = { tokenize: {}, chat: {}, models: null };
out.models = (await client.models.list()).data.map((m) => m.id);
const model = out.models[0];

for (const [name, c] of Object.entries(conversations)) {
  // The reference: no special tokens added (the template wrote them).
  const ids = reference.encode(render(c), { add_special_tokens: false });
  const ours = await post("/tokenize", {
    model, messages: c.messages, tools: c.tools, add_generation_prompt: true,
    chat_template_kwargs: c.chat_template_kwargs,
  });
  out.tokenize[name] = { reference: Array.from(ids), status: ours.status, ours: ours.body.tokens };

  const request = { model, messages: c.messages, tools: c.tools, max_tokens: 8, temperature: 0,
                    chat_template_kwargs: c.chat_template_kwargs };
  const whole = await client.chat.completions.create(request);
  const message = whole.choices[0].message;
  const stream = await client.chat.completions.create({ ...request, stream: true });
  const streamed = { content: "", reasoning_content: "", tool_calls: [], finish_reason: null };
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    if (choice.delta.content) streamed.content += choice.delta.content;
    if (choice.delta.reasoning_content) streamed.reasoning_content += choice.delta.reasoning_content;
    for (const call of choice.delta.tool_calls ?? []) streamed.tool_calls.push(call.function.name);
    if (choice.finish_reason) streamed.finish_reason = choice.finish_reason;
  }
  out.chat[name] = {
    role: message.role,
    content: message.content ?? "",
    reasoning_content: message.reasoning_content ?? "",
    tool_calls: (message.tool_calls ?? []).map((t) => t.function.name),
    finish_reason: whole.choices[0].finish_reason,
    prompt_tokens: whole.usage.prompt_tokens,
    streamed,
  };
}

const text = "Hello, world!";
const completionIds = await post("/tokenize", { model, prompt: text });
out.completion_tokenize = {
  ours: completionIds.body.tokens,
  reference: Array.from(reference.encode(text, { add_special_tokens: true })),
};
out.detokenize = (await post("/detokenize", { model, tokens: completionIds.body.tokens })).body;
out.bad_tool = await post("/v1/chat/completions", {
  model, messages: [{ role: "user", content: "x" }], tools: [{ type: "function", function: {} }],
});
console.log(JSON.stringify(out));
