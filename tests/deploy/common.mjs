// What the deployment checks share: the services' flags (from their --help) and config files.
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";

// The binaries' flags, when known, else null. Keys: the binary's name ("tandem-prefill").
export class Flags {
  constructor(binDir) {
    this.binDir = binDir;
    this.cache = new Map();
  }
  // flag name -> default text, from `BINARY --help`; null without a bin dir.
  of(binary) {
    if (!this.binDir) return null;
    if (!this.cache.has(binary)) {
      const help = execFileSync(path.join(this.binDir, binary), ["--help"], { encoding: "utf8" });
      const flags = new Map();
      for (const m of help.matchAll(/^ {2}--([a-z0-9_]+) {2}.*\(default: "(.*)"\)$/gm)) {
        flags.set(m[1], m[2]);
      }
      if (flags.size < 5) throw new Error(`${binary} --help listed no flags`);
      this.cache.set(binary, flags);
    }
    return this.cache.get(binary);
  }
}

// The defaults the checks assume when the binaries are not at hand (service_flags.cc).
const kDefaults = { host: "127.0.0.1", grpc_port: "0", http_port: "0", drain_timeout_s: "10" };

// Parses a flat YAML config as common/config/config.cc does: "key: value" lines, '#'
// comments, optional quotes. Throws on what the services would refuse.
export function parseFlatYaml(text, source) {
  const out = new Map();
  text.split("\n").forEach((line, i) => {
    const stripped = line.trim();
    if (stripped === "" || stripped.startsWith("#") || stripped === "---") return;
    if (line.startsWith(" ") || line.startsWith("\t")) {
      throw new Error(`${source}:${i + 1}: nested YAML is not supported`);
    }
    const colon = stripped.indexOf(":");
    if (colon < 0) throw new Error(`${source}:${i + 1}: expected 'key: value'`);
    const key = stripped.slice(0, colon).trim();
    let value = stripped.slice(colon + 1).trim();
    if (value.startsWith('"') || value.startsWith("'")) {
      const end = value.indexOf(value[0], 1);
      if (end < 0) throw new Error(`${source}:${i + 1}: unterminated quote`);
      value = value.slice(1, end);
    } else if (value.includes(" #")) {
      value = value.slice(0, value.indexOf(" #")).trim();
    }
    if (out.has(key)) throw new Error(`${source}:${i + 1}: key '${key}' appears twice`);
    out.set(key, value);
  });
  return out;
}

// A service's effective settings: defaults < config file < environment (TANDEM_<ROLE>_<FLAG>),
// as the services apply them. `env` maps variable names to values (null: set from elsewhere,
// e.g. the downward API). Reports unknown keys through `errors`.
export function effectiveSettings({ binary, config, env, flags, where, errors }) {
  const known = flags.of(binary);
  const settings = new Map(Object.entries(kDefaults));
  if (known) for (const [k, v] of known) settings.set(k, v);
  for (const [key, value] of config) {
    if (known && !known.has(key))
      errors.push(`${where}: config key '${key}' is not a flag of ${binary}`);
    if (key === "config") errors.push(`${where}: a config file cannot set 'config'`);
    settings.set(key, value);
  }
  const prefix = `TANDEM_${binary.replace(/^tandem-/, "").toUpperCase()}_`;
  for (const [name, value] of env) {
    if (!name.startsWith(prefix)) continue;
    const key = name.slice(prefix.length).toLowerCase();
    if (known && !known.has(key)) errors.push(`${where}: ${name} sets no flag of ${binary}`);
    settings.set(key, value);
  }
  return settings;
}

// "host:port" list of a gateway target flag.
export function targets(text) {
  return (text || "")
    .split(",")
    .filter((t) => t !== "")
    .map((t) => {
      const i = t.lastIndexOf(":");
      return { host: t.slice(0, i), port: Number(t.slice(i + 1)) };
    });
}

export function readRepoFile(repo, rel) {
  return fs.readFileSync(path.join(repo, rel), "utf8");
}
