// Unknown-field check for Kubernetes objects. The Kubernetes OpenAPI schemas (and so
// kubernetes-models' validators) accept properties they do not define, but the API server
// rejects or drops them (kubectl's strict field validation), so a misspelt field such as
// `readinesProbe` would pass schema validation and silently do nothing. This walks an object
// along the TypeScript declarations that kubernetes-models generates from the same OpenAPI
// document (`export interface IContainer { "args"?: Array<string>; ... }`) and reports every
// property that the declared type does not have.
//
// The declarations use a small, regular subset of TypeScript, parsed here: interfaces, type
// aliases, re-exports (`export { IX as Alias }`), imports, and type expressions made of
// primitives, literals, names, Array<T>, unions and object literals (properties and
// `[key: string]: T` index signatures).
import fs from "node:fs";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

function tokenize(text) {
  const tokens = [];
  const re =
    /\s+|\/\*[\s\S]*?\*\/|\/\/[^\n]*|("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|([A-Za-z_$][\w$]*)|(-?\d+(?:\.\d+)?)|(=>|[{}()[\]<>:;?|,=.&*])/y;
  let m;
  while (re.lastIndex < text.length) {
    const at = re.lastIndex;
    m = re.exec(text);
    if (!m) throw new Error(`cannot read declarations at offset ${at}: ${text.slice(at, at + 40)}`);
    if (m[1] !== undefined) tokens.push({ t: "str", v: JSON.parse(m[1].replace(/^'|'$/g, '"')) });
    else if (m[2] !== undefined) tokens.push({ t: "id", v: m[2] });
    else if (m[3] !== undefined) tokens.push({ t: "num", v: m[3] });
    else if (m[4] !== undefined) tokens.push({ t: "p", v: m[4] });
  }
  return tokens;
}

class Parser {
  constructor(tokens, file) {
    this.tokens = tokens;
    this.i = 0;
    this.file = file;
  }
  peek(k = 0) {
    return this.tokens[this.i + k];
  }
  is(v, k = 0) {
    const tok = this.peek(k);
    return tok !== undefined && tok.v === v && tok.t !== "str";
  }
  next() {
    return this.tokens[this.i++];
  }
  expect(v) {
    const tok = this.next();
    if (!tok || tok.v !== v) {
      throw new Error(`${this.file}: expected '${v}', found '${tok ? tok.v : "end"}'`);
    }
    return tok;
  }
  // type := member ('|' member)*
  type() {
    if (this.is("|")) this.next();
    const members = [this.postfix()];
    while (this.is("|")) {
      this.next();
      members.push(this.postfix());
    }
    return members.length === 1 ? members[0] : { kind: "union", members };
  }
  postfix() {
    let t = this.primary();
    while (this.is("[") && this.is("]", 1)) {
      this.next();
      this.next();
      t = { kind: "array", of: t };
    }
    return t;
  }
  primary() {
    const tok = this.next();
    if (tok.t === "str" || tok.t === "num") return { kind: "leaf" };
    if (tok.v === "{") return this.objectBody();
    if (tok.v === "(") {
      const t = this.type();
      this.expect(")");
      return t;
    }
    if (tok.t !== "id") throw new Error(`${this.file}: unexpected '${tok.v}' in a type`);
    if (tok.v === "Array" && this.is("<")) {
      this.next();
      const of = this.type();
      this.expect(">");
      return { kind: "array", of };
    }
    if (this.is("<")) throw new Error(`${this.file}: generic type ${tok.v}<...> not understood`);
    const leaves = [
      "string",
      "number",
      "boolean",
      "any",
      "unknown",
      "object",
      "null",
      "true",
      "false",
    ];
    if (leaves.includes(tok.v)) return { kind: "leaf" };
    return { kind: "ref", name: tok.v, file: this.file };
  }
  // After '{': properties and index signatures up to '}'.
  objectBody() {
    const props = new Map();
    let index = null;
    while (!this.is("}")) {
      if (this.is("[")) {
        this.next();
        this.next(); // key name
        this.expect(":");
        this.next(); // string
        this.expect("]");
        this.expect(":");
        index = this.type();
      } else {
        const name = this.next().v;
        if (this.is("?")) this.next();
        this.expect(":");
        props.set(name, this.type());
      }
      if (this.is(";") || this.is(",")) this.next();
    }
    this.expect("}");
    return { kind: "object", props, index };
  }
}

// One declaration file: what it declares and imports.
class DeclarationFile {
  constructor(file) {
    this.file = file;
    this.types = new Map(); // local name -> type
    this.imports = new Map(); // local name -> module specifier
    this.aliases = new Map(); // exported name -> local name
    const p = new Parser(tokenize(fs.readFileSync(file, "utf8")), file);
    while (p.peek()) {
      if (p.is("import")) {
        p.next();
        if (p.is("type")) p.next();
        p.expect("{");
        const names = [];
        while (!p.is("}")) {
          const name = p.next().v;
          let local = name;
          if (p.is("as")) {
            p.next();
            local = p.next().v;
          }
          names.push(local);
          if (p.is(",")) p.next();
        }
        p.expect("}");
        p.expect("from");
        const spec = p.next().v;
        for (const n of names) this.imports.set(n, spec);
      } else if (p.is("export") && p.is("{", 1)) {
        p.next();
        p.next();
        while (!p.is("}")) {
          const local = p.next().v;
          let exported = local;
          if (p.is("as")) {
            p.next();
            exported = p.next().v;
          }
          this.aliases.set(exported, local);
          if (p.is(",")) p.next();
        }
        p.expect("}");
      } else if (p.is("export") && p.is("interface", 1)) {
        p.next();
        p.next();
        const name = p.next().v;
        while (!p.is("{")) p.next(); // extends ...
        p.next();
        this.types.set(name, p.objectBody());
      } else if (p.is("export") && (p.is("type", 1) || (p.is("declare", 1) && p.is("type", 2)))) {
        p.next();
        if (p.is("declare")) p.next();
        p.next();
        const name = p.next().v;
        p.expect("=");
        this.types.set(name, p.type());
      } else if (p.is("export") && p.is("declare", 1) && p.is("class", 2)) {
        // The model class repeats the interface's fields: skip its body.
        while (!p.is("{")) p.next();
        let depth = 0;
        do {
          const tok = p.next();
          if (tok.v === "{" && tok.t === "p") depth++;
          if (tok.v === "}" && tok.t === "p") depth--;
        } while (depth > 0);
      } else {
        p.next();
      }
    }
  }
}

const files = new Map();
function declarations(file) {
  if (!files.has(file)) files.set(file, new DeclarationFile(file));
  return files.get(file);
}

function moduleFile(fromFile, spec) {
  if (spec.startsWith(".")) return path.resolve(path.dirname(fromFile), `${spec}.d.ts`);
  return require.resolve(spec).replace(/\.js$/, ".d.ts");
}

// Resolves a name used in `file` to its type.
function resolve(file, name, seen = new Set()) {
  const key = `${file}#${name}`;
  if (seen.has(key)) throw new Error(`circular type ${name} in ${file}`);
  seen.add(key);
  const d = declarations(file);
  if (d.types.has(name)) return d.types.get(name);
  if (d.aliases.has(name) && d.aliases.get(name) !== name)
    return resolve(file, d.aliases.get(name), seen);
  if (d.imports.has(name)) return resolve(moduleFile(file, d.imports.get(name)), name, seen);
  throw new Error(`${file}: type ${name} not found`);
}

function deref(type) {
  while (type.kind === "ref") type = resolve(type.file, type.name);
  return type;
}

// Every property of `value` that `type` does not declare, as JSON paths ("spec.foo").
function unknownFields(value, type, where, out) {
  type = deref(type);
  if (value === null || typeof value !== "object") return out;
  if (type.kind === "union") {
    const candidates = type.members.map(deref).filter((m) => m.kind !== "leaf");
    let best = null;
    for (const member of candidates) {
      const found = unknownFields(value, member, where, []);
      if (best === null || found.length < best.length) best = found;
      if (found.length === 0) break;
    }
    out.push(...(best || []));
  } else if (type.kind === "array") {
    if (Array.isArray(value))
      value.forEach((v, i) => unknownFields(v, type.of, `${where}[${i}]`, out));
  } else if (type.kind === "object" && !Array.isArray(value)) {
    for (const [key, v] of Object.entries(value)) {
      const at = where ? `${where}.${key}` : key;
      if (type.props.has(key)) unknownFields(v, type.props.get(key), at, out);
      else if (type.index) unknownFields(v, type.index, at, out);
      else out.push(at);
    }
  }
  return out;
}

// The unknown fields of object `obj`, whose model module is `spec` (e.g.
// "kubernetes-models/apps/v1/Deployment") declaring interface `I<kind>`.
export function strictCheck(obj, spec, kind) {
  const file = moduleFile(path.join(process.cwd(), "x"), spec);
  return unknownFields(obj, resolve(file, `I${kind}`), "", []);
}
