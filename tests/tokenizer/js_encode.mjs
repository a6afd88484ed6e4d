// Encode JSON-lines strings with the pure-JS @huggingface/tokenizers package,
// for the differential test (tests/tokenizer/test_tokenizer_diff.c).
//   node js_encode.mjs CACHE TOKDIR IN OUT
// CACHE holds node_modules/@huggingface/tokenizers (scripts/fetch-tokenizers.sh);
// TOKDIR holds tokenizer.json and tokenizer_config.json. Each line of IN is a
// JSON string; each line of OUT the JSON list of ids (special tokens added).
import fs from "fs";
import path from "path";
import { pathToFileURL } from "url";

const [cache, dir, inPath, outPath] = process.argv.slice(2);
const pkg = path.join(cache, "node_modules/@huggingface/tokenizers/dist/tokenizers.mjs");
const { Tokenizer } = await import(pathToFileURL(pkg).href);
const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
const config = fs.existsSync(path.join(dir, "tokenizer_config.json")) ? read("tokenizer_config.json") : {};
const tok = new Tokenizer(read("tokenizer.json"), config);
const out = [];
for (const line of fs.readFileSync(inPath, "utf8").split("\n")) {
  if (line === "") continue;
  out.push(JSON.stringify(tok.encode(JSON.parse(line)).ids));
}
fs.writeFileSync(outPath, out.join("\n") + "\n");
