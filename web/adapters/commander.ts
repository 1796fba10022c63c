/** commander for the page: the scripts parse flags into the settings the page sets in code
 *  (web/pipeline.ts), so the page builds no command line. src/run's flag tables are plain objects
 *  and reach commander only inside functions the page does not call. */
function refuse(name: string): never {
  throw new Error(`commander ${name}: the page parses no command line (its settings are in web/pipeline.ts)`);
}
export class Command {
  constructor() {
    refuse("Command");
  }
}
export class Option {
  constructor() {
    refuse("Option");
  }
}
export class CommanderError extends Error {}
export class InvalidArgumentError extends Error {}
