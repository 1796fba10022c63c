/** A Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json, optional chat_template.jinja)
 *  turned into the project's Tokenizer: BPE encode/decode via @huggingface/tokenizers, the chat template
 *  via @huggingface/jinja, and encodeChat's assistant mask. Hub id resolution lives elsewhere; this file
 *  only reads a local folder. Both libraries' objects are built once here, never per call. */
import { promises as fs } from "node:fs";
import * as path from "node:path";
import { Tokenizer as HfTokenizer } from "@huggingface/tokenizers";
import { Template } from "@huggingface/jinja";
import type { ChatMessage, Tokenizer, ToolSchema } from "./types.ts";
import { BadFileError } from "../util/errors.ts";
import { isFile } from "../util/fs.ts";

type ChatOpts = { tools?: ToolSchema[]; addGenerationPrompt?: boolean };
/** tokenizer_config.json's chat_template: one string, or named templates ("default", "tool_use", ...). */
type TemplateSource = string | { name: string; template: string }[];

const ROLES = new Set(["system", "user", "assistant", "tool"]);

/** Read a tokenizer folder. Errors name the file that is missing or broken. */
export async function loadTokenizerFromDir(dir: string): Promise<Tokenizer> {
  const tokenizerJson = await readJson(path.join(dir, "tokenizer.json"));
  const configFile = path.join(dir, "tokenizer_config.json");
  const tokenizerConfig = await readJson(configFile);
  // Newer transformers save the template as its own file; it wins over tokenizer_config's copy, as there.
  const jinjaFile = path.join(dir, "chat_template.jinja");
  const jsonFile = path.join(dir, "chat_template.json");
  let template: TemplateSource | undefined;
  let templateFile = configFile;
  if (await isFile(jinjaFile)) {
    template = await fs.readFile(jinjaFile, "utf8");
    templateFile = jinjaFile;
  } else if (tokenizerConfig.chat_template !== undefined && tokenizerConfig.chat_template !== null) {
    template = tokenizerConfig.chat_template as TemplateSource;
  } else if (await isFile(jsonFile)) {
    template = (await readJson(jsonFile)).chat_template as TemplateSource;
    templateFile = jsonFile;
  }
  return tokenizerFromJson(tokenizerJson, tokenizerConfig, template, {
    tokenizerFile: path.join(dir, "tokenizer.json"),
    configFile,
    templateFile,
  });
}

/** Build from already-parsed files (the tiny preset builds them in memory). `files` only names the
 *  sources in error messages. */
export function tokenizerFromJson(
  tokenizerJson: Record<string, unknown>,
  tokenizerConfig: Record<string, unknown>,
  chatTemplate: TemplateSource | undefined = tokenizerConfig.chat_template as TemplateSource | undefined,
  files = { tokenizerFile: "tokenizer.json", configFile: "tokenizer_config.json", templateFile: "tokenizer_config.json" },
): Tokenizer {
  if (typeof tokenizerJson.model !== "object" || tokenizerJson.model === null)
    throw new Error(`${files.tokenizerFile} has no "model" section; expected a Hugging Face tokenizers file`);
  let hf: HfTokenizer;
  try {
    hf = new HfTokenizer(tokenizerJson, tokenizerConfig);
  } catch (err) {
    throw new Error(`${files.tokenizerFile} cannot be loaded as a tokenizer: ${(err as Error).message}`);
  }
  const vocab = hf.get_vocab(true);
  let maxId = -1;
  for (const id of vocab.values()) if (id > maxId) maxId = id;

  const tokenId = (key: "eos_token" | "pad_token" | "bos_token" | "unk_token") => {
    const v = tokenizerConfig[key];
    const text = typeof v === "string" ? v : v && typeof v === "object" ? (v as { content?: unknown }).content : undefined;
    if (typeof text !== "string") return undefined;
    const id = hf.token_to_id(text);
    if (id === undefined)
      throw new Error(`${files.configFile}: ${key} ${JSON.stringify(text)} is not in the vocabulary of ${files.tokenizerFile}`);
    return { text, id };
  };
  const eos = tokenId("eos_token");
  if (!eos) throw new Error(`${files.configFile} has no eos_token (expected e.g. "<|im_end|>")`);
  const pad = tokenId("pad_token") ?? eos; // no pad token: pad with eos, as transformers' generate does
  const bos = tokenId("bos_token");
  const unk = tokenId("unk_token");

  const templates = compileTemplates(chatTemplate, files.templateFile);
  const render = (messages: ChatMessage[], opts: ChatOpts = {}): string => {
    checkMessages(messages);
    const tools = opts.tools && opts.tools.length > 0 ? opts.tools : undefined;
    const template = pickTemplate(templates, tools !== undefined, files.templateFile);
    return template.render({
      messages,
      tools,
      add_generation_prompt: opts.addGenerationPrompt ?? false,
      bos_token: bos?.text ?? "",
      eos_token: eos.text,
      pad_token: pad.text,
      unk_token: unk?.text ?? "", // raise_exception and strftime_now come with @huggingface/jinja
    });
  };
  const encode = (text: string): number[] => hf.encode(text, { add_special_tokens: false }).ids;

  return {
    vocabSize: maxId + 1,
    eosTokenId: eos.id,
    padTokenId: pad.id,
    encode,
    decode(ids, opts = {}) {
      for (const id of ids) if (!Number.isInteger(id) || id < 0) throw new Error(`decode: token id ${id} is not a non-negative integer`);
      if (ids.length === 0) return ""; // the HF decoder rejects an empty list
      // Ids past the vocabulary (Qwen pads its embedding to 151936 rows) decode to nothing, as in HF.
      return hf.decode(ids, { skip_special_tokens: opts.skipSpecialTokens ?? false });
    },
    tokenToId: (token) => hf.token_to_id(token),
    applyChatTemplate: render,
    encodeChat(messages, opts = {}) {
      return encodeChat(render, encode, messages, opts);
    },
  };
}

