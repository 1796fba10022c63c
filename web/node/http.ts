/** node:http and node:https for the page: the HTTP clients and servers of src/ (AgentGym environments,
 *  the grading and OpenAI-compatible servers) are the scripts'; the page talks to none. */
function refuse(name: string): never {
  throw new Error(`http.${name}: HTTP servers and environment clients are not available in the page`);
}
export const request = (): never => refuse("request");
export const get = (): never => refuse("get");
export const createServer = (): never => refuse("createServer");
export class Agent {
  constructor() {
    refuse("Agent");
  }
}
export default { request, get, createServer, Agent };
