// Drives a Tandem server that serves a checkpoint as published (Qwen3's tokenizer.json and
// Jinja chat template) through the official `openai` npm package, and computes what a reference
// implementation of tokenizer.json and chat templates (@lenml/tokenizers, a transformers.js
// fork) makes of the same conversations. Prints one JSON object for
// tests/integration/published_model_test.cc to compare.
//   node tests/openai/published.mjs BASE_URL TOKENIZER_DIR
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import OpenAI from "openai";

const [baseURL, tokenizerDir] = process.argv.slice(2);
const repo = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const { TokenizerLoader } = await import(
  join(repo, "tests/tokenizers/node_modules/@lenml/tokenizers/dist/main.mjs"));
const reference = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(readFileSync(join(tokenizerDir, "tokenizer.json"), "utf8")),
  tokenizerConfig: JSON.parse(readFileSync(join(tokenizerDir, "tokenizer_config.json"), "utf8")),
});
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
  // The reference: HF conventions (arguments as objects in templates, as vLLM passes them).
  const refMessages = c.messages.map((m) => !m.tool_calls ? m : {
    ...m,
    tool_calls: m.tool_calls.map((t) => ({ ...t, function: { ...t.function,
      arguments: JSON.parse(t.function.arguments) } })),
  });
  const ids = reference.apply_chat_template(refMessages, {
    tools: c.tools, add_generation_prompt: true, tokenize: true, return_tensor: false,
    ...(c.chat_template_kwargs ?? {}),
  });
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