/** Token ids of the rendered chat and a mask of 1 on what the assistant wrote.
 *  Spans come from rendering prefixes: assistant turn i starts where render(messages[:i], generation
 *  prompt on) ends — right after "<|im_start|>assistant\n" — and ends with its closing token, where
 *  render(messages[:i+1]) ends minus the separator whitespace the template puts after it.
 *  The text is tokenized piece by piece at those boundaries. That is exactly what generation sees: the
 *  prompt is encoded up to the header and the model writes from there. Beside special tokens it also
 *  equals whole-text encoding; it differs only when an assistant turn starts with a newline, which BPE
 *  would have merged with the header's "\n". */
function encodeChat(
  render: (m: ChatMessage[], o?: ChatOpts) => string,
  encode: (text: string) => number[],
  messages: ChatMessage[],
  opts: ChatOpts,
): { ids: number[]; assistantMask: number[] } {
  const full = render(messages, opts);
  const cuts: number[] = [0]; // alternating: [0, start1, end1, start2, end2, ...]; odd pieces are the assistant's
  messages.forEach((m, i) => {
    if (m.role !== "assistant") return;
    const before = render(messages.slice(0, i), { tools: opts.tools, addGenerationPrompt: true });
    const upto = render(messages.slice(0, i + 1), { tools: opts.tools, addGenerationPrompt: false });
    if (!upto.startsWith(before) || !full.startsWith(upto) || before.length < cuts[cuts.length - 1])
      throw new Error(
        `encodeChat: the chat template renders messages[0..${i}] differently from the full conversation, so ` +
          `the assistant turn at index ${i} cannot be located`,
      );
    cuts.push(before.length, before.length + upto.slice(before.length).trimEnd().length);
  });
  cuts.push(full.length);
  const ids: number[] = [];
  const assistantMask: number[] = [];
  for (let k = 0; k + 1 < cuts.length; k++) {
    const piece = encode(full.slice(cuts[k], cuts[k + 1]));
    const bit = k % 2; // the assistant wrote odd pieces, the template or other roles the even ones
    for (const id of piece) {
      ids.push(id);
      assistantMask.push(bit);
    }
  }
  return { ids, assistantMask };
}

function compileTemplates(source: TemplateSource | undefined, file: string): Map<string, Template> {
  const out = new Map<string, Template>();
  if (source === undefined || source === null) return out;
  const named = typeof source === "string" ? [{ name: "default", template: source }] : source;
  if (!Array.isArray(named) || named.some((t) => typeof t?.name !== "string" || typeof t?.template !== "string"))
    throw new Error(`${file}: chat_template must be a string or a list of {name, template}, got ${JSON.stringify(source).slice(0, 80)}`);
  for (const { name, template } of named) {
    try {
      out.set(name, new Template(template));
    } catch (err) {
      throw new Error(`${file}: chat template "${name}" does not parse: ${(err as Error).message}`);
    }
  }
  return out;
}

/** transformers' rule: the "tool_use" template when tools are passed and it exists, else "default". */
function pickTemplate(templates: Map<string, Template>, withTools: boolean, file: string): Template {
  if (templates.size === 0) throw new Error(`${file} has no chat_template, so chat messages cannot be rendered`);
  const t = (withTools ? templates.get("tool_use") : undefined) ?? templates.get("default");
  if (!t) throw new Error(`${file}: no "default" chat template among ${[...templates.keys()].join(", ")}`);
  return t;
}

function checkMessages(messages: ChatMessage[]): void {
  if (!Array.isArray(messages)) throw new Error(`chat messages must be an array, got ${typeof messages}`);
  messages.forEach((m, i) => {
    if (!m || !ROLES.has(m.role))
      throw new Error(`messages[${i}].role ${JSON.stringify(m?.role)} is not one of system, user, assistant, tool`);
    if (typeof m.content !== "string") throw new Error(`messages[${i}].content must be a string, got ${typeof m.content}`);
  });
}

async function readJson(file: string): Promise<Record<string, unknown>> {
  let text: string;
  try {
    text = await fs.readFile(file, "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    throw new Error(
      code === "ENOENT"
        ? `${file} not found (a tokenizer folder needs tokenizer.json and tokenizer_config.json)`
        : `${file} cannot be read: ${(err as Error).message}`,
    );
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (err) {
    throw new BadFileError(`${file} is not valid JSON: ${(err as Error).message}`);
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) throw new Error(`${file} must hold a JSON object`);
  return value as Record<string, unknown>;
}
