// Encodes text chunks with the reference implementation of tokenizer.json (@lenml/tokenizers,
// a transformers.js fork, installed by scripts/setup.sh into tests/tokenizers/node_modules),
// for hf_tokenizer_reference_test.cc.
//
//   node tokenizer_reference.mjs MODEL_DIR CHUNKS_JSON OUT_JSON
//
// MODEL_DIR holds tokenizer.json and tokenizer_config.json; CHUNKS_JSON is a JSON list of
// strings. Writes {"ids": [[...], ...], "seconds": S}: each chunk's ids without the special
// tokens a post-processor adds, and the seconds spent encoding (not loading).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";
import { fileURLToPath, pathToFileURL } from "node:url";

const [modelDir, chunksPath, outPath] = process.argv.slice(2);
if (!outPath) {
  console.error("usage: node tokenizer_reference.mjs MODEL_DIR CHUNKS_JSON OUT_JSON");
  process.exit(2);
}
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../..");
const require = createRequire(path.join(root, "tests/tokenizers/package.json"));
const { TokenizerLoader } = await import(pathToFileURL(require.resolve("@lenml/tokenizers")).href);

const read = (name) => JSON.parse(fs.readFileSync(path.join(modelDir, name), "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: read("tokenizer.json"),
  tokenizerConfig: read("tokenizer_config.json"),
});
const chunks = JSON.parse(fs.readFileSync(chunksPath, "utf8"));
const start = process.hrtime.bigint();
const ids = chunks.map((text) => tokenizer.encode(text, { add_special_tokens: false }));
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
fs.writeFileSync(outPath, JSON.stringify({ ids, seconds }));
