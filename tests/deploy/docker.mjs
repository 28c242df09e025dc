// Dockerfile checks: dockerfile-utils' validator (the Docker language server's: instructions,
// flags, durations, signals, JSON forms), then the image's contract with deploy/: a
// debian:bookworm build stage that installs through scripts/setup.sh --build, a
// debian:bookworm-slim runtime stage running as a non-root user with a HEALTHCHECK, STOPSIGNAL
// SIGTERM and the ports 50051/8080, libtandem_spm.so beside the binaries, and COPY sources
// that exist and that .dockerignore keeps.
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const dockerfileUtils = require("dockerfile-utils");

// Instructions with continuation lines joined and comments dropped: [{line, keyword, args}].
export function instructions(text) {
  const out = [];
  let current = null;
  text.split("\n").forEach((raw, i) => {
    const line = raw.replace(/\r$/, "");
    if (current === null && /^\s*(#|$)/.test(line)) return;
    if (current !== null && /^\s*#/.test(line)) return;
    const continued = /\\\s*$/.test(line);
    const body = continued ? line.replace(/\\\s*$/, "") : line;
    if (current === null) {
      const m = body.trim().match(/^(\S+)\s*(.*)$/);
      current = { line: i + 1, keyword: m[1].toUpperCase(), args: m[2] };
    } else {
      current.args += ` ${body.trim()}`;
    }
    if (!continued) {
      current.args = current.args.trim();
      out.push(current);
      current = null;
    }
  });
  return out;
}

// Whether .dockerignore's patterns leave out `rel` (a path in the build context). Patterns as
// Docker reads them: relative to the context root, `*` and `?` within a path element, `**`
// across elements, and a match on a directory leaves out everything below it.
export function ignored(patterns, rel) {
  let out = false;
  for (let p of patterns) {
    const negate = p.startsWith("!");
    if (negate) p = p.slice(1);
    p = p.replace(/^\/+/, "").replace(/\/+$/, "");
    const re = new RegExp(
      `^${p
        .split("/")
        .map((part) =>
          part === "**"
            ? "(?:.*)"
            : part
                .replace(/[.+^${}()|[\]\\]/g, "\\$&")
                .replace(/\*/g, "[^/]*")
                .replace(/\?/g, "[^/]"),
        )
        .join("/")
        .replace(/\(\?:\.\*\)\//g, "(?:.*/)?")}(?:/.*)?$`,
    );
    if (re.test(rel)) out = !negate;
  }
  return out;
}

export function dockerignorePatterns(repo) {
  const file = path.join(repo, ".dockerignore");
  if (!fs.existsSync(file)) return null;
  return fs
    .readFileSync(file, "utf8")
    .split("\n")
    .map((l) => l.trim())
    .filter((l) => l && !l.startsWith("#"));
}

// dockerfile-utils' findings alone, as "rel: line N: message".
export function lintDockerfile(repo, rel) {
  return dockerfileUtils
    .validate(fs.readFileSync(path.join(repo, rel), "utf8"))
    .map((d) => `${rel}: line ${d.range.start.line + 1}: ${d.message}`);
}

export function checkDockerfile(repo, rel) {
  const errors = [];
  const where = rel;
  const e = (msg) => errors.push(`${where}: ${msg}`);
  const text = fs.readFileSync(path.join(repo, rel), "utf8");
  for (const d of dockerfileUtils.validate(text)) {
    e(`line ${d.range.start.line + 1}: ${d.message}`);
  }
  const all = instructions(text);
  const stages = [];
  for (const ins of all) {
    if (ins.keyword === "FROM") stages.push({ from: ins, body: [] });
    else if (stages.length) stages[stages.length - 1].body.push(ins);
  }
  if (stages.length < 2) {
    e("expected a build stage and a runtime stage");
    return errors;
  }
  const image = (ins) => ins.args.split(/\s+/).filter((a) => !a.startsWith("--"))[0];
  if (image(stages[0].from) !== "debian:bookworm")
    e(`the build stage is FROM ${image(stages[0].from)}, want debian:bookworm`);
  if (
    !stages[0].body.some((i) => i.keyword === "RUN" && /scripts\/setup\.sh --build/.test(i.args))
  ) {
    e("the build stage does not install through scripts/setup.sh --build");
  }
  const runtime = stages[stages.length - 1];
  if (image(runtime.from) !== "debian:bookworm-slim")
    e(`the runtime stage is FROM ${image(runtime.from)}, want debian:bookworm-slim`);
  const last = (kw) => runtime.body.filter((i) => i.keyword === kw).pop();
  const user = last("USER");
  if (!user || /^(root|0)(:|$)/.test(user.args))
    e("the runtime stage runs as root (no USER, or USER root)");
  const health = last("HEALTHCHECK");
  if (!health || /^NONE$/i.test(health.args)) e("the runtime stage has no HEALTHCHECK");
  if (last("STOPSIGNAL")?.args !== "SIGTERM")
    e("the runtime stage does not say STOPSIGNAL SIGTERM");
  const exposed = runtime.body
    .filter((i) => i.keyword === "EXPOSE")
    .flatMap((i) => i.args.split(/\s+/));
  for (const port of ["50051", "8080"])
    if (!exposed.includes(port)) e(`the runtime stage does not EXPOSE ${port}`);
  if (!last("ENTRYPOINT") && !last("CMD")) e("the runtime stage has no ENTRYPOINT or CMD");
  // The tokenizer dlopens libtandem_spm.so from bin/../lib (common/model/tokenizer.cc); ldd
  // does not see it, so the image must carry it explicitly.
  const spmBuilt = stages[0].body.some(
    (i) => i.keyword === "RUN" && /libtandem_spm\.so/.test(i.args),
  );
  const libCopied = runtime.body.some(
    (i) => i.keyword === "COPY" && /\s\/opt\/tandem\/lib\/?$/.test(i.args),
  );
  if (!spmBuilt || !libCopied)
    e("libtandem_spm.so is not copied to /opt/tandem/lib (the tokenizer loads it from bin/../lib)");

  const patterns = dockerignorePatterns(repo);
  if (!patterns) {
    e("no .dockerignore at the repository root");
  } else {
    for (const must of ["build", ".cache", "node_modules"]) {
      const probe = must === "node_modules" ? "tests/openai/node_modules/x" : `${must}/x`;
      if (!ignored(patterns, probe)) errors.push(`.dockerignore: does not leave out ${must}`);
    }
  }
  for (const ins of all.filter((i) => i.keyword === "COPY" || i.keyword === "ADD")) {
    const words = ins.args.split(/\s+/);
    if (words.some((w) => w.startsWith("--from="))) continue;
    const sources = words.filter((w) => !w.startsWith("--")).slice(0, -1);
    for (const src of sources) {
      if (src === ".") continue;
      if (!fs.existsSync(path.join(repo, src)))
        e(`line ${ins.line}: COPY source ${src} does not exist`);
      else if (patterns && ignored(patterns, src.replace(/\/+$/, ""))) {
        e(`line ${ins.line}: COPY source ${src} is left out by .dockerignore`);
      }
    }
  }
  return errors;
}
