// Drives a Tandem gateway through the official `openai` npm package and prints what came back
// as one JSON object, for tests/integration/openai_api_test.cc to compare with the gRPC SDK.
//   node tests/openai/client.mjs BASE_URL PROMPT MAX_TOKENS CHAT_MESSAGE
import OpenAI from "openai";

const [baseURL, prompt, maxTokensText, chatMessage] = process.argv.slice(2);
const maxTokens = Number(maxTokensText);
const client = new OpenAI({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60_000 });
const out = {};

const models = await client.models.list();
out.models = models.data.map((m) => m.id);
const model = out.models[0];

const completion = await client.completions.create({
  model, prompt, max_tokens: maxTokens, temperature: 0,
});
out.completion = {
  text: completion.choices[0].text,
  finish_reason: completion.choices[0].finish_reason,
  usage: completion.usage,
};

const stream = await client.completions.create({
  model, prompt, max_tokens: maxTokens, temperature: 0, stream: true,
  stream_options: { include_usage: true },
});
out.completion_stream = { text: "", chunks: 0, finish_reason: null, usage: null };
for await (const chunk of stream) {
  if (chunk.usage) out.completion_stream.usage = chunk.usage;
  if (chunk.choices.length === 0) continue;
  out.completion_stream.chunks += 1;
  out.completion_stream.text += chunk.choices[0].text;
  if (chunk.choices[0].finish_reason) out.completion_stream.finish_reason = chunk.choices[0].finish_reason;
}

const messages = [{ role: "user", content: chatMessage }];
const chat = await client.chat.completions.create({
  model, messages, max_tokens: maxTokens, temperature: 0,
});
out.chat = {
  role: chat.choices[0].message.role,
  content: chat.choices[0].message.content,
  finish_reason: chat.choices[0].finish_reason,
  usage: chat.usage,
};

const chatStream = await client.chat.completions.create({
  model, messages, max_tokens: maxTokens, temperature: 0, stream: true,
});
out.chat_stream = { role: null, content: "", finish_reason: null };
for await (const chunk of chatStream) {
  const choice = chunk.choices[0];
  if (!choice) continue;
  if (choice.delta.role) out.chat_stream.role = choice.delta.role;
  if (choice.delta.content) out.chat_stream.content += choice.delta.content;
  if (choice.finish_reason) out.chat_stream.finish_reason = choice.finish_reason;
}

// Errors come back as the SDK's typed errors, with OpenAI's error body.
out.errors = {};
for (const [name, request] of [
  ["unknown_model", { model: "no-such-model", prompt, max_tokens: 4 }],
  ["bad_temperature", { model, prompt, max_tokens: 4, temperature: 5 }],
]) {
  try {
    await client.completions.create(request);
    out.errors[name] = { status: 200 };
  } catch (e) {
    out.errors[name] = {
      status: e.status, class: e.constructor.name, message: e.error?.message ?? String(e),
      type: e.error?.type ?? null,
    };
  }
}

process.stdout.write(JSON.stringify(out) + "\n");
