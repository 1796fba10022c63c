// Loaded with node --import: the package node-llama-cpp resolves as Node resolves a package that is
// not installed (ERR_MODULE_NOT_FOUND), whether it is installed or not.
import { register } from "node:module";

const hook = `export async function resolve(specifier, context, next) {
  if (specifier === "node-llama-cpp" || specifier.startsWith("node-llama-cpp/")) {
    const err = new Error("Cannot find package '" + specifier + "' imported from " + context.parentURL);
    err.code = "ERR_MODULE_NOT_FOUND";
    throw err;
  }
  return next(specifier, context);
}`;
register("data:text/javascript," + encodeURIComponent(hook));
